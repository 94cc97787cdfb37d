"""The plugin's judging, in this process (where mutation testing can reach it): the status a
process takes from its tree is the verdict ``verify`` gives, field by field; its start line and
report record say that status; a loaded planner build is judged by what it was built from.

The tests under SGLang's real ``load_plugins()`` (test_plugin.py, test_verdict_plugin.py,
test_plugin_jit.py with nvcc builds) show the same from outside; these pin every field.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_jitcache import lay_build, real_dir
from test_verdict import FULL, Full, _without_release
from trees import TreeFactory

from sglang_dsv4_fix import __version__, events, jitcache, jitload, jitnames, kernel, plugin, state
from sglang_dsv4_fix.errors import FatalError
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import Tree, find_tree

OURS = f"sglang-dsv4-fix/{__version__}"
# What the start line says of each state beyond the verdict: the preconditions ("ok" for a
# release's own bytes, which are not parsed again; the failed ones by name; "-" when kernel0 is
# not found) and who patched the file.
SAID = {
    "racy": ("ok", "none"),
    "racy fork": ("ok", "none"),
    "reinstalled": ("ok", f"{OURS}(edited-since)"),
    "fixed": ("ok", OURS),
    "barrier": ("ok", OURS),
    "upstream fixed": ("ok", "none"),
    "racy fork, applied": ("ok", OURS),
    "fork with the fix": ("ok", "none"),
    "edited after apply": ("ok", f"{OURS}(edited-since)"),
    "stale racy build": ("ok", OURS),
    "stale racy build, edited since": ("ok", f"{OURS}(edited-since)"),
    "unknown": ("-", "none"),
    "unsafe": ("one block of 1024 threads", "none"),
    "unsafe, two preconditions": (
        "32 warps (kNumWarps == block / 32),warp 0 reads exactly kNumWarps lanes",
        "none",
    ),
    "pending record": ("ok", OURS),
    "damaged record": ("ok", "damaged-record"),
    "no cache model": ("ok", OURS),
    "fork with the fix, no cache model": ("ok", "none"),
    "two stale racy builds": ("ok", OURS),
    "not applicable": ("-", "none"),
    "not applicable, release unknown": ("-", "none"),
}
AT_START = [c for c in FULL if not c.flags]  # the plugin judges with verify's default options


def test_every_default_state_is_covered() -> None:
    assert sorted(c.name for c in AT_START) == sorted(SAID)


@pytest.mark.parametrize("case", AT_START, ids=[c.name for c in AT_START])
def test_the_status_is_the_verdict(
    case: Full, tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed(case.version, tmp_path / "sp")
    case.make(root)
    capsys.readouterr()
    # a server with no planner is not affected and serves: the plugin judges as this flag does
    code = main(["verify", "--tree", str(root), "--json", "--allow-not-applicable"])
    said = json.loads(capsys.readouterr().out)
    tree = find_tree(root)

    status = plugin.inspect_tree(tree.package_dir)

    ok = code == 0
    preconditions, patched_by = SAID[case.name]
    assert status == plugin.Status(
        str(tree.package_dir),
        tree.release,
        tree.layout,
        kernel=None if tree.kernel_path is None else str(tree.kernel_path),
        variant=said["variant"],
        sha256=said["sha256"],
        preconditions=preconditions,
        patched_by=patched_by,
        problem=None if ok else said["headline"],
        fix=None if ok else said["fix"],
        exit_code=code,
        loader_module=tree.loader_module if tree.kernel_path else None,
        tree_arg=str(root),
        state=said["state"],
        headline=said["headline"],
    )
    if status.kernel is not None:  # (without a planner the line says so in words)
        fields = start_fields(plugin.start_line(plugin._Process("warn", status, 0.0)))
        assert (fields["variant"], fields["preconditions"]) == (said["variant"], preconditions)


def start_fields(line: str) -> dict[str, str]:
    """The start line's fields as a logfmt reader splits them (quoted values whole)."""
    head = line.partition(" -- ")[0]
    tag, what, *pairs = shlex.split(head)
    assert (tag, what) == ("sglang-dsv4-fix:", "c_plan.cuh"), line
    fields = {key: value for key, _, value in (pair.partition("=") for pair in pairs)}
    assert all("=" in pair for pair in pairs) and len(fields) == len(pairs), line
    return fields


@pytest.mark.parametrize(
    "value",
    [
        "0.5.16",
        "two words",
        'a "quoted"=value',
        "k=v",
        'say"so',
        "back\\slash",
        "new\nline",
        "tab\there",
        "",
    ],
)
def test_a_start_line_value_reads_back_whole(value: str) -> None:
    said = plugin._kv("release", value)
    assert "\n" not in said and "\t" not in said  # one line, whatever the value holds
    key, _, text = said.partition("=")
    assert key == "release"
    assert (json.loads(text) if text.startswith('"') else text) == value
    assert text.startswith('"') == (value != "0.5.16")  # a plain token is left as it is


def _process(tmp_path: Path, tree_factory: TreeFactory, make: str = "racy") -> plugin._Process:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    next(c for c in FULL if c.name == make).make(root)
    return plugin._Process("warn", plugin.inspect_tree(root / "sglang"), 1_700_000_000.0)


def test_the_start_line_and_record_say_the_status(
    tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _process(tmp_path, tree_factory)
    s = p.status
    pid, sha12 = os.getpid(), (s.sha256 or "")[:12]
    assert plugin.start_line(p) == (
        f"sglang-dsv4-fix: c_plan.cuh variant=racy-init sha256={sha12} release=0.5.16 "
        f"layout=pre-refactor patched-by=none process=main pid={pid} preconditions=ok mode=warn"
        f" -- {s.headline}; serving continues"
    )
    p.rank, p.gpu = "tp3", "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    assert f" process=scheduler rank=tp3 gpu=3 pid={pid} " in plugin.start_line(p)
    record = events.start_record(p)
    assert record == {
        "schema": 1, "event": "start", "time": "2023-11-14T22:13:20Z",
        "host": os.uname().nodename, "pid": pid, "process": "scheduler", "rank": "tp3",
        "gpu": "3", "mode": "warn", "action": "warned", "healed": False,
        "tree": s.package_dir, "release": "0.5.16", "layout": "pre-refactor", "kernel": s.kernel,
        "variant": "racy-init", "sha256": s.sha256, "preconditions": "ok", "patched_by": "none",
        "state": "racy", "headline": s.headline, "exit": 1, "problem": s.headline, "fix": s.fix,
        "cuda_visible_devices": "3,4",
    }  # fmt: skip
    assert plugin.refuse_line(s) == (
        f"sglang-dsv4-fix: refusing to start: {s.headline} ({s.kernel}) "
        "(or set SGLANG_DSV4_FIX_MODE=warn to serve anyway)"
    )


def test_the_tree_is_inspected_once(
    tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every SGLang process pays for this at start: one read and hash of the kernel."""
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    calls = []
    real = state.inspect

    def counted(tree: Tree) -> state.KernelState:
        calls.append(tree.kernel_path)
        return real(tree)

    monkeypatch.setattr(state, "inspect", counted)
    assert plugin.inspect_tree(root / "sglang").state == "racy"
    assert calls == [find_tree(root).kernel_path]


@pytest.mark.parametrize("version", ["0.5.16", "0.5.11"])
def test_an_unnamed_release_is_said_as_a_question_mark(
    version: str, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed(version, tmp_path / "sp")
    _without_release(root)
    status = plugin.inspect_tree(root / "sglang")
    assert status.release is None
    assert " release=? " in plugin.start_line(plugin._Process("warn", status, 0.0))


@pytest.mark.parametrize("make", ["racy", "fixed", "barrier", "upstream fixed"])
def test_a_releases_own_bytes_are_not_parsed(
    make: str, tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process judges at start: a release's original or fix is known by its sha256 (its
    preconditions were checked when the manifest was made), the kernel is not classified again."""
    case = next(c for c in FULL if c.name == make)
    root = tree_factory.installed(case.version, tmp_path / "sp")
    case.make(root)

    def parse(text: str) -> None:
        raise AssertionError("a release's own bytes were parsed")

    monkeypatch.setattr(kernel, "classify", parse)
    status = plugin.inspect_tree(root / "sglang")
    assert (status.state, status.preconditions) == (case.fields["state"], "ok")


def test_a_healthy_or_healed_start_is_said_so(tree_factory: TreeFactory, tmp_path: Path) -> None:
    p = _process(tmp_path, tree_factory, "fixed")
    assert p.status.problem is None
    assert plugin.start_line(p).endswith(" preconditions=ok mode=warn")
    assert events.start_record(p)["action"] == "ok"
    p.status = p.status._replace(healed="healed: applied the no-init fix")
    assert events.start_record(p)["action"] == "healed"
    assert events.start_record(p)["healed"] is True


def test_no_planner_is_said_so(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.11", tmp_path / "sp")
    p = plugin._Process("enforce", plugin.inspect_tree(root / "sglang"), 0.0)
    line = plugin.start_line(p)
    assert line == (
        "sglang-dsv4-fix: c_plan.cuh variant=not-applicable release=0.5.11 process=main "
        f"pid={os.getpid()} mode=enforce -- NOT APPLICABLE: no DeepSeek-V4 planner in this tree "
        "(release 0.5.11); not affected"
    )
    assert start_fields(line) == {
        "variant": "not-applicable",
        "release": "0.5.11",
        "process": "main",
        "pid": str(os.getpid()),
        "mode": "enforce",
    }


# --------------------------------------------------------------------------- a loaded build


@pytest.mark.parametrize(
    ("built", "kernel", "state", "exit", "problem"),
    [
        ("no-init", "racy-init", "racy", 1, None),  # the tree's own verdict stands
        ("barrier", "no-init", "verified", 0, None),
        ("racy-init", "racy-init", "racy", 1, "built from the racy kernel"),
        ("racy-init", "no-init", "stale-build", 5, "built from the racy kernel"),
        (None, "no-init", "unknown", 3, "cannot tell what the loaded planner .so was built from"),
        ("unknown", "no-init", "unknown", 3, "cannot tell"),
    ],
)
def test_a_loaded_build_is_judged_by_its_origin(
    built: str | None, kernel: str, state: str, exit: int, problem: str | None
) -> None:
    tree_state, tree_exit = ("racy", 1) if kernel == "racy-init" else ("verified", 0)
    status = plugin.Status("/t", variant=kernel, state=tree_state, exit_code=tree_exit)
    got = jitload.build_verdict(status, {"built_variant": built, "evidence": "why"})
    assert (got["state"], got["exit"]) == (state, exit)
    if problem is None:
        assert got["problem"] is None
    else:
        assert problem in got["problem"]
        assert ("(why)" in got["problem"]) == (exit == 3)
        assert ("sgl-project/sglang#32467" in got["problem"]) == (exit != 3)


@pytest.mark.parametrize(
    ("origin", "variant"),
    [("original", "racy-init"), ("current", "barrier"), ("no-init", "no-init"),
     ("barrier", "barrier"), ("unknown", None), ("racy-init", None)],
)  # fmt: skip
def test_a_cache_origin_names_a_variant(origin: str, variant: str | None) -> None:
    status = plugin.Status("/t", variant="barrier")
    assert jitload.origin_variant(origin, status) == variant


def _built(p: plugin._Process, so: Path | None, t0: float) -> dict[str, object]:
    return jitload.built_from(p.status, so, t0)


def _so(build: Path, mtime: int = 1_700_000_000) -> Path:
    """The build's .so with a whole-second mtime (so t0 - 1.0 is exact)."""
    (so,) = build.glob("*.so")
    os.utime(so, (mtime, mtime))
    return so


def test_a_build_is_named_by_the_cache_model_of_its_own_folder(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """Each candidate source of an edited-after-apply tree, built into a cache that is not
    TVM_FFI_CACHE_DIR's (the .so's own folder is what counts): named by origin, with the sha256
    of the bytes it was built from and why."""
    p = _process(tmp_path, tree_factory, "edited after apply")
    tree = find_tree(Path(p.status.package_dir))
    cache = tmp_path / "another-cache"
    variants = {"current": "no-init", "original": "racy-init", "no-init": "no-init",
                "barrier": "barrier"}  # fmt: skip
    sources = jitcache.tree_sources(tree)
    assert sorted(sources) == sorted(variants)
    for origin, variant in variants.items():
        so = _so(lay_build(cache, *real_dir(tree, origin, cache)))
        assert _built(p, so, 1_700_000_060.0) == {
            "compiled_now": False, "built_from": p.status.kernel, "built_variant": variant,
            "built_sha256": hashlib.sha256(sources[origin]).hexdigest(),
            "evidence": f"name hash matches this tree's {origin} kernel",
        }, origin  # fmt: skip


def test_a_build_is_named_by_its_note_or_this_call(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    p = _process(tmp_path, tree_factory, "fixed")
    tree = find_tree(Path(p.status.package_dir))
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    assert _built(p, None, 0.0) == {
        "compiled_now": None, "built_from": "unknown", "built_variant": None,
        "built_sha256": None, "evidence": ".so not found in /proc/self/maps",
    }  # fmt: skip
    so = _so(lay_build(cache, *real_dir(tree, "no-init", cache)))
    # not made by this call: modified more than a second before it started
    assert _built(p, so, 1_700_000_001.5)["compiled_now"] is False
    # made by this call (mtime no earlier than a second before its start): named from the
    # kernel on disk, and the note left beside it speaks for it from then on
    now = _built(p, so, 1_700_000_001.0)
    assert now == {
        "compiled_now": True, "built_from": p.status.kernel, "built_variant": "no-init",
        "built_sha256": p.status.sha256,
        "evidence": "compiled by this call from the kernel on disk; sidecar written",
    }  # fmt: skip
    assert _built(p, so, 1_700_000_060.0) == {
        **now,
        "compiled_now": False,
        "evidence": "sidecar beside the build",
    }

    stranger = cache / "some_other_module"
    stranger.mkdir()
    (stranger / "x.so").write_bytes(b"\x7fELF")
    assert _built(p, stranger / "x.so", 1_800_000_000.0) == {
        "compiled_now": False, "built_from": None, "built_variant": None,
        "built_sha256": None, "evidence": "not a build this tool can name",
    }  # fmt: skip


def test_a_build_compiled_before_the_kernel_changed_gets_no_note(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """The racy kernel compiled, then ``apply`` rewrote it before the load was reported: the
    kernel on disk is the fixed one, but the folder's name is the racy bytes' hash. No note may
    vouch for the fixed bytes there (the cache check believes our notes): the build is named by
    its folder, racy, and judged stale."""
    p = _process(tmp_path, tree_factory, "fixed")
    tree = find_tree(Path(p.status.package_dir))
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    build = lay_build(cache, *real_dir(tree, "original", cache))
    so = _so(build)
    got = _built(p, so, 1_700_000_001.0)
    assert (got["compiled_now"], got["built_variant"]) == (True, "racy-init")
    assert got["evidence"] == "name hash matches this tree's original kernel"
    assert not (build / jitcache.SIDECAR).exists()
    assert jitload.build_verdict(p.status, got)["state"] == "stale-build"
    fixed = Path(p.status.kernel or "").read_bytes()
    stale = jitnames.not_current(tree, fixed, jitnames.planner_entries(cache))
    assert [e.name for e in stale] == [build.name]


# --------------------------------------------------------------------------- hostile files


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail (not hang) if a read blocks: a FIFO opened for reading waits for a writer forever."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the plugin blocked on a file")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_fifo_as_record_is_a_damaged_record(
    alarm: None, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["apply", "--tree", str(root)]) == 0
    kernel = find_tree(root).kernel_path
    assert kernel is not None
    record = kernel.with_name(".c_plan.cuh.sglang-dsv4-fix.json")
    record.unlink()
    os.mkfifo(record)
    status = plugin.inspect_tree(root / "sglang")
    assert status.patched_by == "damaged-record"
    assert (status.state, status.exit_code, status.problem) == ("verified", 0, None)


def test_a_fifo_as_kernel_is_an_error_not_a_hang(
    alarm: None, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = find_tree(root).kernel_path
    assert kernel is not None
    kernel.unlink()
    os.mkfifo(kernel)
    with pytest.raises(FatalError, match="not a regular file: a FIFO"):
        plugin.inspect_tree(root / "sglang")
