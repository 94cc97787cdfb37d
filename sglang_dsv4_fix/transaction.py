"""Apply and revert as transactions: lock, journal, atomic replace, record; recover a torn run.

Write order (each step atomic): backup of the original -> record in state "pending" -> kernel
replaced -> record "applied". A variant switch computes the new variant from the backup in memory
and replaces the kernel once: the racy original is never written back on the way. A run killed
anywhere leaves the kernel the original, the old variant or the new one, and the next run under
the lock finishes or rolls back the pending record by comparing hashes.

All file work under the lock goes through the ``Folder`` that ``fswrite.file_lock`` holds (a
descriptor, ``dir_fd=``), never through the kernel's path, so a folder swapped for a symbolic link
mid-run cannot redirect a write outside the tree.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_dsv4_fix import __version__, manifest, patching, provenance, verdict
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import KERNEL_LIMIT, held, read_regular, sha256_bytes
from sglang_dsv4_fix.fswrite import Folder, atomic_write, file_lock, is_our_temp, remove
from sglang_dsv4_fix.kernel import FIXED
from sglang_dsv4_fix.provenance import Provenance
from sglang_dsv4_fix.rewrite import Target, rewrite
from sglang_dsv4_fix.state import KernelState, inspect
from sglang_dsv4_fix.tree import Tree

if TYPE_CHECKING:
    from sglang_dsv4_fix.cacheclean import Removal
    from sglang_dsv4_fix.verdict import Options


@dataclass(frozen=True)
class Plan:
    """What apply would do, decided before anything is written."""

    action: str  # "write" or "none"
    message: str
    new_data: bytes = b""
    record: Provenance | None = None
    replaces_sha256: str = ""  # the kernel's bytes the write replaces (checked under the lock)
    replaces_record: Provenance | None = None  # a switch: the record it replaces (for rollback)


def kernel_of(tree: Tree) -> Path:
    """The kernel apply/revert would write; a tree without one fails in the verdict's words."""
    if tree.kernel_path is None:
        headline = verdict.not_applicable_headline(tree)
        raise FatalError(f"{tree.package_dir}: {headline}", Exit.NOT_APPLICABLE)
    return tree.kernel_path


def check_writable(kernel: Path, tree: Tree) -> None:
    try:
        _check_writable(kernel, tree)
    except OSError as e:  # the kernel or its folder vanished or changed while we looked
        raise FatalError(
            f"{kernel}: cannot check the kernel ({e.strerror}); nothing changed", Exit.REFUSED
        ) from e


def _check_writable(kernel: Path, tree: Tree) -> None:
    if kernel.is_symlink():
        raise FatalError(
            f"{kernel}: is a symbolic link; refusing to write through it", Exit.REFUSED
        )
    if not kernel.resolve().is_relative_to(tree.package_dir):
        raise FatalError(f"{kernel}: resolves outside {tree.package_dir}; refusing", Exit.REFUSED)
    if not kernel.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise FatalError(f"{kernel}: is read-only; make it writable to patch it", Exit.REFUSED)
    if os.statvfs(kernel.parent).f_flag & os.ST_RDONLY:
        raise FatalError(
            f"{kernel.parent}: is on a read-only file system; nothing changed", Exit.REFUSED
        )
    if not os.access(kernel.parent, os.W_OK | os.X_OK):
        raise FatalError(
            f"{kernel.parent}: the kernel's folder is not writable for this user; nothing changed",
            Exit.REFUSED,
        )


# ---------------------------------------------------------------- planning (read-only)


def plan_apply(state: KernelState, target: Target) -> Plan:
    if state.record_damage:  # never decide anything from a record that fails validation
        raise FatalError(state.record_damage, Exit.UNKNOWN)
    variant, fixed = state.variant, state.variant in FIXED
    if variant == target and state.safe:
        return Plan("none", f"already fixed ({target}); nothing to do")
    if fixed and state.safe and not state.ours:
        return Plan("none", f"already fixed ({variant}, not written by this tool); nothing to do")
    if fixed and state.ours:
        return _switch(state, target)
    c = state.classification
    if variant == "unknown":
        raise FatalError(f"kernel0 not recognised: {c.reason}; nothing written", Exit.UNKNOWN)
    if fixed:
        failed = "; ".join(p.name for p in c.preconditions if not p.ok)
        raise FatalError(f"{variant} kernel violates preconditions: {failed}", Exit.UNKNOWN)
    return _patch(state, state.text, state.sha256, target)


def _switch(state: KernelState, target: Target) -> Plan:
    """The other variant, made from the backup in memory: one replace of our old variant."""
    record = state.record
    assert record is not None and state.tree.kernel_path is not None
    original = original_bytes(state.tree.kernel_path, record)
    plan = _patch(state, original.decode("utf-8"), record.base_sha256, target)
    assert plan.record is not None
    pending = plan.record._replace(
        previous_variant=record.variant,
        previous_sha256=record.result_sha256,
        previous_method=record.method,
    )
    return replace(plan, record=pending, replaces_sha256=state.sha256, replaces_record=record)


def _patch(state: KernelState, text: str, base_sha: str, target: Target) -> Plan:
    m = manifest.load()
    bases = m.bases(base_sha, state.tree.layout)
    if bases and target in bases[0].results:
        new, method = _from_manifest(text, bases[0], target), "manifest-patch"
        names = ", ".join(r.version for r in bases)
        note = f"known base (release {names})"
    else:
        new, method = rewrite(text, target).encode("utf-8"), "structural"
        note = f"base is unknown (sha256 {base_sha[:16]}…): rewrote kernel0 structurally"
        _require_safe(new, target)
    record = _record(state, bases, base_sha, new, target, method)
    message = f"{note}; {target} -> sha256 {record.result_sha256[:16]}…"
    return Plan("write", message, new, record, replaces_sha256=base_sha)


def _from_manifest(text: str, base: manifest.Release, target: str) -> bytes:
    result = base.results[target]
    git_path = f"python/{base.path}"
    new = patching.apply(text, manifest.patch_text(result.patch), git_path).encode("utf-8")
    if sha256_bytes(new) != result.sha256:
        raise FatalError(
            f"patched kernel sha256 is not the manifest's {result.sha256}", Exit.INTERNAL
        )
    return new


def _require_safe(new: bytes, target: str) -> None:
    from sglang_dsv4_fix.kernel import classify

    after = classify(new.decode("utf-8"))
    if after.variant != target or not after.safe:
        failed = "; ".join(f"{p.name}: {p.detail}" for p in after.preconditions if not p.ok)
        raise FatalError(
            f"rewritten kernel is not a safe {target} ({failed or after.reason})", Exit.UNKNOWN
        )


def _record(
    state: KernelState,
    bases: list[manifest.Release],
    base_sha: str,
    new: bytes,
    target: str,
    method: str,
) -> Provenance:
    assert state.tree.kernel_path is not None
    # One known base names the release; several (0.5.12 and 0.5.12.post1 share bytes): the tree's
    # if it is one of them; none (unknown base): the tree's.
    names = [r.version for r in bases]
    release = names[0] if len(names) == 1 else state.tree.release
    if len(names) > 1 and release not in names:
        release = None
    return Provenance(
        state="pending",
        variant=target,
        method=method,
        base_release=release,
        base_sha256=base_sha,
        result_sha256=sha256_bytes(new),
        tool_version=__version__,
        time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        kernel=state.tree.kernel_path.name,
        backup=provenance.backup_path(state.tree.kernel_path).name,
    )


# ---------------------------------------------------------------- the backup


def revertible(kernel: Path, record: Provenance, current_sha256: str) -> bytes:
    """The original to restore, if the kernel (``current_sha256``) is exactly what we wrote and
    the backup holds the original the record names; else refuse (6). ``revert`` and its dry run."""
    if current_sha256 != record.result_sha256:
        raise FatalError(
            f"{kernel}: sha256 {current_sha256[:16]}… is not what sglang-dsv4-fix wrote "
            f"({record.result_sha256[:16]}…); refusing to revert someone else's change",
            Exit.REFUSED,
        )
    return original_bytes(kernel, record)


def original_bytes(kernel: Path, record: Provenance) -> bytes:
    """The backup's bytes, only if they are the original the (validated) record names."""
    why = backup_verdict(kernel, record)
    if why is not None:
        raise FatalError(f"{provenance.backup_path(kernel)}: {why}; refusing", Exit.REFUSED)
    return _read_backup(kernel)


def backup_verdict(kernel: Path, record: Provenance) -> str | None:
    """None if the backup beside ``kernel`` holds the original ``record`` names, else why not.

    The record is validated (``provenance.read``): for a manifest-patch its base is the manifest's
    original of that release; for a structural rewrite, the sha256 the record wrote.
    """
    try:
        data = _read_backup(kernel)
    except FatalError as e:
        return str(e).removeprefix(f"{provenance.backup_path(kernel)}: ")
    if sha256_bytes(data) != record.base_sha256:
        return (
            f"does not hold the recorded original (sha256 {sha256_bytes(data)[:16]}…, "
            f"recorded {record.base_sha256[:16]}…)"
        )
    return None


def _read_backup(kernel: Path) -> bytes:
    folder = held(kernel.parent)
    name = provenance.backup_path(kernel).name
    if folder is not None:
        return folder.read(name, KERNEL_LIMIT, "backup")
    return read_regular(provenance.backup_path(kernel), KERNEL_LIMIT, "backup", follow=False)


# ---------------------------------------------------------------- under the lock


def _folder(kernel: Path) -> Folder:
    folder = held(kernel.parent)
    if folder is None:
        raise FatalError(f"{kernel}: written without holding the folder lock", Exit.INTERNAL)
    return folder


def _kernel_bytes(folder: Folder, kernel: Path) -> tuple[bytes, os.stat_result]:
    data = folder.read(kernel.name, KERNEL_LIMIT, "kernel", Exit.NOT_FOUND)
    st = folder.stat(kernel.name)
    assert st is not None
    return data, st


def _owner(st: os.stat_result) -> tuple[int, int]:
    return st.st_uid, st.st_gid


Undo = list[Callable[[], None]]
LATER = "the next run finishes or rolls back"


@contextlib.contextmanager
def _writing(path: Path, undo: Undo | None = None) -> Iterator[None]:
    """An OSError the operator can cause (read-only or full file system, EFBIG, permissions)
    becomes one line and exit 6, after undoing the steps in ``undo``; without ``undo`` the run
    has already changed something that recovery completes."""
    try:
        yield
    except OSError as e:
        clean = undo is not None and _undo(undo)
        tail = "nothing changed" if clean else LATER
        raise FatalError(f"{path}: cannot write ({e.strerror}); {tail}", Exit.REFUSED) from e


def _undo(steps: Undo) -> bool:
    ok = True
    for step in reversed(steps):
        try:
            step()
        except OSError:
            ok = False
    return ok


def recover(kernel: Path) -> None:
    """Finish what a killed apply or revert left behind (call under the lock).

    Kernel == recorded result: the write landed, mark the record applied. Kernel == the bytes a
    pending switch replaces: it never landed, restore the old record. Kernel == recorded base:
    the write never landed (apply) or the restore did (revert): drop record and backup.
    """
    folder = _folder(kernel)
    with _writing(folder.path):
        for tmp in stale_temps(folder, kernel):  # a killed write's temp file (we hold the lock)
            folder.unlink(tmp)
        record = provenance.read(kernel)
        current = sha256_bytes(_kernel_bytes(folder, kernel)[0])
        if record is None:
            _drop_lone_backup(folder, kernel, current)
            return
        _resolve(folder, kernel, record, current)


def _drop_lone_backup(folder: Folder, kernel: Path, current: str) -> None:
    name = provenance.backup_path(kernel).name
    if not folder.is_file(name):
        return
    if sha256_bytes(folder.read(name, KERNEL_LIMIT, "backup")) == current:
        folder.unlink(name)  # killed before the record was written, or after revert dropped it


def _resolve(folder: Folder, kernel: Path, record: Provenance, current: str) -> None:
    pending = record.state == "pending"
    if pending and current == record.result_sha256:
        write_record(kernel, _applied(record), _owner_of(folder, kernel))
    elif pending and record.previous_sha256 is not None and current == record.previous_sha256:
        write_record(kernel, _rolled_back(record), _owner_of(folder, kernel))
    elif current == record.base_sha256:
        discard_record(kernel)
    elif pending:
        raise FatalError(
            f"{kernel}: changed during an interrupted apply; inspect by hand", Exit.REFUSED
        )


def _applied(record: Provenance) -> Provenance:
    return record._replace(
        state="applied", previous_variant=None, previous_sha256=None, previous_method=None
    )


def _rolled_back(record: Provenance) -> Provenance:
    assert record.previous_variant and record.previous_sha256 and record.previous_method
    return _applied(
        record._replace(
            variant=record.previous_variant,
            result_sha256=record.previous_sha256,
            method=record.previous_method,
        )
    )


def _owner_of(folder: Folder, kernel: Path) -> tuple[int, int] | None:
    st = folder.stat(kernel.name)
    return None if st is None else _owner(st)


def stale_temps(folder: Folder, kernel: Path) -> list[str]:
    """Temp files a killed write of ours left: our exact name shape, regular files only."""
    names = (kernel.name, provenance.record_path(kernel).name, provenance.backup_path(kernel).name)
    return [
        entry
        for entry in folder.names()
        if any(is_our_temp(entry, n) for n in names) and folder.is_file(entry)
    ]


def torn(kernel: Path) -> bool:
    """A killed run left something for ``recover``: a pending record, a temp file, a lone backup."""
    record = provenance.read(kernel)
    lone_backup = record is None and provenance.backup_path(kernel).is_file()
    if lone_backup or (record and record.state == "pending"):
        return True
    return _has_stale_temps(kernel)


def _has_stale_temps(kernel: Path) -> bool:
    names = (kernel.name, provenance.record_path(kernel).name, provenance.backup_path(kernel).name)
    try:
        entries = os.listdir(kernel.parent)
    except OSError:
        return False
    return any(
        is_our_temp(e, n) and (kernel.parent / e).is_file() and not (kernel.parent / e).is_symlink()
        for e in entries
        for n in names
    )


def commit_plan(kernel: Path, plan: Plan) -> None:
    """Carry out a write plan: backup, journal, replace, record (call under the lock)."""
    assert plan.record is not None
    folder = _folder(kernel)
    current, st = _kernel_bytes(folder, kernel)
    if sha256_bytes(current) != (plan.replaces_sha256 or plan.record.base_sha256):
        raise FatalError(f"{kernel}: changed while planning; run again", Exit.REFUSED)
    owner = _owner(st)
    undo: Undo = []
    with _writing(folder.path, undo):
        _ensure_backup(folder, kernel, plan, current, owner, undo)
        write_record(kernel, plan.record, owner)
        undo.append(_restore_record(kernel, plan.replaces_record, owner))
        folder.write(kernel.name, plan.new_data, stat.S_IMODE(st.st_mode), owner)
    with _writing(folder.path):  # the kernel landed: from here recovery rolls forward
        write_record(kernel, _applied(plan.record), owner)


def _ensure_backup(
    folder: Folder,
    kernel: Path,
    plan: Plan,
    current: bytes,
    owner: tuple[int, int],
    undo: Undo,
) -> None:
    assert plan.record is not None
    name = provenance.backup_path(kernel).name
    if plan.replaces_record is not None:  # a switch: the backup must still be the original
        if sha256_bytes(folder.read(name, KERNEL_LIMIT, "backup")) != plan.record.base_sha256:
            raise FatalError(
                f"{folder.path / name}: does not hold the recorded original; refusing",
                Exit.REFUSED,
            )
        return
    base = plan.record.base_sha256
    if folder.is_file(name) and sha256_bytes(folder.read(name, KERNEL_LIMIT, "backup")) == base:
        return
    folder.write(name, current, 0o444, owner)
    undo.append(lambda: folder.unlink(name))


def _restore_record(
    kernel: Path, previous: Provenance | None, owner: tuple[int, int]
) -> Callable[[], None]:
    folder = _folder(kernel)
    name = provenance.record_path(kernel).name
    if previous is None:
        return lambda: folder.unlink(name)
    return lambda: write_record(kernel, previous, owner)


def revert(kernel: Path) -> str:
    """Restore the backup if the kernel is exactly what we wrote (call under the lock)."""
    folder = _folder(kernel)
    record = provenance.read(kernel)
    if record is None:
        return "nothing to revert: the kernel was not patched by sglang-dsv4-fix"
    data, st = _kernel_bytes(folder, kernel)
    original = revertible(kernel, record, sha256_bytes(data))
    with _writing(folder.path, []):
        folder.write(kernel.name, original, stat.S_IMODE(st.st_mode), _owner(st))
    with _writing(folder.path):
        discard_record(kernel)
    return f"restored the original kernel (sha256 {record.base_sha256[:16]}…)"


# --------------------------------------------------------------------------- apply, whole


@dataclass(frozen=True)
class Applied:
    """What :func:`apply_fix` did: the plan it carried out (or found nothing to do for), the
    stale planner builds it removed from the JIT cache, and why it could not clear the cache."""

    plan: Plan
    written: bool
    removed: tuple[Removal, ...] = ()
    cache_warning: str | None = None


def apply_fix(
    tree: Tree,
    variant: Target,
    opts: Options,
    *,
    force: bool = False,
    written_by: str = "cli",
    clear_cache: bool = True,
) -> Applied:
    """Apply's transaction, used by ``apply`` and the plugin's heal mode: under the lock on the
    kernel's folder, finish a killed run, plan again, refuse a foreign edit, write (backup,
    journal, replace, record) and drop the now-stale planner build. All before the lock is
    released, so a process waiting on it finds the kernel and the cache final."""
    kernel = kernel_of(tree)
    check_writable(kernel, tree)
    with file_lock(kernel.parent):
        recover(kernel)
        current = inspect(tree)
        plan = plan_apply(current, variant)
        if plan.action != "write":
            return Applied(plan, written=False)
        refuse_foreign_changes(tree, current, opts, force)
        assert plan.record is not None
        plan = replace(plan, record=plan.record._replace(written_by=written_by))
        commit_plan(kernel, plan)
        if not clear_cache:
            return Applied(plan, written=True)
        removed, warning = drop_stale_builds(tree, opts.cache_dir)
    return Applied(plan, True, removed, warning)


def drop_stale_builds(tree: Tree, cache_dir: str | None) -> tuple[tuple[Removal, ...], str | None]:
    """This tree's stale planner builds removed, and why the cache could not be cleared (None:
    it could). A cache that cannot be cleared never fails the kernel's write."""
    from sglang_dsv4_fix import cacheclean

    try:
        return tuple(cacheclean.clear_stale(tree, cache_dir)), None
    except (FatalError, OSError) as e:
        return (), f"JIT cache not cleared: {e}"


def refuse_foreign_changes(
    tree: Tree, current: KernelState, opts: Options, force: bool = False
) -> None:
    """A git checkout's kernel with uncommitted changes we did not make: refuse (6) unless forced.
    Call under the lock: outside it, another apply's write looks like a foreign change."""
    if tree.kind != "git" or force:
        return
    from sglang_dsv4_fix import gitops

    assert tree.git_root is not None and tree.kernel_relpath is not None
    if gitops.uncommitted(tree.git_root, tree.kernel_relpath) and not current.ours:
        raise FatalError(
            f"{tree.kernel_relpath} has uncommitted changes not made by sglang-dsv4-fix; "
            f"commit or stash them, or run: {opts.command('apply', '--force')}",
            Exit.REFUSED,
        )


# --------------------------------------------------------------------------- the record's writes


def write_record(kernel: Path, record: Provenance, owner: tuple[int, int] | None = None) -> None:
    """Our provenance record beside ``kernel`` (read by provenance.py, written only here)."""
    data = (json.dumps(record._asdict(), indent=2, sort_keys=True) + "\n").encode("utf-8")
    folder = held(kernel.parent)
    if folder is None:
        atomic_write(provenance.record_path(kernel), data, mode=0o644)
    else:
        folder.write(provenance.record_path(kernel).name, data, 0o644, owner)


def discard_record(kernel: Path) -> None:
    folder = held(kernel.parent)
    if folder is None:
        remove(provenance.record_path(kernel))
        remove(provenance.backup_path(kernel))
        return
    _discard_in(folder, kernel)


def _discard_in(folder: Folder, kernel: Path) -> None:
    folder.unlink(provenance.record_path(kernel).name)
    folder.unlink(provenance.backup_path(kernel).name)
