"""One verdict everywhere: verify, status --json, apply --check and the plugin agree, tree by tree.

Each tree state is made from a real release's kernel (the fork-like ones by editing it here);
``verify --strict`` differs exactly where nothing pins the bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_jitcache import lay_build, real_dir
from trees import AFFECTED, FIXED, TreeFactory

from sglang_dsv4_fix import jitcache, manifest, verdict
from sglang_dsv4_fix.commands._common import options
from sglang_dsv4_fix.main import COMMANDS, build_parser, main, parse
from sglang_dsv4_fix.rewrite import rewrite
from sglang_dsv4_fix.state import inspect as inspect_kernel
from sglang_dsv4_fix.tree import find_tree
from sglang_dsv4_fix.verdict import Options

LAUNCH = "LaunchKernel(1, kMaxPrefillBatchSize, device)(plan_compress_prefill_kernel0"
EDIT = "\n// local fork edit: tuned for our cluster\n"


def kernel_of(root: Path) -> Path:
    path = find_tree(root).kernel_path
    assert path is not None
    return path


def edit(root: Path, change: Callable[[str], str]) -> None:
    """A fork's own change to the kernel; committed in a git checkout, as a fork would."""
    k = kernel_of(root)
    k.write_bytes(change(k.read_bytes().decode()).encode())
    if (root / ".git").exists():
        _commit_all(root)


def local_edit(text: str) -> str:
    anchor = "#include <sgl_kernel/utils.h>\n"
    assert anchor in text
    return text.replace(anchor, anchor + EDIT, 1)


def second_launch(text: str, block: str = "kMaxPrefillBatchSize") -> str:
    """A fork's second host entry point launching kernel0 too (as some forks do for CUDA graphs)."""
    head, sep, tail = text.partition(LAUNCH)
    assert sep, "launch site not found"
    call_end = tail.index(";") + 1
    second = LAUNCH.replace("kMaxPrefillBatchSize", block) + tail[:call_end]
    return head + sep + tail[:call_end] + "\n  if (false) " + second + tail[call_end:]


def apply(root: Path, *extra: str) -> None:
    assert main(["apply", "--tree", str(root), *extra]) == 0


@dataclass(frozen=True)
class State:
    name: str
    make: Callable[[Path], None]
    exit: int
    headline: str  # regex on the headline
    strict: int | None = None  # verify --strict's exit, if it differs


def _racy_build(root: Path) -> None:
    tree = find_tree(root)
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    lay_build(cache, *real_dir(tree, "original", cache))
    apply(root, "--no-clear-cache")


def _noted_fix_build(root: Path) -> None:
    """After apply: the fix's build in the cache with our note beside it (what prewarm leaves);
    the cache check takes the note as proof, without the loaders' source hash."""
    tree = find_tree(root)
    assert tree.kernel_path is not None
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    name, module = real_dir(tree, "no-init", cache)
    build = lay_build(cache, name, module)
    note = {"kernel_sha256": hashlib.sha256(tree.kernel_path.read_bytes()).hexdigest()}
    jitcache.write_sidecar(build, build / f"{module}.so", note)


def _fork_with_fix(root: Path) -> None:
    edit(root, lambda t: rewrite(local_edit(t), "no-init"))


def _edited_after_apply(root: Path) -> None:
    apply(root)
    edit(root, lambda t: t + "// tuned after the fix\n")


def _reinstalled(root: Path) -> None:
    original = kernel_of(root).read_bytes()
    apply(root)
    kernel_of(root).write_bytes(original)  # what `pip install --force-reinstall` does


STATES = [
    State("original", lambda r: None, 1, r"RACY: racy-init kernel0 \(sgl-project/sglang#32467\).*"),
    State("fixed", apply, 0, r"VERIFIED: no-init, the no-init fix of release .*"),
    State("barrier", lambda r: apply(r, "--variant", "barrier"), 0, r"VERIFIED: barrier, .*"),
    State("fork with the fix", _fork_with_fix, 0, r"FIXED, UNPINNED: safe no-init .*", 3),
    State("racy fork", lambda r: edit(r, local_edit), 1, r"RACY: .*"),
    State(
        "racy fork, applied",
        lambda r: (edit(r, local_edit), apply(r)),
        0,
        r"VERIFIED: no-init, the sha256 sglang-dsv4-fix recorded when it wrote this file .*",
    ),
    State("edited after apply", _edited_after_apply, 0, r"EDITED SINCE APPLY: still a safe .*", 3),
    State("reinstalled", _reinstalled, 1, r"RACY: .*; replaced since apply \(reinstalled\?\).*"),
    State("stale racy build", _racy_build, 5, r"STALE BUILD: the kernel is verified \(no-init\).*"),
    State(
        "noted fix build", lambda r: (apply(r), _noted_fix_build(r)), 0, r"VERIFIED: no-init, .*"
    ),
    State(
        "stale racy build beside a noted fix build",
        lambda r: (_racy_build(r), _noted_fix_build(r)),
        5,
        r"STALE BUILD: the kernel is verified \(no-init\).*",
    ),
    State("second launch site", lambda r: edit(r, second_launch), 1, r"RACY: .*"),
    State(
        "second launch site, fixed",
        lambda r: (edit(r, second_launch), apply(r)),
        0,
        r"VERIFIED: no-init, the sha256 sglang-dsv4-fix recorded .*",
    ),
    State(
        "unsafe launch geometry",
        lambda r: edit(r, lambda t: second_launch(rewrite(t, "no-init"), "512")),
        3,
        r"UNSAFE: no-init but preconditions violated: one block of 1024 threads "
        r"\(launch 2 of 2 is grid=1, block=512, __launch_bounds__\(1024\)\)",
    ),
]


def surfaces(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[int, str]]:
    """(exit, headline) as verify, verify --json, status --json and apply --check give them."""
    capsys.readouterr()
    out: dict[str, tuple[int, str]] = {}
    code = main(["verify", "--tree", str(root)])
    text = capsys.readouterr().out
    out["verify"] = (code, text.splitlines()[0].split(": ", 1)[1])
    code = main(["verify", "--tree", str(root), "--json"])
    payload = json.loads(capsys.readouterr().out)
    out["verify --json"] = (code, payload["headline"])
    assert payload["exit"] == code
    assert main(["status", "--tree", str(root), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    out["status --json"] = (payload["exit"], payload["headline"])
    return out


def check_headline(root: Path, capsys: pytest.CaptureFixture[str]) -> str | None:
    """apply --check's "now:" headline, or None when apply would refuse (it then says why)."""
    capsys.readouterr()
    code = main(["apply", "--tree", str(root), "--check", "--json"])
    payload = json.loads(capsys.readouterr().out)
    return str(payload["headline"]) if code == 0 else None


@pytest.mark.parametrize("layout", ["installed", "git"])
@pytest.mark.parametrize("state", STATES, ids=[s.name for s in STATES])
def test_every_surface_renders_one_verdict(
    state: State,
    layout: str,
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make = tree_factory.installed if layout == "installed" else tree_factory.git
    root = make("0.5.16", tmp_path / "tree")
    state.make(root)
    seen = surfaces(root, capsys)
    assert len(set(seen.values())) == 1, seen
    code, headline = seen["verify"]
    assert code == state.exit and re.fullmatch(state.headline, headline), seen
    now = check_headline(root, capsys)
    assert now is None or now == headline
    strict = main(["verify", "--tree", str(root), "--strict"])
    assert strict == (state.strict if state.strict is not None else state.exit)


def _commit_all(root: Path) -> None:
    import subprocess

    from trees import GIT_IDENTITY

    env = {**os.environ, **GIT_IDENTITY}
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, env=env)
    subprocess.run(
        ["git", "-C", str(root), "commit", "-q", "--allow-empty", "-m", "fork"], check=True, env=env
    )


@pytest.mark.parametrize("version", AFFECTED + FIXED)
def test_every_release_original_and_fixed(
    version: str, tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed(version, tmp_path / "sp")
    seen = surfaces(root, capsys)
    assert len(set(seen.values())) == 1, seen
    code, headline = seen["verify"]
    if version in FIXED:
        assert (code, headline.split(",")[0]) == (0, "VERIFIED: no-init"), headline
        assert "own kernel (fixed upstream)" in headline
        return
    assert code == 1 and headline.startswith("RACY: "), headline
    apply(root)
    seen = surfaces(root, capsys)
    assert len(set(seen.values())) == 1, seen
    assert seen["verify"][0] == 0
    assert seen["verify"][1].startswith("VERIFIED: no-init, the no-init fix of release "), seen
    assert main(["verify", "--tree", str(root), "--strict"]) == 0


def test_fix_commands_repeat_the_users_tree_and_cache(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "my trees" / "sp")
    cache = tmp_path / "my cache"
    capsys.readouterr()
    assert main(["verify", "--tree", str(root), "--cache-dir", str(cache), "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["fix"] == f"sglang-dsv4-fix apply --tree '{root}' --cache-dir '{cache}'"


def test_status_says_a_reinstalled_kernel_is_no_longer_ours(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    _reinstalled(root)
    capsys.readouterr()
    assert main(["status", "--tree", str(root)]) == 0
    lines = {ln.split(":", 1)[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert lines["provenance"].endswith(
        "not in force: the kernel is no longer the e5fc32a523b4bbc2… it wrote)"
    )
    assert lines["verdict"].startswith("verdict:       RACY: racy-init kernel0")
    assert "replaced since apply (reinstalled?)" in lines["verdict"]
    assert main(["apply", "--tree", str(root)]) == 0  # apply re-applies
    assert main(["verify", "--tree", str(root), "--strict"]) == 0


# --------------------------------------------------------------------------- every field, exactly
#
# The table above checks that the surfaces agree and how the headline starts. Here each state's
# whole verdict (verify --json: state, exit, headline, variant, sha256, pinned_by, problems,
# notes, fix, stale_builds) is compared in full, including the states and notes the table lacks:
# unknown, not applicable, wrong variant, a stale build under a verdict --strict already fails,
# --ignore-cache, a pending or damaged record, a tree with no cache model. Templates: {root} is
# the tree, {sha} the sha256 hashed here from the kernel file, {fixed} 0.5.16's no-init fix from
# the manifest.

VERDICT_KEYS = ("state", "exit", "headline", "variant", "sha256", "pinned_by", "problems",
                "notes", "fix", "stale_builds")  # fmt: skip
RECORD = "{root}/sglang/jit_kernel/csrc/deepseek_v4/.c_plan.cuh.sglang-dsv4-fix.json"
NOT_OURS = "not release 0.5.16's kernel nor its fix (a fork or a local edit)"
APPLY_FIX = "sglang-dsv4-fix apply --tree {root}"
CLEAR_FIX = "sglang-dsv4-fix clear-cache --tree {root}"
RACY_PROBLEM = {"kind": "racy", "message": "the racy init of warp_max/warp_min", "fix": APPLY_FIX}
BUILD = "sgl_kernel_jit_dpsk_v4_compress_plan_d2fa2dab1d672b7c__arch_9.0a__tvmffi_0.1.11"
STALE = f"1 racy (or untellable) planner build(s) remain in the JIT cache: {BUILD}"
STALE_PROBLEM = {"kind": "stale-build", "message": STALE, "fix": CLEAR_FIX}
CLEAR_FIX_ELSEWHERE = f"{CLEAR_FIX} --cache-dir {{root}}-cache"
BUILD10 = BUILD.replace("arch_9.0a", "arch_10.0a")
STALE2 = f"2 racy (or untellable) planner build(s) remain in the JIT cache: {BUILD10}, {BUILD}"
EDITED = "changed since sglang-dsv4-fix wrote it (expected sha256 {fixed16}…, found {sha16}…)"
UNPINNED = "sha256 {sha16}… is neither a release's fix nor what sglang-dsv4-fix wrote"
NO_PLAN_0511 = "NOT APPLICABLE: no DeepSeek-V4 planner in this tree (release 0.5.11); not affected"


def _set_record(root: Path, **fields: str) -> None:
    path = Path(RECORD.replace("{root}", str(root)))
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _planner_entry_without_loader(root: Path) -> None:
    """A fixed tree whose JIT loader is gone, with a planner-named entry in the cache: the cache
    cannot be modelled, so it is not checked (and the verdict says so)."""
    apply(root)
    (find_tree(root).package_dir / "jit_kernel" / "utils" / "compile.py").unlink()
    (Path(os.environ["TVM_FFI_CACHE_DIR"]) / BUILD).mkdir(parents=True)


def _fork_without_loader(root: Path) -> None:
    """A fork that carries the fix, its JIT loader gone, a planner-named entry in the cache."""
    _fork_with_fix(root)
    (find_tree(root).package_dir / "jit_kernel" / "utils" / "compile.py").unlink()
    (Path(os.environ["TVM_FFI_CACHE_DIR"]) / BUILD).mkdir(parents=True)


def _edited_with_racy_build(root: Path) -> None:
    _racy_build(root)
    edit(root, lambda t: t + "// tuned after the fix\n")


def half_block(text: str) -> str:
    """kernel0 sized for 16 warps: two preconditions fail (the warp count, warp 0's lanes)."""
    warps = "constexpr auto kNumWarps = kMaxPrefillBatchSize / kWarpThreads;"
    assert warps in text
    half = "constexpr uint32_t kHalfBlock = 512;\n  constexpr auto kNumWarps = kHalfBlock / kWarpThreads;"
    return text.replace(warps, half)


TWO_FAILED = (
    "32 warps (kNumWarps == block / 32) (kNumWarps = 16, warp id = warp_id, lane id = lane_id); "
    "warp 0 reads exactly kNumWarps lanes (read warp_max[lane_id] under 'if (warp_id == 0)'; "
    "kNumWarps != 32 lanes)"
)


def _racy_build_in_another_cache(root: Path) -> None:
    """The racy build in the cache ``--cache-dir`` names, not in TVM_FFI_CACHE_DIR's."""
    cache = Path(f"{root}-cache")
    lay_build(cache, *real_dir(find_tree(root), "original", cache))
    apply(root, "--no-clear-cache")


def _two_racy_builds(root: Path) -> None:
    """The racy original built for two GPU archs (a fleet of H100s and B200s sharing a cache)."""
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    name, module = real_dir(find_tree(root), "original", cache)
    lay_build(cache, name.replace("arch_9.0a", "arch_10.0a"), module)
    _racy_build(root)


def _without_release(root: Path) -> None:
    """A tree nothing names the release of: no dist-info, no _version.py."""
    (root / "sglang" / "_version.py").unlink()
    for info in root.glob("sglang-*.dist-info"):
        shutil.rmtree(info)


@dataclass(frozen=True)
class Full:
    name: str
    make: Callable[[Path], None]
    fields: dict[str, object]  # the verdict; pinned_by, problems, notes, fix: none by default
    flags: tuple[str, ...] = ()
    version: str = "0.5.16"


def _verified(pin: str, variant: str = "no-init") -> dict[str, object]:
    return {"state": "verified", "exit": 0, "variant": variant, "pinned_by": pin,
            "headline": f"VERIFIED: {variant}, {pin} (sha256 {{sha16}}…)"}  # fmt: skip


def _racy(tail: str = "", notes: tuple[str, ...] = ()) -> dict[str, object]:
    return {"state": "racy", "exit": 1, "variant": "racy-init", "problems": [RACY_PROBLEM],
            "fix": APPLY_FIX, "notes": list(notes),
            "headline": f"RACY: racy-init kernel0 (sgl-project/sglang#32467){tail} (run: {APPLY_FIX})"}  # fmt: skip


FIX_PIN = "the no-init fix of release 0.5.16"
OURS_PIN = "the sha256 sglang-dsv4-fix recorded when it wrote this file"
FULL = [
    Full("racy", lambda r: None, _racy()),
    Full("racy, strict", lambda r: None, _racy(), ("--strict",)),
    Full("racy fork", lambda r: edit(r, local_edit), _racy(notes=(NOT_OURS,))),
    Full("reinstalled", _reinstalled,
         _racy("; replaced since apply (reinstalled?): the record expected sha256 {fixed16}…")),
    Full("fixed", apply, _verified(FIX_PIN)),
    Full("fixed, strict", apply, _verified(FIX_PIN), ("--strict",)),
    Full("barrier", lambda r: apply(r, "--variant", "barrier"),
         _verified("the barrier fix of release 0.5.16", "barrier")),
    Full("upstream fixed", lambda r: None,
         _verified("release 0.5.18's own kernel (fixed upstream)"), version="0.5.18"),
    Full("racy fork, applied", lambda r: (edit(r, local_edit), apply(r)), _verified(OURS_PIN)),
    Full("fork with the fix", _fork_with_fix,
         {"state": "fixed-unpinned", "exit": 0, "variant": "no-init", "notes": [NOT_OURS],
          "headline": f"FIXED, UNPINNED: safe no-init kernel0; {UNPINNED}"}),
    Full("fork with the fix, strict", _fork_with_fix,
         {"state": "fixed-unpinned", "exit": 3, "variant": "no-init", "notes": [NOT_OURS],
          "problems": [{"kind": "unpinned", "message": UNPINNED, "fix": None}],
          "headline": f"FIXED, UNPINNED: safe no-init kernel0; {UNPINNED}"}, ("--strict",)),
    Full("edited after apply", _edited_after_apply,
         {"state": "edited-since", "exit": 0, "variant": "no-init", "notes": [NOT_OURS],
          "headline": f"EDITED SINCE APPLY: still a safe no-init, but {EDITED}"}),
    Full("edited after apply, strict", _edited_after_apply,
         {"state": "edited-since", "exit": 3, "variant": "no-init", "notes": [NOT_OURS],
          "problems": [{"kind": "edited-since", "message": EDITED, "fix": None}],
          "headline": f"EDITED SINCE APPLY: still a safe no-init, but {EDITED}"}, ("--strict",)),
    Full("stale racy build", _racy_build,
         {"state": "stale-build", "exit": 5, "variant": "no-init", "pinned_by": FIX_PIN,
          "problems": [STALE_PROBLEM], "fix": CLEAR_FIX, "stale_builds": [BUILD],
          "headline": f"STALE BUILD: the kernel is verified (no-init) but {STALE} (run: {CLEAR_FIX})"}),
    Full("two stale racy builds", _two_racy_builds,
         {"state": "stale-build", "exit": 5, "variant": "no-init", "pinned_by": FIX_PIN,
          "problems": [{**STALE_PROBLEM, "message": STALE2}], "fix": CLEAR_FIX,
          "stale_builds": [BUILD10, BUILD],
          "headline": f"STALE BUILD: the kernel is verified (no-init) but {STALE2} (run: {CLEAR_FIX})"}),
    Full("stale racy build, --cache-dir", _racy_build_in_another_cache,
         {"state": "stale-build", "exit": 5, "variant": "no-init", "pinned_by": FIX_PIN,
          "problems": [{**STALE_PROBLEM, "fix": CLEAR_FIX_ELSEWHERE}], "fix": CLEAR_FIX_ELSEWHERE,
          "stale_builds": [BUILD],
          "headline": f"STALE BUILD: the kernel is verified (no-init) but {STALE} "
                      f"(run: {CLEAR_FIX_ELSEWHERE})"}, ("--cache-dir", "{root}-cache")),
    Full("stale racy build, --ignore-cache", _racy_build, _verified(FIX_PIN), ("--ignore-cache",)),
    Full("stale racy build, edited since", _edited_with_racy_build,
         {"state": "stale-build", "exit": 5, "variant": "no-init", "notes": [NOT_OURS],
          "problems": [STALE_PROBLEM], "fix": CLEAR_FIX, "stale_builds": [BUILD],
          "headline": f"STALE BUILD: the kernel is edited-since (no-init) but {STALE} (run: {CLEAR_FIX})"}),
    Full("stale racy build, edited since, strict", _edited_with_racy_build,
         {"state": "edited-since", "exit": 3, "variant": "no-init", "notes": [NOT_OURS],
          "problems": [{"kind": "edited-since", "message": EDITED, "fix": None}, STALE_PROBLEM],
          "fix": CLEAR_FIX, "stale_builds": [BUILD],
          "headline": f"EDITED SINCE APPLY: still a safe no-init, but {EDITED}; and {STALE}"},
         ("--strict",)),
    Full("unknown", lambda r: edit(r, lambda t: t.replace("plan_compress_prefill_kernel0", "k0")),
         {"state": "unknown", "exit": 3, "variant": "unknown", "notes": [NOT_OURS],
          "problems": [{"kind": "unknown", "fix": None,
                        "message": "no definition of plan_compress_prefill_kernel0"}],
          "headline": "UNKNOWN: kernel0 not recognised (no definition of plan_compress_prefill_kernel0)"}),
    Full("unsafe", lambda r: edit(r, lambda t: second_launch(rewrite(t, "no-init"), "512")),
         {"state": "unsafe", "exit": 3, "variant": "no-init", "notes": [NOT_OURS],
          "problems": [{"kind": "unsafe", "fix": None, "message": "one block of 1024 threads "
                        "(launch 2 of 2 is grid=1, block=512, __launch_bounds__(1024))"}],
          "headline": "UNSAFE: no-init but preconditions violated: one block of 1024 threads "
                      "(launch 2 of 2 is grid=1, block=512, __launch_bounds__(1024))"}),
    Full("unsafe, two preconditions", lambda r: edit(r, lambda t: half_block(rewrite(t, "no-init"))),
         {"state": "unsafe", "exit": 3, "variant": "no-init", "notes": [NOT_OURS],
          "problems": [{"kind": "unsafe", "fix": None, "message": TWO_FAILED}],
          "headline": f"UNSAFE: no-init but preconditions violated: {TWO_FAILED}"}),
    Full("wrong variant", apply,
         {"state": "wrong-variant", "exit": 11, "variant": "no-init", "pinned_by": FIX_PIN,
          "headline": "WRONG VARIANT: no-init, required barrier"}, ("--require-variant", "barrier")),
    Full("required variant", apply, _verified(FIX_PIN), ("--require-variant", "no-init")),
    Full("pending record", lambda r: (apply(r), _set_record(r, state="pending")),
         {**_verified(FIX_PIN),
          "notes": ["an interrupted apply/revert left a pending record; the next one finishes it"]}),
    Full("damaged record", lambda r: (apply(r), _set_record(r, state="done")),
         {**_verified(FIX_PIN),
          "notes": [f"provenance record damaged, not trusted: {RECORD}: damaged provenance record "
                    "(state 'done' is not one of pending, applied); not acting on it"]}),
    Full("no cache model", _planner_entry_without_loader,
         {**_verified(FIX_PIN), "notes": ["JIT cache not checked (no cache model for this tree)"]}),
    Full("fork with the fix, no cache model", _fork_without_loader,
         {"state": "fixed-unpinned", "exit": 0, "variant": "no-init",
          "notes": [NOT_OURS, "JIT cache not checked (no cache model for this tree)"],
          "headline": f"FIXED, UNPINNED: safe no-init kernel0; {UNPINNED}"}),
    Full("not applicable", lambda r: None,
         {"state": "not-applicable", "exit": 4, "variant": "not-applicable",
          "headline": NO_PLAN_0511}, version="0.5.11"),
    Full("not applicable, release unknown", _without_release,
         {"state": "not-applicable", "exit": 4, "variant": "not-applicable",
          "headline": NO_PLAN_0511.replace("release 0.5.11", "release unknown")},
         version="0.5.11"),
    Full("not applicable, allowed", lambda r: None,
         {"state": "not-applicable", "exit": 0, "variant": "not-applicable",
          "headline": NO_PLAN_0511}, ("--allow-not-applicable",), version="0.5.11"),
]  # fmt: skip


def _filled(value: object, subs: dict[str, str]) -> object:
    if isinstance(value, str):
        for key, text in subs.items():
            value = value.replace(key, text)
        return value
    if isinstance(value, list):
        return [_filled(v, subs) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, subs) for k, v in value.items()}
    return value


@pytest.mark.parametrize("case", FULL, ids=[c.name for c in FULL])
def test_every_field_of_the_verdict(
    case: Full, tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed(case.version, tmp_path / "sp")
    case.make(root)
    kernel = find_tree(root).kernel_path
    sha = None if kernel is None else hashlib.sha256(kernel.read_bytes()).hexdigest()
    fixed = manifest.load().releases["0.5.16"].results["no-init"].sha256
    subs = {"{root}": str(root), "{sha16}": (sha or "")[:16], "{fixed16}": fixed[:16]}
    defaults = {"pinned_by": None, "problems": [], "notes": [], "fix": None, "stale_builds": []}
    want = _filled({**defaults, "sha256": sha, **case.fields}, subs)
    capsys.readouterr()
    flags = [str(_filled(flag, subs)) for flag in case.flags]
    code = main(["verify", "--tree", str(root), "--json", *flags])
    payload = json.loads(capsys.readouterr().out)
    assert {k: payload[k] for k in VERDICT_KEYS} == want
    assert code == payload["exit"]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_fixing_command_repeats_the_cache_dir_where_the_subcommand_takes_it(name: str) -> None:
    """The oracle is the real parser: --cache-dir is repeated exactly for the subcommands whose
    own parser accepts it."""
    parser = build_parser(name)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    takes = any("--cache-dir" in a.option_strings for a in sub.choices[name]._actions)
    words = shlex.split(Options(tree="/srv/my tree", cache_dir="/c d").command(name))
    assert words[:4] == ["sglang-dsv4-fix", name, "--tree", "/srv/my tree"]
    assert words[4:] == (["--cache-dir", "/c d"] if takes else [])


@pytest.mark.parametrize("name", ["verify", "status", "apply"])
def test_the_options_defaults_are_the_commands_defaults(name: str) -> None:
    """What the plugin and heal build with Options(tree=...) is what the CLI judges without flags."""
    assert options(parse([name, "--tree", "/t"])) == Options()  # each tree is set per tree


KERNEL_PROBLEMS = [c for c in FULL if c.name in ("racy", "racy fork", "unknown", "unsafe")]


@pytest.mark.parametrize("case", KERNEL_PROBLEMS, ids=[c.name for c in KERNEL_PROBLEMS])
def test_a_kernel_problem_outranks_a_stale_build(
    case: Full, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """judge() is pure: given stale builds with a racy, unknown or unsafe kernel (assess() does
    not look at the cache then), the kernel's verdict stands, and the builds are not named."""
    root = tree_factory.installed(case.version, tmp_path / "sp")
    case.make(root)
    tree = find_tree(root)
    current = inspect_kernel(tree)
    alone = verdict.judge(tree, current, None, Options())
    assert verdict.judge(tree, current, [BUILD], Options()) == alone
    assert alone.state == case.fields["state"] and alone.stale_builds == ()
