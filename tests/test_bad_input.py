"""Bad input, one row each: a clear one-line message, a documented exit code, nothing on disk changed.

Every case builds its own tree from a real wheel, hashes every file (and link target) under the
test's tmp folder — the tree, the fake HOME with its JIT caches, anything outside the tree a
case points at — runs the real CLI in-process, and hashes again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest, patching
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.main import main

KERNEL_PRE = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
KERNEL_POST = "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh"
ERR = "sglang-dsv4-fix: error: "


@dataclass
class Ctx:
    tmp: Path
    factory: TreeFactory

    def installed(self, version: str = "0.5.16") -> Path:
        return self.factory.installed(version, self.tmp / "sp")

    def git(self, version: str = "0.5.16") -> Path:
        return self.factory.git(version, self.tmp / "co")

    def kernel(self, root: Path, rel: str = KERNEL_PRE) -> Path:
        return root / rel

    @property
    def home(self) -> Path:
        return Path(os.environ["HOME"])


Setup = Callable[[Ctx], list[str]]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: file bytes, link targets, folder modes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p)] = f"link {os.readlink(p)}"
            elif p.is_dir():
                out[str(p)] = f"dir {st.st_mode:o}"
            else:
                out[str(p)] = f"{st.st_mode:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    return out


# --- set-ups: each returns the CLI arguments -------------------------------------------------


def missing_path(c: Ctx) -> list[str]:
    return ["apply", "--tree", str(c.tmp / "nowhere")]


def empty_folder(c: Ctx) -> list[str]:
    (c.tmp / "empty").mkdir()
    return ["apply", "--tree", str(c.tmp / "empty")]


def file_not_folder(c: Ctx) -> list[str]:
    root = c.installed()
    return ["verify", "--tree", str(c.kernel(root))]


def not_sglang(c: Ctx) -> list[str]:
    pkg = c.tmp / "sp" / "numpy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    return ["apply", "--tree", str(c.tmp / "sp")]


def two_packages(c: Ctx) -> list[str]:
    root = c.installed()
    shutil.copytree(root / "sglang", root / "python" / "sglang")
    return ["apply", "--tree", str(root)]


def release_0511_apply(c: Ctx) -> list[str]:
    return ["apply", "--tree", str(c.installed("0.5.11"))]


def release_0511_verify(c: Ctx) -> list[str]:
    return ["verify", "--tree", str(c.installed("0.5.11"))]


def release_0511_revert(c: Ctx) -> list[str]:
    return ["revert", "--tree", str(c.installed("0.5.11"))]


def _rewrite_kernel(
    c: Ctx, data: bytes | Callable[[bytes], bytes], cmd: str = "apply"
) -> list[str]:
    root = c.installed()
    k = c.kernel(root)
    k.write_bytes(data(k.read_bytes()) if callable(data) else data)
    return [cmd, "--tree", str(root)]


def truncated_kernel(c: Ctx) -> list[str]:
    return _rewrite_kernel(c, lambda b: b[: b.index(b"plan_compress_prefill_kernel0") + 200])


def empty_kernel(c: Ctx) -> list[str]:
    return _rewrite_kernel(c, b"")


def binary_kernel(c: Ctx) -> list[str]:
    return _rewrite_kernel(c, bytes(range(256)) * 64)


def non_utf8_kernel(c: Ctx) -> list[str]:
    return _rewrite_kernel(c, lambda b: b.replace(b"Stage A", b"Stage \xff\xfe", 1))


def crlf_kernel_verify(c: Ctx) -> list[str]:
    return _rewrite_kernel(c, lambda b: b.replace(b"\n", b"\r\n"), "verify")


def crlf_kernel_check(c: Ctx) -> list[str]:
    return [*_rewrite_kernel(c, lambda b: b.replace(b"\n", b"\r\n")), "--check"]


def kernel0_renamed(c: Ctx) -> list[str]:
    return _rewrite_kernel(c, lambda b: b.replace(b"plan_compress_prefill_kernel0", b"kernel_zero"))


def kernel0_half_block(c: Ctx) -> list[str]:
    """Out of shape: launched with 512 threads, so no-init would read unwritten slots."""
    return _rewrite_kernel(
        c,
        lambda b: b.replace(
            b"LaunchKernel(1, kMaxPrefillBatchSize, device)(plan_compress_prefill_kernel0",
            b"LaunchKernel(1, 512, device)(plan_compress_prefill_kernel0",
        ),
    )


def kernel0_no_barrier(c: Ctx) -> list[str]:
    """Out of shape: the barrier between the per-warp writes and warp 0's read is gone."""

    def edit(b: bytes) -> bytes:
        head, tail = b.split(b"warp_min[warp_id] = warp::reduce_min(e_for_min);\n", 1)
        return (
            head
            + b"warp_min[warp_id] = warp::reduce_min(e_for_min);\n"
            + tail.replace(b"  __syncthreads();\n", b"", 1)
        )

    return _rewrite_kernel(c, edit)


def fixed_but_unsafe_verify(c: Ctx) -> list[str]:
    """A no-init kernel whose barrier before warp 0's read was removed: UNSAFE, never OK."""
    root = c.installed("0.5.18")
    k = c.kernel(root, KERNEL_POST)
    head, tail = k.read_bytes().split(b"warp_min[warp_id] = warp::reduce_min(e_for_min);\n", 1)
    k.write_bytes(
        head
        + b"warp_min[warp_id] = warp::reduce_min(e_for_min);\n"
        + tail.replace(b"  __syncthreads();\n", b"", 1)
    )
    return ["verify", "--tree", str(root)]


def drifted_fix_verify(c: Ctx) -> list[str]:
    root = c.installed("0.5.18")
    k = c.kernel(root, KERNEL_POST)
    k.write_bytes(k.read_bytes() + b"// local edit\n")
    return ["verify", "--tree", str(root)]


def drifted_fix_strict(c: Ctx) -> list[str]:
    return [*drifted_fix_verify(c), "--strict"]


def two_kernels(c: Ctx) -> list[str]:
    root = c.installed()
    second = root / KERNEL_POST
    second.parent.mkdir(parents=True)
    shutil.copy(root / KERNEL_PRE, second)
    return ["apply", "--tree", str(root)]


def kernel_is_folder(c: Ctx) -> list[str]:
    root = c.installed()
    k = c.kernel(root)
    k.unlink()
    k.mkdir()
    return ["apply", "--tree", str(root)]


def read_only_kernel(c: Ctx) -> list[str]:
    root = c.installed()
    c.kernel(root).chmod(0o444)
    return ["apply", "--tree", str(root)]


def symlink_outside(c: Ctx) -> list[str]:
    root = c.installed()
    k = c.kernel(root)
    outside = c.tmp / "outside" / "c_plan.cuh"
    outside.parent.mkdir()
    shutil.move(k, outside)
    k.symlink_to(outside)
    return ["apply", "--tree", str(root)]


def dangling_symlink(c: Ctx) -> list[str]:
    root = c.installed()
    k = c.kernel(root)
    k.unlink()
    k.symlink_to(c.tmp / "gone.cuh")
    return ["verify", "--tree", str(root)]


def _applied(c: Ctx) -> tuple[Path, Path]:
    root = c.installed()
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    return root, c.kernel(root)


def revert_foreign_edit(c: Ctx) -> list[str]:
    root, k = _applied(c)
    k.write_bytes(k.read_bytes() + b"// someone else\n")
    return ["revert", "--tree", str(root)]


def revert_tampered_backup(c: Ctx) -> list[str]:
    root, k = _applied(c)
    backup = k.with_name(".c_plan.cuh.sglang-dsv4-fix.orig")
    backup.chmod(0o644)
    backup.write_bytes(backup.read_bytes() + b"x")
    return ["revert", "--tree", str(root)]


def corrupt_record(c: Ctx) -> list[str]:
    root, k = _applied(c)
    k.with_name(".c_plan.cuh.sglang-dsv4-fix.json").write_text("{not json")
    return ["revert", "--tree", str(root)]


def git_foreign_change(c: Ctx) -> list[str]:
    root = c.git()
    k = root / "python" / KERNEL_PRE
    k.write_bytes(k.read_bytes().replace(b"Stage A", b"Stage A (local note)", 1))
    return ["apply", "--tree", str(root)]


def cache_dir_root(c: Ctx) -> list[str]:
    return ["clear-cache", "--all", "--cache-dir", "/"]


def cache_dir_home(c: Ctx) -> list[str]:
    return ["clear-cache", "--all", "--cache-dir", str(c.home)]


def cache_dir_not_a_cache(c: Ctx) -> list[str]:
    d = c.tmp / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"\xff\xd8 not a build")
    return ["clear-cache", "--all", "--cache-dir", str(d)]


def cache_dir_a_file(c: Ctx) -> list[str]:
    f = c.tmp / "cache-file"
    f.write_text("x")
    return ["clear-cache", "--all", "--cache-dir", str(f)]


def require_variant_on_racy(c: Ctx) -> list[str]:
    return ["verify", "--tree", str(c.installed()), "--require-variant", "barrier"]


def unknown_flag(c: Ctx) -> list[str]:
    return ["apply", "--tree", str(c.installed()), "--frobnicate"]


def unknown_command(c: Ctx) -> list[str]:
    return ["patch-everything"]


def bad_variant(c: Ctx) -> list[str]:
    return ["apply", "--tree", str(c.installed()), "--variant", "sleep"]


def bad_required_variant(c: Ctx) -> list[str]:
    return ["verify", "--tree", str(c.installed()), "--require-variant", "racy-init"]


def no_command(c: Ctx) -> list[str]:
    return []


def scan_logs_missing(c: Ctx) -> list[str]:
    return ["scan-logs", str(c.tmp / "server.log")]


def scan_logs_folder(c: Ctx) -> list[str]:
    return ["scan-logs", str(c.tmp)]


@dataclass
class Case:
    setup: Setup
    code: int
    message: str  # regular expression for the whole stderr (one line), {tmp} = the tmp folder
    stdout: str = ""  # when stderr is empty (verify, --check): regular expression for stdout


CASES = [
    Case(missing_path, Exit.NOT_FOUND, ERR + r"{tmp}/nowhere: no such file or folder"),
    Case(
        empty_folder, Exit.NOT_FOUND, ERR + r"{tmp}/empty: no SGLang package here \(looked for .*\)"
    ),
    Case(
        file_not_folder,
        Exit.NOT_FOUND,
        ERR + r".*/c_plan.cuh: not a folder \(give the tree, not a file\)",
    ),
    Case(not_sglang, Exit.NOT_FOUND, ERR + r"{tmp}/sp: no SGLang package here .*"),
    Case(two_packages, Exit.UNKNOWN, ERR + r"{tmp}/sp: several SGLang packages: .*; name one"),
    Case(
        release_0511_apply,
        Exit.NOT_APPLICABLE,
        ERR
        + r"{tmp}/sp/sglang: NOT APPLICABLE: no DeepSeek-V4 planner in this tree \(release 0.5.11\); not affected",
    ),
    Case(
        release_0511_verify,
        Exit.NOT_APPLICABLE,
        "",
        r"{tmp}/sp/sglang: NOT APPLICABLE: no DeepSeek-V4 planner in this tree \(release 0.5.11\); not affected",
    ),
    Case(
        release_0511_revert,
        Exit.NOT_APPLICABLE,
        ERR
        + r"{tmp}/sp/sglang: NOT APPLICABLE: no DeepSeek-V4 planner in this tree \(release 0.5.11\); not affected",
    ),
    Case(
        truncated_kernel,
        Exit.UNKNOWN,
        ERR + r"kernel0 not recognised: unbalanced '\{' at offset \d+; nothing written",
    ),
    Case(
        empty_kernel,
        Exit.UNKNOWN,
        ERR
        + r"kernel0 not recognised: no definition of plan_compress_prefill_kernel0; nothing written",
    ),
    Case(
        binary_kernel,
        Exit.UNKNOWN,
        ERR
        + r"kernel0 not recognised: the kernel file is binary, not CUDA source; nothing written",
    ),
    Case(
        non_utf8_kernel,
        Exit.UNKNOWN,
        ERR
        + r"kernel0 not recognised: the kernel file is not UTF-8 text \(invalid start byte at byte \d+\); nothing written",
    ),
    Case(
        crlf_kernel_verify,
        Exit.VULNERABLE,
        "",
        r".*/c_plan.cuh: RACY: racy-init kernel0 \(sgl-project/sglang#32467\) \(run: sglang-dsv4-fix apply --tree {tmp}/sp\)\n  note: not release 0.5.16's kernel nor its fix \(a fork or a local edit\)",
    ),
    Case(
        crlf_kernel_check,
        Exit.OK,
        "",
        r"(?s).*/c_plan.cuh: now: RACY: racy-init kernel0 .*\n.*/c_plan.cuh: would write: base is unknown \(sha256 [0-9a-f]{16}…\): rewrote kernel0 structurally; no-init -> sha256 [0-9a-f]{16}…",
    ),
    Case(
        kernel0_renamed,
        Exit.UNKNOWN,
        ERR
        + r"kernel0 not recognised: no definition of plan_compress_prefill_kernel0; nothing written",
    ),
    Case(
        kernel0_half_block,
        Exit.UNKNOWN,
        ERR + r"rewritten kernel is not a safe no-init \(one block of 1024 threads: .*\)",
    ),
    Case(
        kernel0_no_barrier,
        Exit.UNKNOWN,
        ERR
        + r"rewritten kernel is not a safe no-init \(barrier between per-warp writes and warp 0's read: no unconditional barrier before the read\)",
    ),
    Case(
        fixed_but_unsafe_verify,
        Exit.UNKNOWN,
        "",
        r".*/c_plan.cuh: UNSAFE: no-init but preconditions violated: barrier between per-warp writes and warp 0's read \(no unconditional barrier before the read\)\n  note: not release 0.5.18's kernel nor its fix \(a fork or a local edit\)",
    ),
    Case(
        drifted_fix_verify,
        Exit.OK,
        "",
        r".*/c_plan.cuh: FIXED, UNPINNED: safe no-init kernel0; sha256 [0-9a-f]{16}… is neither a release's fix nor what sglang-dsv4-fix wrote\n  note: not release 0.5.18's kernel nor its fix \(a fork or a local edit\)",
    ),
    Case(
        drifted_fix_strict,
        Exit.UNKNOWN,
        "",
        r".*/c_plan.cuh: FIXED, UNPINNED: safe no-init kernel0; sha256 [0-9a-f]{16}… is neither a release's fix nor what sglang-dsv4-fix wrote\n  note: not release 0.5.18's kernel nor its fix \(a fork or a local edit\)",
    ),
    Case(
        two_kernels, Exit.UNKNOWN, ERR + r"two planner kernels in one tree: .*; refusing to guess"
    ),
    Case(
        kernel_is_folder,
        Exit.NOT_FOUND,
        ERR + r".*/c_plan.cuh: cannot read the kernel \(Is a directory\)",
    ),
    Case(
        read_only_kernel,
        Exit.REFUSED,
        ERR + r".*/c_plan.cuh: is read-only; make it writable to patch it",
    ),
    Case(
        symlink_outside,
        Exit.REFUSED,
        ERR + r".*/c_plan.cuh: is a symbolic link; refusing to write through it",
    ),
    Case(
        dangling_symlink,
        Exit.NOT_FOUND,
        ERR + r".*/c_plan.cuh: cannot read the kernel \(No such file or directory\)",
    ),
    Case(
        revert_foreign_edit,
        Exit.REFUSED,
        ERR
        + r".*/c_plan.cuh: sha256 [0-9a-f]{16}… is not what sglang-dsv4-fix wrote \([0-9a-f]{16}…\); refusing to revert someone else's change",
    ),
    Case(
        revert_tampered_backup,
        Exit.REFUSED,
        ERR
        + r".*/\.c_plan\.cuh\.sglang-dsv4-fix\.orig: does not hold the recorded original "
        + r"\(sha256 [0-9a-f]{16}…, recorded 6fa3a2a0cef7a4d7…\); refusing",
    ),
    Case(
        corrupt_record,
        Exit.UNKNOWN,
        ERR
        + r".*/\.c_plan\.cuh\.sglang-dsv4-fix\.json: damaged provenance record "
        + r"\(not JSON: JSONDecodeError\); not acting on it",
    ),
    Case(
        git_foreign_change,
        Exit.REFUSED,
        ERR
        + r"python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh has uncommitted changes not made by sglang-dsv4-fix; commit or stash them, or run: sglang-dsv4-fix apply --force --tree {tmp}/.*",
    ),
    Case(cache_dir_root, Exit.REFUSED, ERR + r"refusing to clear /: that is / or the home folder"),
    Case(
        cache_dir_home,
        Exit.REFUSED,
        ERR + r"refusing to clear {tmp}/home: that is / or the home folder",
    ),
    Case(
        cache_dir_not_a_cache,
        Exit.REFUSED,
        ERR + r"refusing to clear {tmp}/photos: not a TVM-FFI cache .*",
    ),
    Case(cache_dir_a_file, Exit.REFUSED, ERR + r"refusing to clear {tmp}/cache-file: not a folder"),
    Case(require_variant_on_racy, Exit.VULNERABLE, "", r".*: RACY: racy-init kernel0 .*"),
    Case(unknown_flag, Exit.USAGE, r"(?s)usage: .*error: unrecognized arguments: --frobnicate"),
    Case(
        unknown_command,
        Exit.USAGE,
        r"(?s)usage: .*error: argument COMMAND: invalid choice: 'patch-everything' .*",
    ),
    Case(
        bad_variant,
        Exit.USAGE,
        r"(?s)usage: .*error: argument --variant: invalid choice: 'sleep' .*",
    ),
    Case(
        bad_required_variant,
        Exit.USAGE,
        r"(?s)usage: .*error: argument --require-variant: invalid choice: 'racy-init' .*",
    ),
    Case(
        no_command, Exit.USAGE, r"(?s)usage: .*error: the following arguments are required: COMMAND"
    ),
    Case(scan_logs_missing, Exit.NOT_FOUND, ERR + r"{tmp}/server.log: no such file"),
    Case(scan_logs_folder, Exit.NOT_FOUND, ERR + r"{tmp}: is a folder, not a log file"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.setup.__name__ for c in CASES])
def test_bad_input(
    case: Case, tree_factory: TreeFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = case.setup(Ctx(tmp_path, tree_factory))
    capfd.readouterr()
    before = snapshot(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    captured = capfd.readouterr()
    err, out = captured.err.strip(), captured.out.strip()
    assert code == case.code, err
    assert snapshot(tmp_path) == before, "something on disk changed"
    tmp = re.escape(str(tmp_path))
    if case.message:
        assert re.fullmatch(case.message.replace("{tmp}", tmp), err), err
        assert "Traceback" not in err
    else:  # verify and --check report on stdout; stderr stays empty
        assert err == ""
        assert re.fullmatch(case.stdout.replace("{tmp}", tmp), out), out


HOSTILE = {
    "dotdot": "--- a/../../etc/c_plan.cuh\n+++ b/../../etc/c_plan.cuh\n@@ -1 +1 @@\n-a\n+b\n",
    "absolute": "--- /etc/c_plan.cuh\n+++ /etc/c_plan.cuh\n@@ -1 +1 @@\n-a\n+b\n",
    "several": (
        "--- a/python/x.cuh\n+++ b/python/x.cuh\n@@ -1 +1 @@\n-a\n+b\n"
        "--- a/python/y.cuh\n+++ b/python/y.cuh\n@@ -1 +1 @@\n-a\n+b\n"
    ),
    "other file": "--- a/python/setup.py\n+++ b/python/setup.py\n@@ -1 +1 @@\n-a\n+b\n",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_patch_is_refused(name: str) -> None:
    """The patch reader refuses what a tampered patch could do: escape, absolute, many files."""
    path = f"python/{KERNEL_PRE}"
    with pytest.raises(FatalError) as e:
        patching.apply("a\n", HOSTILE[name], path)
    assert e.value.code == Exit.REFUSED
    assert (
        str(e.value)
        == {
            "dotdot": "patch names a path outside the tree: a/../../etc/c_plan.cuh",
            "absolute": "patch names an absolute path: /etc/c_plan.cuh",
            "several": "a patch must change exactly one file, this one has 2",
            "other file": f"patch is for python/setup.py, not {path}",
        }[name]
    )


def test_shipped_patches_are_single_file_and_relative() -> None:
    m = manifest.load()
    for rel in m.releases.values():
        for variant, result in rel.results.items():
            text = manifest.patch_text(result.patch)
            patching.parse_single(text, f"python/{rel.path}")  # raises if hostile
            assert variant in result.patch


def _exit_of(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse
        return int(e.code or 0)


def test_check_exits_as_apply_would(
    tree_factory: TreeFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """For every bad input given to apply, ``apply --check`` exits with apply's own code."""
    seen: dict[str, tuple[int, int, int]] = {}
    for case in CASES:
        where = tmp_path / case.setup.__name__
        where.mkdir()
        argv = case.setup(Ctx(where, tree_factory))
        if argv[:1] != ["apply"] or "--check" in argv or "--frobnicate" in argv:
            continue
        before = snapshot(where)
        checked = _exit_of([*argv, "--check"])
        assert snapshot(where) == before, f"{case.setup.__name__}: --check changed the disk"
        seen[case.setup.__name__] = (checked, _exit_of(argv), int(case.code))
    capfd.readouterr()
    assert len(seen) >= 10, sorted(seen)
    assert {n: c for n, c in seen.items() if len(set(c)) != 1} == {}
