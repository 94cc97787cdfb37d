"""apply and revert's transaction, in this process, on a real 0.5.16 tree: what each step leaves on
disk (bytes, modes, owners, the record's fields), how a torn run is finished or rolled back, and
the exact refusal for each way it can go wrong.

The write failures are real: the process's file-size limit (``RLIMIT_FSIZE``, with ``SIGXFSZ``
ignored) makes a write of more bytes than the limit fail with ``EFBIG``, as a full disk would,
after the smaller writes before it succeeded. The CLI, kill and folder-swap tests
(test_crash_consistency.py, test_folder_swap.py, test_hostile_files.py) show the same through
subprocesses; these reach the code in-process, where mutation testing can see them.
"""

from __future__ import annotations

import array
import contextlib
import datetime
import fcntl
import os
import resource
import shutil
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_jitcache import lay_build, real_dir
from trees import TreeFactory, extract

from sglang_dsv4_fix import __version__, manifest, provenance, transaction
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import KERNEL_LIMIT, sha256_bytes, temp_name
from sglang_dsv4_fix.fswrite import file_lock
from sglang_dsv4_fix.provenance import Provenance
from sglang_dsv4_fix.rewrite import Target, rewrite
from sglang_dsv4_fix.state import inspect
from sglang_dsv4_fix.tree import Tree, find_tree
from sglang_dsv4_fix.verdict import Options

RELEASE = manifest.load().releases["0.5.16"]
BASE = str(RELEASE.sha256)  # every release in the manifest has its original's
NO_INIT = RELEASE.results["no-init"].sha256
BARRIER = RELEASE.results["barrier"].sha256
RECORD = ".c_plan.cuh.sglang-dsv4-fix.json"
BACKUP = ".c_plan.cuh.sglang-dsv4-fix.orig"
OWNER = (4242, 4343)  # not root's: a write that drops the owner leaves root's
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")


# What apply and revert read of an installed tree (the dist-info comes with every extract): the
# mutation run repeats these tests for every mutant, so each copies 5 files, not the 840 of a
# full tree (the JIT-cache test takes one of those).
SLIM = ("sglang/__init__.py", "sglang/version.py", "sglang/_version.py",
        "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh")  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return find_tree(extract("0.5.16", tmp_path / "sp", SLIM))


def kernel_of(tree: Tree) -> Path:
    assert tree.kernel_path is not None
    return tree.kernel_path


def apply(tree: Tree, variant: Target = "no-init") -> transaction.Applied:
    return transaction.apply_fix(tree, variant, Options(), clear_cache=False)


def record_of(kernel: Path) -> Provenance:
    record = provenance.read(kernel)
    assert record is not None
    return record


def expected(variant: str, result: str, time: str, written_by: str = "cli") -> Provenance:
    """The applied record of a manifest-patch of 0.5.16's kernel to ``variant``."""
    return Provenance(
        "applied", variant, "manifest-patch", "0.5.16", BASE, result, __version__, time,
        "c_plan.cuh", BACKUP, written_by=written_by,
    )  # fmt: skip


def listing(folder: Path) -> dict[str, tuple[int, int, int, int, str]]:
    """Every entry: (inode, mode, uid, gid, sha256) — a rewrite changes the inode."""
    out = {}
    for p in sorted(folder.iterdir()):
        st = p.lstat()
        data = sha256_bytes(p.read_bytes()) if stat.S_ISREG(st.st_mode) else ""
        out[p.name] = (st.st_ino, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, data)
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def owner(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past ``size`` bytes fail with EFBIG (File too large) inside the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def raised(kernel: Path, fn: object, *args: object) -> FatalError:
    """The FatalError ``fn(*args)`` raises under the folder's lock."""
    assert callable(fn)
    with file_lock(kernel.parent), pytest.raises(FatalError) as caught:
        fn(*args)
    return caught.value


def refused(kernel: Path, fn: object, *args: object) -> tuple[str, int]:
    """The message and exit code of the FatalError ``fn(*args)`` raises under the lock, which must
    leave the kernel's folder exactly as it was."""
    before = listing(kernel.parent)
    e = raised(kernel, fn, *args)
    assert listing(kernel.parent) == before
    return str(e), e.code


# --------------------------------------------------------------------------- apply


def test_apply_keeps_the_original_and_records_the_write(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    kernel.chmod(0o640)
    done = apply(tree)
    assert (done.written, done.removed, done.cache_warning) == (True, (), None)
    assert done.plan.message == f"known base (release 0.5.16); no-init -> sha256 {NO_INIT[:16]}…"
    assert sha256_bytes(kernel.read_bytes()) == NO_INIT and mode(kernel) == 0o640
    backup = kernel.with_name(BACKUP)
    assert backup.read_bytes() == original and mode(backup) == 0o444
    assert mode(kernel.with_name(RECORD)) == 0o644
    record = record_of(kernel)
    assert record == expected("no-init", NO_INIT, record.time, written_by="cli")
    assert done.plan.record == record._replace(state="pending")  # the plan it carried out
    assert (done.plan.replaces_sha256, done.plan.replaces_record) == (BASE, None)
    written = datetime.datetime.fromisoformat(record.time)
    assert record.time.endswith("+00:00") and written.tzinfo == datetime.timezone.utc
    now = datetime.datetime.now(datetime.timezone.utc)
    assert now - datetime.timedelta(minutes=1) <= written <= now


@as_root
def test_apply_gives_every_file_the_kernel_owner(tree: Tree) -> None:
    kernel = kernel_of(tree)
    os.chown(kernel, *OWNER)
    apply(tree)
    assert [owner(kernel.with_name(n)) for n in ("c_plan.cuh", BACKUP, RECORD)] == [OWNER] * 3


def test_apply_records_who_wrote_it(tree: Tree) -> None:
    done = transaction.apply_fix(tree, "no-init", Options(), written_by="plugin", clear_cache=False)
    assert done.written and record_of(kernel_of(tree)).written_by == "plugin"


def test_apply_on_a_fixed_kernel_writes_nothing(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    before = listing(kernel.parent)
    done = apply(tree)
    assert (done.written, done.plan.action, done.plan.message, done.removed) == (
        False, "none", "already fixed (no-init); nothing to do", ()
    )  # fmt: skip
    assert listing(kernel.parent) == before


# --------------------------------------------------------------------------- the variant switch


def test_switch_plans_the_other_variant_from_the_backup(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    applied = record_of(kernel)
    before = listing(kernel.parent)
    plan = transaction.plan_apply(inspect(tree), "barrier")
    assert listing(kernel.parent) == before  # planning writes nothing
    assert plan.action == "write"
    assert plan.message == f"known base (release 0.5.16); barrier -> sha256 {BARRIER[:16]}…"
    assert sha256_bytes(plan.new_data) == BARRIER
    assert plan.new_data == transaction._from_manifest(original.decode(), RELEASE, "barrier")
    assert (plan.replaces_sha256, plan.replaces_record) == (NO_INIT, applied)
    assert plan.record is not None
    assert plan.record == expected("barrier", BARRIER, plan.record.time)._replace(
        state="pending",
        previous_variant="no-init",
        previous_sha256=NO_INIT,
        previous_method="manifest-patch",
    )


def test_switch_replaces_the_kernel_once_and_keeps_the_backup(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    backup = listing(kernel.parent)[BACKUP]
    done = apply(tree, "barrier")
    assert done.written and sha256_bytes(kernel.read_bytes()) == BARRIER
    assert listing(kernel.parent)[BACKUP] == backup  # not rewritten: the same file
    record = record_of(kernel)
    assert record == expected("barrier", BARRIER, record.time)
    apply(tree, "no-init")
    assert sha256_bytes(kernel.read_bytes()) == NO_INIT
    assert record_of(kernel) == expected("no-init", NO_INIT, record_of(kernel).time)
    assert listing(kernel.parent)[BACKUP] == backup


def test_switch_of_a_structural_fix_starts_from_the_recorded_original(tree: Tree) -> None:
    kernel = kernel_of(tree)
    fork = kernel.read_bytes() + b"// a fork's note\n"
    kernel.write_bytes(fork)
    apply(tree)
    first = record_of(kernel)
    done = apply(tree, "barrier")
    new = rewrite(fork.decode(), "barrier").encode()
    assert kernel.read_bytes() == new and kernel.with_name(BACKUP).read_bytes() == fork
    base = sha256_bytes(fork)
    assert done.plan.message == (
        f"base is unknown (sha256 {base[:16]}…): rewrote kernel0 structurally; "
        f"barrier -> sha256 {sha256_bytes(new)[:16]}…"
    )
    assert done.plan.replaces_record == first
    record = record_of(kernel)
    assert record == Provenance(
        "applied", "barrier", "structural", "0.5.16", base, sha256_bytes(new), __version__,
        record.time, "c_plan.cuh", BACKUP,
    )  # fmt: skip
    assert (first.method, first.base_sha256) == ("structural", base)


def _swap_backup(backup: Path) -> None:
    backup.chmod(0o644)
    backup.write_bytes(backup.read_bytes() + b"// swapped\n")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_swap_backup, "does not hold the recorded original; refusing"),
        (Path.unlink, "cannot read the backup (No such file or directory)"),
    ],
    ids=("changed", "gone"),
)
def test_a_switch_whose_backup_changed_since_planning_is_refused(
    tree: Tree, damage: Callable[[Path], None], reason: str
) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    plan = transaction.plan_apply(inspect(tree), "barrier")
    backup = kernel.with_name(BACKUP)
    damage(backup)
    assert refused(kernel, transaction.commit_plan, kernel, plan) == (
        f"{backup}: {reason}",
        Exit.REFUSED,
    )


# --------------------------------------------------------------------------- commit_plan


def test_commit_refuses_a_kernel_changed_since_planning(tree: Tree) -> None:
    kernel = kernel_of(tree)
    plan = transaction.plan_apply(inspect(tree), "no-init")
    kernel.write_bytes(kernel.read_bytes() + b"// meanwhile\n")
    assert refused(kernel, transaction.commit_plan, kernel, plan) == (
        f"{kernel}: changed while planning; run again",
        Exit.REFUSED,
    )


def test_commit_of_a_switch_checks_the_kernel_it_replaces(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    plan = transaction.plan_apply(inspect(tree), "barrier")
    kernel.write_bytes(kernel.with_name(BACKUP).read_bytes())  # the original: not what it replaces
    assert refused(kernel, transaction.commit_plan, kernel, plan) == (
        f"{kernel}: changed while planning; run again",
        Exit.REFUSED,
    )


def test_commit_keeps_a_backup_that_already_holds_the_original(tree: Tree) -> None:
    kernel = kernel_of(tree)
    backup = kernel.with_name(BACKUP)
    backup.write_bytes(kernel.read_bytes())
    backup.chmod(0o600)
    kept = listing(kernel.parent)[BACKUP]
    plan = transaction.plan_apply(inspect(tree), "no-init")
    with file_lock(kernel.parent):
        transaction.commit_plan(kernel, plan)
    assert listing(kernel.parent)[BACKUP] == kept
    assert sha256_bytes(kernel.read_bytes()) == NO_INIT


def test_commit_replaces_a_backup_of_other_bytes(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    backup = kernel.with_name(BACKUP)
    backup.write_bytes(b"left by someone\n")
    plan = transaction.plan_apply(inspect(tree), "no-init")
    with file_lock(kernel.parent):
        transaction.commit_plan(kernel, plan)
    assert backup.read_bytes() == original and mode(backup) == 0o444


def test_a_plan_without_replaces_checks_the_recorded_base(tree: Tree) -> None:
    """revert --commit's way back: the patched kernel written again from its old record."""
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    old, patched = record_of(kernel), kernel.read_bytes()
    with file_lock(kernel.parent):
        transaction.revert(kernel)
    plan = transaction.Plan("write", "restore", patched, old._replace(state="pending"))
    with file_lock(kernel.parent):
        transaction.commit_plan(kernel, plan)
    assert kernel.read_bytes() == patched and record_of(kernel) == old
    assert kernel.with_name(BACKUP).read_bytes() == original


# --------------------------------------------------------------------------- failed writes


def test_a_failed_backup_write_changes_nothing(tree: Tree) -> None:
    kernel = kernel_of(tree)
    plan = transaction.plan_apply(inspect(tree), "no-init")
    with file_size_limit(4096):
        said = refused(kernel, transaction.commit_plan, kernel, plan)
    assert said == (
        f"{kernel.parent}: cannot write (File too large); nothing changed",
        Exit.REFUSED,
    )


def test_a_failed_kernel_write_takes_back_the_backup_and_the_record(tree: Tree) -> None:
    kernel = kernel_of(tree)
    size = len(kernel.read_bytes())
    plan = transaction.plan_apply(inspect(tree), "barrier")
    assert len(plan.new_data) > size  # the barrier adds a line: the backup fits, the kernel not
    with file_size_limit(size):
        said = refused(kernel, transaction.commit_plan, kernel, plan)
    assert said == (
        f"{kernel.parent}: cannot write (File too large); nothing changed",
        Exit.REFUSED,
    )


def test_a_failed_kernel_write_keeps_a_backup_it_did_not_write(tree: Tree) -> None:
    kernel = kernel_of(tree)
    kernel.with_name(BACKUP).write_bytes(kernel.read_bytes())
    plan = transaction.plan_apply(inspect(tree), "no-init")
    before = listing(kernel.parent)
    with file_size_limit(4096):
        e = raised(kernel, transaction.commit_plan, kernel, plan)
    assert str(e) == f"{kernel.parent}: cannot write (File too large); nothing changed"
    assert listing(kernel.parent) == before


def test_a_failed_switch_puts_the_old_record_back(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    record = kernel.with_name(RECORD).read_bytes()
    plan = transaction.plan_apply(inspect(tree), "barrier")
    with file_size_limit(4096):
        e = raised(kernel, transaction.commit_plan, kernel, plan)
    assert str(e) == f"{kernel.parent}: cannot write (File too large); nothing changed"
    assert kernel.with_name(RECORD).read_bytes() == record
    assert sha256_bytes(kernel.read_bytes()) == NO_INIT


@as_root
def test_a_failed_switch_puts_the_old_record_back_with_its_owner(tree: Tree) -> None:
    kernel = kernel_of(tree)
    os.chown(kernel, *OWNER)
    apply(tree)
    plan = transaction.plan_apply(inspect(tree), "barrier")
    with file_size_limit(4096):
        raised(kernel, transaction.commit_plan, kernel, plan)
    assert owner(kernel.with_name(RECORD)) == OWNER


def test_a_failed_revert_changes_nothing(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    with file_size_limit(4096):
        said = refused(kernel, transaction.revert, kernel)
    assert said == (
        f"{kernel.parent}: cannot write (File too large); nothing changed",
        Exit.REFUSED,
    )


def test_a_failed_recovery_says_the_next_run_finishes(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    transaction.write_record(kernel, record_of(kernel)._replace(state="pending"))
    with file_size_limit(100):
        said = refused(kernel, transaction.recover, kernel)
    assert said == (
        f"{kernel.parent}: cannot write (File too large); the next run finishes or rolls back",
        Exit.REFUSED,
    )


def test_undo_runs_every_step_last_first_and_says_whether_all_worked(tmp_path: Path) -> None:
    tmp_path = tmp_path / "steps"
    tmp_path.mkdir()
    done: list[str] = []
    for name in ("a", "c"):
        (tmp_path / name).write_bytes(b"")

    def unlink(name: str) -> None:
        (tmp_path / name).unlink()  # raises FileNotFoundError (an OSError) for "b"
        done.append(name)

    assert (
        transaction._undo([lambda: unlink("a"), lambda: unlink("b"), lambda: unlink("c")]) is False
    )
    assert done == ["c", "a"] and not list(tmp_path.iterdir())
    (tmp_path / "a").write_bytes(b"")
    (tmp_path / "c").write_bytes(b"")
    done.clear()
    assert transaction._undo([lambda: unlink("a"), lambda: unlink("c")]) is True
    assert done == ["c", "a"]
    assert transaction._undo([]) is True


def test_restore_record_undoes_the_record_write(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    old = record_of(kernel)
    with file_lock(kernel.parent):
        put_back = transaction._restore_record(kernel, old, OWNER)
        drop = transaction._restore_record(kernel, None, OWNER)
        transaction.write_record(kernel, old._replace(state="pending", written_by="plugin"))
        put_back()
        assert record_of(kernel) == old
        if os.geteuid() == 0:
            assert owner(kernel.with_name(RECORD)) == OWNER
        drop()
    assert provenance.read(kernel) is None and kernel.with_name(BACKUP).is_file()


# --------------------------------------------------------------------------- recovery


def pending(kernel: Path, **changes: str | None) -> Provenance:
    """Rewrite the record as a killed run left it (state "pending", plus ``changes``)."""
    record = record_of(kernel)._replace(state="pending", **changes)
    transaction.write_record(kernel, record)
    return record


def recover(kernel: Path) -> None:
    with file_lock(kernel.parent):
        transaction.recover(kernel)


def test_recover_marks_a_landed_write_applied(tree: Tree) -> None:
    kernel = kernel_of(tree)
    if os.geteuid() == 0:
        os.chown(kernel, *OWNER)
    apply(tree)
    record = pending(kernel)
    recover(kernel)
    assert record_of(kernel) == record._replace(state="applied")
    assert kernel.with_name(BACKUP).is_file() and sha256_bytes(kernel.read_bytes()) == NO_INIT
    if os.geteuid() == 0:
        assert owner(kernel.with_name(RECORD)) == OWNER


def switch_pending(tree: Tree, land: bool) -> Provenance:
    """A switch to barrier killed before (``land`` False) or after the kernel was replaced."""
    kernel = kernel_of(tree)
    apply(tree)
    plan = transaction.plan_apply(inspect(tree), "barrier")
    assert plan.record is not None
    transaction.write_record(kernel, plan.record)
    if land:
        kernel.write_bytes(plan.new_data)
    return plan.record


def test_recover_finishes_a_landed_switch(tree: Tree) -> None:
    kernel = kernel_of(tree)
    record = switch_pending(tree, land=True)
    recover(kernel)
    assert record_of(kernel) == expected("barrier", BARRIER, record.time)


@pytest.mark.parametrize("as_owner", [False, True])
def test_recover_rolls_back_a_switch_that_never_landed(tree: Tree, as_owner: bool) -> None:
    if as_owner and os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    kernel = kernel_of(tree)
    if as_owner:
        os.chown(kernel, *OWNER)
    record = switch_pending(tree, land=False)
    recover(kernel)
    assert record_of(kernel) == expected("no-init", NO_INIT, record.time)
    assert sha256_bytes(kernel.read_bytes()) == NO_INIT
    assert owner(kernel.with_name(RECORD)) == (OWNER if as_owner else (os.geteuid(), os.getegid()))


@pytest.mark.parametrize("state", ["pending", "applied"])
def test_recover_drops_record_and_backup_when_the_kernel_is_the_original(
    tree: Tree, state: str
) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    transaction.write_record(kernel, record_of(kernel)._replace(state=state))
    kernel.write_bytes(original)  # an apply killed before the replace, a revert after it
    recover(kernel)
    assert not kernel.with_name(RECORD).exists() and not kernel.with_name(BACKUP).exists()
    assert kernel.read_bytes() == original


@pytest.mark.parametrize("switch", [False, True])
def test_recover_refuses_a_pending_record_whose_kernel_changed(tree: Tree, switch: bool) -> None:
    kernel = kernel_of(tree)
    if switch:
        switch_pending(tree, land=False)
    else:
        apply(tree)
        pending(kernel)
    kernel.write_bytes(kernel.read_bytes() + b"// someone else\n")
    assert refused(kernel, transaction.recover, kernel) == (
        f"{kernel}: changed during an interrupted apply; inspect by hand",
        Exit.REFUSED,
    )


@pytest.mark.parametrize("edit", [False, True])
def test_recover_leaves_a_settled_record_alone(tree: Tree, edit: bool) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    if edit:  # someone else's change to our fix: verify and revert report it, recovery not
        kernel.write_bytes(kernel.read_bytes() + b"// someone else\n")
    before = listing(kernel.parent)
    recover(kernel)
    assert listing(kernel.parent) == before


def test_recover_drops_only_our_temp_files_and_a_lone_backup_of_the_kernel(tree: Tree) -> None:
    kernel = kernel_of(tree)
    ours = [temp_name(n) for n in ("c_plan.cuh", RECORD, BACKUP)]
    for name in ours:
        kernel.with_name(name).write_bytes(b"torn")
    kernel.with_name(".c_plan.cuh.x.tmp").write_bytes(b"a user's")
    kernel.with_name(BACKUP).write_bytes(kernel.read_bytes())
    recover(kernel)
    names = {p.name for p in kernel.parent.iterdir()}
    assert not names & {*ours, BACKUP} and ".c_plan.cuh.x.tmp" in names


def test_recover_keeps_a_lone_backup_of_other_bytes(tree: Tree) -> None:
    kernel = kernel_of(tree)
    kernel.with_name(BACKUP).write_bytes(b"not the kernel\n")
    before = listing(kernel.parent)
    recover(kernel)
    assert listing(kernel.parent) == before


# --------------------------------------------------------------------------- revert


def test_revert_restores_the_original_with_its_mode(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    kernel.chmod(0o640)
    apply(tree)
    with file_lock(kernel.parent):
        message = transaction.revert(kernel)
    assert message == f"restored the original kernel (sha256 {BASE[:16]}…)"
    assert kernel.read_bytes() == original and mode(kernel) == 0o640
    assert not kernel.with_name(RECORD).exists() and not kernel.with_name(BACKUP).exists()


@as_root
def test_revert_keeps_the_kernel_owner(tree: Tree) -> None:
    kernel = kernel_of(tree)
    os.chown(kernel, *OWNER)
    apply(tree)
    with file_lock(kernel.parent):
        transaction.revert(kernel)
    assert owner(kernel) == OWNER


def test_revert_without_a_record_changes_nothing(tree: Tree) -> None:
    kernel = kernel_of(tree)
    before = listing(kernel.parent)
    with file_lock(kernel.parent):
        message = transaction.revert(kernel)
    assert message == "nothing to revert: the kernel was not patched by sglang-dsv4-fix"
    assert listing(kernel.parent) == before


def test_revert_refuses_someone_else_s_change(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    kernel.write_bytes(kernel.read_bytes() + b"// someone else\n")
    now = sha256_bytes(kernel.read_bytes())
    assert refused(kernel, transaction.revert, kernel) == (
        f"{kernel}: sha256 {now[:16]}… is not what sglang-dsv4-fix wrote ({NO_INIT[:16]}…); "
        "refusing to revert someone else's change",
        Exit.REFUSED,
    )


# --------------------------------------------------------------------------- the backup


def test_revertible_gives_the_backup_without_the_lock(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    assert transaction.revertible(kernel, record_of(kernel), NO_INIT) == original


@pytest.mark.parametrize("locked", [False, True])
def test_a_backup_that_is_a_link_is_refused(tree: Tree, locked: bool) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    backup = kernel.with_name(BACKUP)
    backup.unlink()
    (kernel.parent / "elsewhere").write_bytes(original)
    backup.symlink_to(kernel.parent / "elsewhere")
    record = record_of(kernel)
    why = "cannot read the backup (a symbolic link)"
    with file_lock(kernel.parent) if locked else contextlib.nullcontext():
        assert transaction.backup_verdict(kernel, record) == why
        with pytest.raises(FatalError) as caught:
            transaction.original_bytes(kernel, record)
    assert (str(caught.value), caught.value.code) == (f"{backup}: {why}; refusing", Exit.REFUSED)


@pytest.mark.parametrize(("locked", "code"), [(False, Exit.NOT_FOUND), (True, Exit.REFUSED)])
def test_a_missing_backup_is_named(tree: Tree, locked: bool, code: int) -> None:
    kernel = kernel_of(tree)
    lock = file_lock(kernel.parent) if locked else contextlib.nullcontext()
    with lock, pytest.raises(FatalError) as caught:
        transaction._read_backup(kernel)
    assert (str(caught.value), caught.value.code) == (
        f"{kernel.with_name(BACKUP)}: cannot read the backup (No such file or directory)",
        code,
    )


def test_a_backup_of_other_bytes_is_named(tree: Tree) -> None:
    kernel = kernel_of(tree)
    apply(tree)
    backup = kernel.with_name(BACKUP)
    backup.chmod(0o644)
    other = b"other\n"
    backup.write_bytes(other)
    assert transaction.backup_verdict(kernel, record_of(kernel)) == (
        f"does not hold the recorded original (sha256 {sha256_bytes(other)[:16]}…, "
        f"recorded {BASE[:16]}…)"
    )


def test_under_the_lock_the_backup_is_read_from_the_locked_folder(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    with file_lock(kernel.parent):
        kernel.parent.rename(kernel.parent.with_name("moved"))
        kernel.parent.mkdir()
        kernel.with_name(BACKUP).write_bytes(b"a decoy at the old path\n")
        assert transaction._read_backup(kernel) == original


# --------------------------------------------------------------------------- the JIT cache


def test_apply_removes_the_racy_build_from_the_cache_it_is_given(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    tree = find_tree(tree_factory.installed("0.5.16", tmp_path / "full"))
    root = tmp_path / "cache"
    racy = lay_build(root, *real_dir(tree, "original", root))
    fixed = lay_build(root, *real_dir(tree, "no-init", root))
    done = transaction.apply_fix(tree, "no-init", Options(cache_dir=str(root)))
    assert (done.written, done.plan.action, done.cache_warning) == (True, "write", None)
    assert [(r.path, r.outcome) for r in done.removed] == [(racy, "removed")]
    assert not os.path.lexists(racy) and fixed.is_dir()
    assert transaction.drop_stale_builds(tree, str(root)) == ((), None)  # nothing stale left


def test_drop_stale_builds_reports_a_cache_it_cannot_clear(tree: Tree, tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"\xff\xd8")
    assert transaction.drop_stale_builds(tree, str(photos)) == (
        (),
        f"JIT cache not cleared: refusing to clear {photos}: not a TVM-FFI cache (no entry is a "
        "tvm-ffi build by its name and files)",
    )
    assert transaction.drop_stale_builds(tree, str(tmp_path / "none")) == ((), None)


def test_apply_fix_clears_the_cache_it_is_given(tree: Tree, tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"\xff\xd8")
    done = transaction.apply_fix(tree, "no-init", Options(cache_dir=str(photos)))
    assert (done.written, done.plan.action, done.removed) == (True, "write", ())
    assert sha256_bytes(kernel_of(tree).read_bytes()) == NO_INIT
    assert done.cache_warning == (
        f"JIT cache not cleared: refusing to clear {photos}: not a TVM-FFI cache (no entry is a "
        "tvm-ffi build by its name and files)"
    )


# --------------------------------------------------------------------------- found after the run


def test_a_switch_rolled_back_takes_the_previous_method(tree: Tree) -> None:
    """A structural no-init (written before the manifest knew its base), then a switch to the
    manifest's barrier killed before the kernel was replaced: the structural record comes back."""
    kernel = kernel_of(tree)
    apply(tree)
    record = pending(kernel, previous_variant="no-init", previous_sha256=NO_INIT,
                     previous_method="structural", variant="barrier", result_sha256=BARRIER)  # fmt: skip
    recover(kernel)
    assert record_of(kernel) == record._replace(
        state="applied", variant="no-init", result_sha256=NO_INIT, method="structural",
        previous_variant=None, previous_sha256=None, previous_method=None,
    )  # fmt: skip


def test_a_rewrite_that_fails_two_preconditions_names_both(tree: Tree) -> None:
    kernel = kernel_of(tree)
    text = kernel.read_bytes().replace(
        b"LaunchKernel(1, kMaxPrefillBatchSize, device)(plan_compress_prefill_kernel0",
        b"LaunchKernel(1, 512, device)(plan_compress_prefill_kernel0",
    )
    read = b"warp_min[warp_id] = warp::reduce_min(e_for_min);\n"
    head, tail = text.split(read, 1)
    kernel.write_bytes(head + read + tail.replace(b"  __syncthreads();\n", b"", 1))
    with pytest.raises(FatalError) as caught:
        transaction.plan_apply(inspect(tree), "no-init")
    assert (str(caught.value), caught.value.code) == (
        "rewritten kernel is not a safe no-init (one block of 1024 threads: launched as grid=1, "
        "block=512, __launch_bounds__(1024); barrier between per-warp writes and warp 0's read: "
        "no unconditional barrier before the read)",
        Exit.UNKNOWN,
    )


def _temp_of(name: str) -> Callable[[Path], object]:
    return lambda kernel: kernel.with_name(temp_name(name)).write_bytes(b"torn")


def _link_temp(kernel: Path) -> None:
    kernel.with_name(temp_name("c_plan.cuh")).symlink_to(kernel)


TORN: dict[str, tuple[Callable[[Path], object], bool]] = {
    "clean": (lambda kernel: None, False),
    "applied": (lambda kernel: None, False),  # (applied below)
    "pending record": (pending, True),
    "lone backup": (lambda kernel: kernel.with_name(BACKUP).write_bytes(b"x"), True),
    "kernel temp": (_temp_of("c_plan.cuh"), True),
    "record temp": (_temp_of(RECORD), True),
    "backup temp": (_temp_of(BACKUP), True),
    "temp name on a link": (_link_temp, False),
    "a user's temp": (lambda kernel: kernel.with_name(".c_plan.cuh.x.tmp").write_bytes(b""), False),
}


@pytest.mark.parametrize("case", TORN)
def test_torn_tells_what_recover_has_to_finish(tree: Tree, case: str) -> None:
    kernel = kernel_of(tree)
    if case in ("applied", "pending record"):
        apply(tree)
    setup, is_torn = TORN[case]
    setup(kernel)
    assert transaction.torn(kernel) is is_torn


def test_a_kernel_whose_folder_is_gone_is_not_torn(tmp_path: Path) -> None:
    assert transaction.torn(tmp_path / "gone" / "c_plan.cuh") is False


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` cannot be removed or replaced inside the block (chattr +i; root on ext4, xfs…)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("l", [0])
        try:
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
            flags[0] |= FS_IMMUTABLE_FL
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
        except OSError as e:
            pytest.skip(f"cannot make a file immutable here ({e.strerror})")
        try:
            yield
        finally:
            flags[0] &= ~FS_IMMUTABLE_FL
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
    finally:
        os.close(fd)


def test_a_revert_that_cannot_drop_the_record_is_finished_by_the_next_run(tree: Tree) -> None:
    kernel = kernel_of(tree)
    original = kernel.read_bytes()
    apply(tree)
    with immutable(kernel.with_name(RECORD)):
        e = raised(kernel, transaction.revert, kernel)
    assert (str(e), e.code) == (
        f"{kernel.parent}: cannot write (Operation not permitted); the next run finishes or "
        "rolls back",
        Exit.REFUSED,
    )
    assert kernel.read_bytes() == original and kernel.with_name(RECORD).is_file()
    assert transaction.torn(kernel) is False  # an applied record: only recovery looks closer
    recover(kernel)
    assert not kernel.with_name(RECORD).exists() and not kernel.with_name(BACKUP).exists()


def at_kernel_replace(monkeypatch: pytest.MonkeyPatch, hook: Callable[[], None]) -> None:
    """Run ``hook`` just before the kernel is replaced (the real ``os.replace`` still does it),
    as test_durability.py's spy does: the moment a kill would leave the pending record."""
    real = os.replace

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if dst == "c_plan.cuh":
            hook()
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


@as_root
def test_the_pending_record_has_the_kernel_owner(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = kernel_of(tree)
    os.chown(kernel, *OWNER)
    seen: list[tuple[int, int]] = []
    at_kernel_replace(monkeypatch, lambda: seen.append(owner(kernel.with_name(RECORD))))
    apply(tree)
    assert seen == [OWNER]


def test_a_record_that_cannot_be_marked_applied_is_finished_by_the_next_run(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = kernel_of(tree)
    stack = contextlib.ExitStack()
    at_kernel_replace(monkeypatch, lambda: stack.enter_context(immutable(kernel.with_name(RECORD))))
    plan = transaction.plan_apply(inspect(tree), "no-init")
    with stack:
        e = raised(kernel, transaction.commit_plan, kernel, plan)
    assert (str(e), e.code) == (
        f"{kernel.parent}: cannot write (Operation not permitted); the next run finishes or "
        "rolls back",
        Exit.REFUSED,
    )
    assert sha256_bytes(kernel.read_bytes()) == NO_INIT and record_of(kernel).state == "pending"
    recover(kernel)
    assert record_of(kernel).state == "applied"


@pytest.mark.parametrize("where", ["commit", "recover"])
def test_an_oversized_backup_in_the_way_is_refused(tree: Tree, where: str) -> None:
    kernel = kernel_of(tree)
    backup = kernel.with_name(BACKUP)
    backup.write_bytes(b"x" * (KERNEL_LIMIT + 1))
    plan = transaction.plan_apply(inspect(tree), "no-init")
    before = listing(kernel.parent)
    if where == "commit":
        e = raised(kernel, transaction.commit_plan, kernel, plan)
    else:  # a lone backup, looked at before anything else
        e = raised(kernel, transaction.recover, kernel)
    assert (str(e), e.code) == (
        f"{backup}: the backup is {KERNEL_LIMIT + 1} bytes, over the {KERNEL_LIMIT}-byte limit; "
        "not reading it",
        Exit.REFUSED,
    )
    assert listing(kernel.parent) == before


def test_an_oversized_kernel_at_commit_is_refused(tree: Tree) -> None:
    kernel = kernel_of(tree)
    plan = transaction.plan_apply(inspect(tree), "no-init")
    kernel.write_bytes(b"x" * (KERNEL_LIMIT + 1))
    assert refused(kernel, transaction.commit_plan, kernel, plan) == (
        f"{kernel}: the kernel is {KERNEL_LIMIT + 1} bytes, over the {KERNEL_LIMIT}-byte limit; "
        "not reading it",
        Exit.NOT_FOUND,
    )


def test_a_patch_that_misses_the_manifest_hash_is_an_internal_error(tree: Tree) -> None:
    text = kernel_of(tree).read_text()
    wrong = manifest.Result("0" * 64, RELEASE.results["no-init"].patch)
    release = RELEASE._replace(results={**RELEASE.results, "no-init": wrong})
    with pytest.raises(FatalError) as caught:
        transaction._from_manifest(text, release, "no-init")
    assert (str(caught.value), caught.value.code) == (
        f"patched kernel sha256 is not the manifest's {'0' * 64}",
        Exit.INTERNAL,
    )


@pytest.mark.parametrize("force", [False, True])
def test_apply_refuses_someone_else_s_uncommitted_change_unless_forced(
    tree_factory: TreeFactory, tmp_path: Path, force: bool
) -> None:
    git = find_tree(tree_factory.git("0.5.16", tmp_path / "co"))
    kernel = kernel_of(git)
    edited = kernel.read_bytes().replace(b"Stage A", b"Stage A (local note)", 1)
    kernel.write_bytes(edited)
    if force:
        done = transaction.apply_fix(git, "no-init", Options(), force=True, clear_cache=False)
        assert done.written and record_of(kernel).base_sha256 == sha256_bytes(edited)
        return
    for refuse in (
        lambda: transaction.apply_fix(git, "no-init", Options(), clear_cache=False),
        lambda: transaction.refuse_foreign_changes(git, inspect(git), Options()),  # apply --check
    ):
        with pytest.raises(FatalError) as caught:
            refuse()
        assert (str(caught.value), caught.value.code) == (
            "python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh has uncommitted changes not "
            "made by sglang-dsv4-fix; commit or stash them, or run: sglang-dsv4-fix apply --force",
            Exit.REFUSED,
        )
    assert kernel.read_bytes() == edited and provenance.read(kernel) is None


def test_a_kernel_gone_while_checked_is_refused(tree: Tree) -> None:
    kernel = kernel_of(tree)
    kernel.unlink()
    with pytest.raises(FatalError) as caught:
        transaction.check_writable(kernel, tree)
    assert (str(caught.value), caught.value.code) == (
        f"{kernel}: cannot check the kernel (No such file or directory); nothing changed",
        Exit.REFUSED,
    )


@pytest.mark.parametrize("step", ["recover", "revert", "commit_plan"])
def test_writing_without_the_lock_is_an_internal_error(tree: Tree, step: str) -> None:
    kernel = kernel_of(tree)
    plan = transaction.plan_apply(inspect(tree), "no-init")
    apply(tree)
    before = listing(kernel.parent)
    with pytest.raises(FatalError) as caught:
        if step == "commit_plan":
            transaction.commit_plan(kernel, plan)
        else:
            getattr(transaction, step)(kernel)
    assert (str(caught.value), caught.value.code) == (
        f"{kernel}: written without holding the folder lock",
        Exit.INTERNAL,
    )
    assert listing(kernel.parent) == before


def test_a_kernel_reached_through_a_linked_folder_is_refused(tree: Tree, tmp_path: Path) -> None:
    kernel = kernel_of(tree)
    outside = tmp_path / "outside"
    kernel.parent.rename(outside)
    kernel.parent.symlink_to(outside)
    with pytest.raises(FatalError) as caught:
        transaction.check_writable(kernel, tree)
    assert (str(caught.value), caught.value.code) == (
        f"{kernel}: resolves outside {tree.package_dir}; refusing",
        Exit.REFUSED,
    )


@pytest.mark.parametrize("bits", [0o644, 0o464, 0o446])
def test_a_kernel_writable_by_anyone_passes_the_check(tree: Tree, bits: int) -> None:
    kernel = kernel_of(tree)
    kernel.chmod(bits)
    transaction.check_writable(kernel, tree)  # raises FatalError if refused


def test_a_folder_this_user_cannot_write_is_refused(tree: Tree) -> None:
    kernel = kernel_of(tree)
    with immutable(kernel.parent), pytest.raises(FatalError) as caught:  # root too: EPERM
        transaction.check_writable(kernel, tree)
    assert (str(caught.value), caught.value.code) == (
        f"{kernel.parent}: the kernel's folder is not writable for this user; nothing changed",
        Exit.REFUSED,
    )


def slim(
    version: str, dest: Path, kernel: str = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
) -> Tree:
    return find_tree(extract(version, dest, (*SLIM[:3], kernel)))


def test_a_fix_this_tool_did_not_write_is_left_alone(tmp_path: Path) -> None:
    tree = slim("0.5.18", tmp_path / "sp", "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh")
    before = listing(kernel_of(tree).parent)
    done = apply(tree, "barrier")
    assert (done.written, done.plan.action, done.plan.message) == (
        False,
        "none",
        "already fixed (no-init, not written by this tool); nothing to do",
    )
    assert listing(kernel_of(tree).parent) == before


def test_bytes_of_several_releases_none_the_tree_s_name_no_release(tmp_path: Path) -> None:
    """0.5.12's kernel (also 0.5.12.post1's) in a 0.5.13 tree: the record names no release."""
    tree = slim("0.5.13", tmp_path / "sp")
    donor = slim("0.5.12", tmp_path / "donor")
    kernel_of(tree).write_bytes(kernel_of(donor).read_bytes())
    base = sha256_bytes(kernel_of(donor).read_bytes())
    done = apply(tree)
    result = manifest.load().releases["0.5.12"].results["no-init"].sha256
    assert done.plan.message == (
        f"known base (release 0.5.12, 0.5.12.post1); no-init -> sha256 {result[:16]}…"
    )
    record = record_of(kernel_of(tree))
    assert (record.base_release, record.base_sha256, record.result_sha256) == (None, base, result)


def test_a_damaged_record_decides_nothing(tree: Tree) -> None:
    kernel = kernel_of(tree)
    kernel.with_name(RECORD).write_text("{not json")
    with pytest.raises(FatalError) as caught:
        transaction.plan_apply(inspect(tree), "no-init")
    assert (str(caught.value), caught.value.code) == (
        f"{kernel.with_name(RECORD)}: damaged provenance record (not JSON: JSONDecodeError); "
        "not acting on it",
        Exit.UNKNOWN,
    )


def test_a_fixed_kernel_that_breaks_two_preconditions_is_not_touched(tmp_path: Path) -> None:
    tree = slim("0.5.18", tmp_path / "sp", "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh")
    kernel = kernel_of(tree)
    text = kernel.read_bytes().replace(
        b"LaunchKernel(1, kMaxPrefillBatchSize, device)(plan_compress_prefill_kernel0",
        b"LaunchKernel(1, 512, device)(plan_compress_prefill_kernel0",
    )
    read = b"warp_min[warp_id] = warp::reduce_min(e_for_min);\n"
    head, tail = text.split(read, 1)
    kernel.write_bytes(head + read + tail.replace(b"  __syncthreads();\n", b"", 1))
    before = listing(kernel.parent)
    with pytest.raises(FatalError) as caught:
        apply(tree)
    assert (str(caught.value), caught.value.code) == (
        "no-init kernel violates preconditions: one block of 1024 threads; barrier between "
        "per-warp writes and warp 0's read",
        Exit.UNKNOWN,
    )
    assert listing(kernel.parent) == before


@pytest.mark.parametrize("release", ["0.5.11", None])
def test_a_tree_without_the_planner_has_nothing_to_fix(tmp_path: Path, release: str | None) -> None:
    extract("0.5.11", tmp_path / "sp", ("sglang/__init__.py",))
    if release is None:  # no dist-info: the release is not known
        for info in (tmp_path / "sp").glob("sglang-*.dist-info"):
            shutil.rmtree(info)
    tree = find_tree(tmp_path / "sp")
    with pytest.raises(FatalError) as caught:
        transaction.kernel_of(tree)
    assert (str(caught.value), caught.value.code) == (
        f"{tree.package_dir}: NOT APPLICABLE: no DeepSeek-V4 planner in this tree "
        f"(release {release or 'unknown'}); not affected",
        Exit.NOT_APPLICABLE,
    )
