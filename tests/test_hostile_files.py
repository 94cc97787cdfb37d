"""Hostile files beside the kernel, on real release trees: what apply/revert/status/verify do.

Each case runs the real CLI in a fresh process with a timeout, so a hang fails the test instead
of stalling it: a FIFO or ``/dev/zero`` as the record, a FIFO or a 200 MB file as the kernel,
records that are valid JSON but wrong, a replaced backup with a matching record, names that look
like our temp files, and root patching a user's tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest, transaction
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.provenance import DamagedRecord, backup_path, read, record_path

KERNEL = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
ERR = "sglang-dsv4-fix: error: "
ORIGINAL_0516 = manifest.load().releases["0.5.16"].sha256


def cli(*argv: str, timeout: float = 30) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds) of the real CLI in a fresh process."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sglang_dsv4_fix", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout.strip(), done.stderr.strip(), time.monotonic() - t0


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def applied(tree_factory: TreeFactory, tmp_path: Path) -> Path:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    return root


def damage(root: Path, **changes: object) -> None:
    path = record_path(root / KERNEL)
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


# ---------------------------------------------------------------- records that lie


def test_replaced_backup_with_matching_record_is_not_restored(applied: Path) -> None:
    """Defect 3: a replaced .orig plus a record whose base_sha256 matches it was restored."""
    kernel = applied / KERNEL
    fake = b"// not the original\n"
    backup = backup_path(kernel)
    backup.chmod(0o644)
    backup.write_bytes(fake)
    damage(applied, base_sha256=sha(fake))
    fixed = kernel.read_bytes()
    code, _, err, _ = cli("revert", "--tree", str(applied), "--no-clear-cache")
    assert code == Exit.UNKNOWN
    assert err == (
        f"{ERR}{record_path(kernel)}: damaged provenance record (manifest-patch, but no release's "
        f"original {sha(fake)[:16]}… has the no-init fix {sha(fixed)[:16]}…); not acting on it"
    )
    assert kernel.read_bytes() == fixed
    code, _, err, _ = cli("apply", "--tree", str(applied), "--variant", "barrier")
    assert code == Exit.UNKNOWN and "damaged provenance record" in err
    assert kernel.read_bytes() == fixed


def test_replaced_backup_alone_is_reported_not_restored(applied: Path) -> None:
    kernel = applied / KERNEL
    backup = backup_path(kernel)
    backup.chmod(0o644)
    backup.write_bytes(b"// swapped\n")
    record = read(kernel)
    assert record is not None
    assert transaction.backup_verdict(kernel, record) == (
        f"does not hold the recorded original (sha256 {sha(b'// swapped' + bytes([10]))[:16]}…, "
        f"recorded {ORIGINAL_0516[:16]}…)"
    )
    code, _, err, _ = cli("revert", "--tree", str(applied), "--no-clear-cache")
    assert code == Exit.REFUSED
    assert err.endswith("does not hold the recorded original (sha256 " + err.split("sha256 ")[1])
    assert sha(kernel.read_bytes()) != ORIGINAL_0516


def test_replaced_backup_of_an_unknown_base_is_not_restored(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """A fork's kernel (no release's bytes) rewritten structurally: its backup is checked against
    the base sha256 the record wrote, and a swapped one is refused with nothing changed."""
    from test_verdict import edit, local_edit

    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    edit(root, local_edit)
    kernel = root / KERNEL
    fork = kernel.read_bytes()
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    record = read(kernel)
    assert record is not None and record.method == "structural"
    assert record.base_sha256 == sha(fork)
    fixed = kernel.read_bytes()
    backup = backup_path(kernel)
    backup.chmod(0o644)
    swapped = fork.replace(b"warp_max", b"warp_MAX", 1)
    backup.write_bytes(swapped)
    code, _, err, _ = cli("revert", "--tree", str(root), "--no-clear-cache")
    assert code == Exit.REFUSED
    assert err == (
        f"{ERR}{backup}: does not hold the recorded original (sha256 {sha(swapped)[:16]}…, "
        f"recorded {sha(fork)[:16]}…); refusing"
    )
    assert kernel.read_bytes() == fixed and backup.read_bytes() == swapped


def test_backup_verdict_of_an_intact_backup_is_none(applied: Path) -> None:
    record = read(applied / KERNEL)
    assert record is not None
    assert transaction.backup_verdict(applied / KERNEL, record) is None


BAD_RECORDS = {
    "result_sha256 not a string": (
        {"result_sha256": 123},
        "result_sha256 123 is not 64 lowercase hex digits",
    ),
    "state unknown": ({"state": "done"}, "state 'done' is not one of pending, applied"),
    "variant racy": (
        {"variant": "racy-init"},
        "variant 'racy-init' is not one of no-init, barrier",
    ),
    "nested value": ({"time": {"a": [1]}}, "nested value in 'time'"),
    "kernel renamed": (
        {"kernel": "../../etc/passwd"},
        "kernel '../../etc/passwd' is not 'c_plan.cuh'",
    ),
    "backup elsewhere": (
        {"backup": "/etc/shadow"},
        "backup '/etc/shadow' is not '.c_plan.cuh.sglang-dsv4-fix.orig'",
    ),
    "method unknown": (
        {"method": "magic"},
        "method 'magic' is not one of manifest-patch, structural",
    ),
    "release with newline": (
        {"base_release": "0.5.16\n"},
        "base_release '0.5.16\\n' is not a short printable string",
    ),
}


@pytest.mark.parametrize("name", BAD_RECORDS)
def test_malformed_record_is_damaged_never_acted_on(applied: Path, name: str) -> None:
    changes, why = BAD_RECORDS[name]
    damage(applied, **changes)
    kernel = applied / KERNEL
    before = kernel.read_bytes()
    line = f"{ERR}{record_path(kernel)}: damaged provenance record ({why}); not acting on it"
    for argv in (["revert"], ["apply", "--variant", "barrier"]):
        code, _, err, _ = cli(*argv, "--tree", str(applied), "--no-clear-cache")
        assert (code, err) == (Exit.UNKNOWN, line), argv
    for argv in (["status"], ["verify"]):
        code, out, err, _ = cli(*argv, "--tree", str(applied))
        assert code in (Exit.UNKNOWN, Exit.OK) and "damaged provenance record" in out + err, argv
        assert "Traceback" not in err
    assert kernel.read_bytes() == before


def test_deeply_nested_record_is_damaged(applied: Path) -> None:
    path = record_path(applied / KERNEL)
    path.write_text("[" * 30000 + "]" * 30000)
    with pytest.raises(DamagedRecord) as e:
        read(applied / KERNEL)
    assert e.value.why in ("not JSON: RecursionError", "not a JSON object but list")
    code, _, err, _ = cli("revert", "--tree", str(applied), "--no-clear-cache")
    assert code == Exit.UNKNOWN and "damaged provenance record" in err


# ---------------------------------------------------------------- files that block or are huge


def test_record_symlinked_to_dev_zero_returns_promptly(applied: Path) -> None:
    path = record_path(applied / KERNEL)
    path.unlink()
    path.symlink_to("/dev/zero")
    why = "cannot read the provenance record (a symbolic link)"
    line = f"{ERR}{path}: damaged provenance record ({why}); not acting on it"
    for argv in (["revert", "--no-clear-cache"], ["apply", "--no-clear-cache"]):
        code, _, err, seconds = cli(*argv, "--tree", str(applied))
        assert (code, err) == (Exit.UNKNOWN, line)
        assert seconds < 20
    for argv in (["status"], ["verify"]):
        code, out, err, seconds = cli(*argv, "--tree", str(applied))
        assert "damaged provenance record" in out + err and seconds < 20


def test_fifo_as_record_never_blocks(applied: Path) -> None:
    path = record_path(applied / KERNEL)
    path.unlink()
    os.mkfifo(path)
    why = "cannot read the provenance record (not a regular file: a FIFO)"
    line = f"{ERR}{path}: damaged provenance record ({why}); not acting on it"
    for argv in (["revert", "--no-clear-cache"], ["apply", "--no-clear-cache"]):
        assert cli(*argv, "--tree", str(applied))[:3:2] == (Exit.UNKNOWN, line)
    for argv in (["status"], ["verify"]):
        _, out, err, _ = cli(*argv, "--tree", str(applied))
        assert "not a regular file: a FIFO" in out + err


def test_fifo_as_kernel_never_blocks(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = root / KERNEL
    kernel.unlink()
    os.mkfifo(kernel)
    line = f"{ERR}{kernel}: cannot read the kernel (not a regular file: a FIFO)"
    for argv in (["apply"], ["verify"], ["status"], ["revert"]):
        code, _, err, _ = cli(*argv, "--tree", str(root))
        assert (code, err) == (Exit.NOT_FOUND, line), argv


def test_200_mb_kernel_is_refused_promptly(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = root / KERNEL
    with kernel.open("ab") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: 200 MB of size, no disk
    size = kernel.stat().st_size
    line = f"{ERR}{kernel}: the kernel is {size} bytes, over the 4194304-byte limit; not reading it"
    for argv in (["apply"], ["verify"], ["status"]):
        code, _, err, seconds = cli(*argv, "--tree", str(root))
        assert (code, err) == (Exit.NOT_FOUND, line), argv
        assert seconds < 20


# ---------------------------------------------------------------- names that look like ours


def test_user_files_named_like_temp_files_are_left_alone(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """Defect 9 and 8: a user's .c_plan.cuh.<x>.tmp file is not deleted; a folder with our exact
    temp-name shape does not wedge apply or revert."""
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    folder = (root / KERNEL).parent
    user_file = folder / ".c_plan.cuh.notes.tmp"
    user_file.write_text("mine")
    wedge = folder / f".c_plan.cuh.1.{'0' * 16}.sglang-dsv4-fix.tmp"
    wedge.mkdir()
    (wedge / "inside").write_text("x")
    record_wedge = folder / f".{record_path(root / KERNEL).name}.77.{'a' * 16}.sglang-dsv4-fix.tmp"
    record_wedge.mkdir()
    for argv in (["apply"], ["revert"], ["apply"], ["revert"]):
        assert main([*argv, "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    assert user_file.read_text() == "mine"
    assert (wedge / "inside").read_text() == "x" and record_wedge.is_dir()
    assert sha((root / KERNEL).read_bytes()) == ORIGINAL_0516


def test_our_stale_temp_file_is_removed(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    folder = (root / KERNEL).parent
    stale = folder / f".c_plan.cuh.4242.{'0123456789abcdef'}.sglang-dsv4-fix.tmp"
    stale.write_bytes(b"half a kernel")
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    assert not stale.exists()
    names = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert names == [".c_plan.cuh.sglang-dsv4-fix.json", ".c_plan.cuh.sglang-dsv4-fix.orig"]


# ---------------------------------------------------------------- owners and permissions


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setpriv)")


@needs_root
def test_root_apply_keeps_the_kernels_owner(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = root / KERNEL
    os.chown(kernel, 65534, 65534)
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    st = kernel.stat()
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    assert main(["revert", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    st = kernel.stat()
    assert (st.st_uid, st.st_gid, sha(kernel.read_bytes())) == (65534, 65534, ORIGINAL_0516)


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv")
def test_read_only_folder_as_non_root(tree_factory: TreeFactory, tmp_path: Path) -> None:
    """Defect 8: a kernel folder the user cannot write gave exit 70; now one line and exit 6."""
    open_tmp = Path(tempfile.mkdtemp(prefix="sglang-dsv4-fix-test-"))  # pytest's tmp is 0700
    try:
        _read_only_folder_as(tree_factory, open_tmp)
    finally:
        shutil.rmtree(open_tmp)


def _read_only_folder_as(tree_factory: TreeFactory, tmp: Path) -> None:
    tmp.chmod(0o755)
    root = tree_factory.installed("0.5.16", tmp / "sp")
    for p in [root, *root.rglob("*")]:
        os.lchown(p, 65534, 65534)
    folder = (root / KERNEL).parent
    folder.chmod(0o555)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [
            *drop,
            sys.executable,
            "-m",
            "sglang_dsv4_fix",
            "apply",
            "--tree",
            str(root),
            "--no-clear-cache",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == Exit.REFUSED, done.stderr
    assert done.stderr.strip() == (
        f"{ERR}{folder}: the kernel's folder is not writable for this user; nothing changed"
    )
    assert sha((root / KERNEL).read_bytes()) == ORIGINAL_0516


# ---------------------------------------------------------------- full, read-only, too-big file systems


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "none", "/mnt"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs a private mount namespace")

# Runs inside `unshare --mount`: a tmpfs of the given size holds the tree, a filler takes all but
# `free` bytes, then the real CLI runs on it; prints the exit code and stderr as JSON.
IN_NAMESPACE = r"""
import json, os, shutil, subprocess, sys, contextlib, io
mnt, template, size, free, ro = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
argv = json.loads(sys.argv[6])
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "none", mnt], check=True)
shutil.copytree(template, mnt + "/sp", symlinks=True)
for pre in json.loads(sys.argv[7]):
    from sglang_dsv4_fix.main import main
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*pre, "--tree", mnt + "/sp", "--no-clear-cache"]) == 0
st = os.statvfs(mnt)
avail = st.f_bavail * st.f_frsize
with open(mnt + "/filler", "wb") as f:
    with contextlib.suppress(OSError):
        f.write(b"\0" * max(0, avail - free))
if ro == "ro":
    subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
done = subprocess.run([sys.executable, "-m", "sglang_dsv4_fix", *argv, "--tree", mnt + "/sp",
                       "--no-clear-cache"], capture_output=True, text=True)
folder = mnt + "/sp/sglang/jit_kernel/csrc/deepseek_v4"
names = sorted(n for n in os.listdir(folder) if n.startswith("."))
import hashlib
kernel = hashlib.sha256(open(folder + "/c_plan.cuh", "rb").read()).hexdigest()
print(json.dumps({"code": done.returncode, "err": done.stderr.strip(), "names": names,
                  "kernel": kernel}))
"""


def in_namespace(
    template: Path,
    tmp: Path,
    argv: list[str],
    free: int,
    ro: bool = False,
    prepare: list[list[str]] | None = None,
) -> dict[str, object]:
    mnt = tmp / "mnt"
    mnt.mkdir(exist_ok=True)
    size = sum(p.stat().st_size for p in template.rglob("*") if p.is_file()) + 4 * 1024 * 1024
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            IN_NAMESPACE,
            str(mnt),
            str(template),
            str(size),
            str(free),
            "ro" if ro else "rw",
            json.dumps(argv),
            json.dumps(prepare or []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture
def template(tree_factory: TreeFactory, tmp_path: Path) -> Path:
    return tree_factory.installed("0.5.16", tmp_path / "template")


FIXED_0516 = manifest.load().releases["0.5.16"].results["no-init"].sha256


@needs_mount
def test_read_only_file_system(template: Path, tmp_path: Path) -> None:
    for argv, prepare in ((["apply"], []), (["revert"], [["apply"]])):
        r = in_namespace(template, tmp_path, argv, free=1 << 20, ro=True, prepare=prepare)
        assert r["code"] == Exit.REFUSED, r
        assert re.fullmatch(
            ERR + r"/.*/deepseek_v4: is on a read-only file system; nothing changed", str(r["err"])
        ), r


@needs_mount
@pytest.mark.parametrize("free", [0, 8 * 1024, 30 * 1024, 40 * 1024, 70 * 1024, 120 * 1024])
def test_full_disk_apply_is_whole_or_nothing(template: Path, tmp_path: Path, free: int) -> None:
    """ENOSPC at several fill levels: exit 0 with the fix, or exit 6 with nothing changed."""
    r = in_namespace(template, tmp_path, ["apply"], free=free)
    if r["code"] == Exit.OK:
        assert r["kernel"] == FIXED_0516
        assert r["names"] == [
            ".c_plan.cuh.sglang-dsv4-fix.json",
            ".c_plan.cuh.sglang-dsv4-fix.orig",
        ]
    else:
        assert r["code"] == Exit.REFUSED, r
        assert re.fullmatch(
            ERR + r"/.*/deepseek_v4: cannot write \(No space left on device\); nothing changed",
            str(r["err"]),
        ), r
        assert (r["kernel"], r["names"]) == (ORIGINAL_0516, []), r


def test_file_too_large_for_the_limit(applied: Path) -> None:
    """EFBIG (RLIMIT_FSIZE below the kernel's size): one line, exit 6, nothing changed."""
    limit = "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    limit += "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
    limit += "from sglang_dsv4_fix.main import main; sys.exit(main(sys.argv[1:]))"
    kernel = applied / KERNEL
    before = {p.name: sha(p.read_bytes()) for p in kernel.parent.iterdir() if p.is_file()}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            limit,
            "apply",
            "--variant",
            "barrier",
            "--tree",
            str(applied),
            "--no-clear-cache",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == Exit.REFUSED, done.stderr
    assert done.stderr.strip() == (
        f"{ERR}{kernel.parent}: cannot write (File too large); nothing changed"
    )
    after = {p.name: sha(p.read_bytes()) for p in kernel.parent.iterdir() if p.is_file()}
    assert after == before


def test_fifo_as_backup_never_blocks(applied: Path) -> None:
    kernel = applied / KERNEL
    backup = backup_path(kernel)
    backup.unlink()
    os.mkfifo(backup)
    code, _, err, _ = cli("revert", "--tree", str(applied), "--no-clear-cache")
    assert (code, err) == (
        Exit.REFUSED,
        f"{ERR}{backup}: cannot read the backup (not a regular file: a FIFO); refusing",
    )
    for argv in (["status"], ["verify"], ["apply", "--variant", "barrier"]):
        code, _, err, seconds = cli(*argv, "--tree", str(applied), timeout=30)
        assert "Traceback" not in err and seconds < 20, argv
    assert backup.exists() and sha(kernel.read_bytes()) != ORIGINAL_0516
