"""Apply and revert as transactions: lock, journal, atomic replace, record; recover a torn run.

Write order (each step atomic): backup of the original -> record in state "pending" -> kernel
replaced -> record "applied". A run killed anywhere leaves the kernel either original or patched,
and the next run under the lock finishes or discards the pending record by comparing hashes.
"""

from __future__ import annotations

import datetime
import glob
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_dsv4_fix import __version__, manifest, patching, provenance
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import atomic_write, remove, sha256_bytes, sha256_file
from sglang_dsv4_fix.kernel import FIXED
from sglang_dsv4_fix.provenance import Provenance
from sglang_dsv4_fix.rewrite import Target, rewrite
from sglang_dsv4_fix.state import KernelState
from sglang_dsv4_fix.tree import Tree


@dataclass(frozen=True)
class Plan:
    """What apply would do, decided before anything is written."""

    action: str  # "write" or "none"
    message: str
    new_data: bytes = b""
    record: Provenance | None = None
    restore_first: bool = False  # ours, but the other variant: go back to the original first


def kernel_of(tree: Tree) -> Path:
    if tree.kernel_path is None:
        raise FatalError(
            f"{tree.package_dir}: no DeepSeek-V4 planner (deepseek_v4/c_plan.cuh) in this tree "
            f"(release {tree.release or 'unknown'}); nothing to fix",
            Exit.NOT_APPLICABLE,
        )
    return tree.kernel_path


def check_writable(kernel: Path, tree: Tree) -> None:
    if kernel.is_symlink():
        raise FatalError(
            f"{kernel}: is a symbolic link; refusing to write through it", Exit.REFUSED
        )
    if not kernel.resolve().is_relative_to(tree.package_dir):
        raise FatalError(f"{kernel}: resolves outside {tree.package_dir}; refusing", Exit.REFUSED)
    if not kernel.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise FatalError(f"{kernel}: is read-only; make it writable to patch it", Exit.REFUSED)


def plan_apply(state: KernelState, target: Target) -> Plan:
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
    assert state.record is not None and state.tree.kernel_path is not None
    original = provenance.backup_path(state.tree.kernel_path).read_bytes()
    if sha256_bytes(original) != state.record.base_sha256:
        raise FatalError(
            f"{provenance.backup_path(state.tree.kernel_path)}: does not hold the recorded original; refusing",
            Exit.REFUSED,
        )
    plan = _patch(state, original.decode("utf-8"), state.record.base_sha256, target)
    return replace(plan, restore_first=True)


def _patch(state: KernelState, text: str, base_sha: str, target: Target) -> Plan:
    m = manifest.load()
    bases = m.bases(base_sha, state.tree.layout)
    if bases and target in bases[0].results:
        new, method = _from_manifest(state, text, bases[0], target), "manifest-patch"
        names = ", ".join(r.version for r in bases)
        note = f"known base (release {names})"
    else:
        new, method = rewrite(text, target).encode("utf-8"), "structural"
        note = f"base is unknown (sha256 {base_sha[:16]}…): rewrote kernel0 structurally"
        _require_safe(new, target)
    record = _record(state, bases, base_sha, new, target, method)
    return Plan("write", f"{note}; {target} -> sha256 {record.result_sha256[:16]}…", new, record)


def _from_manifest(state: KernelState, text: str, base: manifest.Release, target: str) -> bytes:
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
    # One known base names the release; several (0.5.12 and 0.5.12.post1 share bytes) or none: the tree's.
    release = bases[0].version if len(bases) == 1 else state.tree.release
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


def recover(kernel: Path) -> None:
    """Finish what a killed apply or revert left behind (call under the lock).

    Kernel == recorded result: the write landed, mark the record applied. Kernel == recorded
    base: the write never landed (apply) or the restore did (revert): drop record and backup.
    """
    record = provenance.read(kernel)
    for tmp in _stale_temps(kernel):  # a killed atomic_write's temp file (we hold the lock)
        remove(tmp)
    if record is None:
        backup = provenance.backup_path(kernel)
        if backup.is_file() and sha256_file(backup) == sha256_file(kernel):
            remove(backup)  # killed before the record was written, or after revert dropped it
        return
    current = sha256_file(kernel)
    if current == record.result_sha256 and record.state == "pending":
        provenance.write(kernel, replace(record, state="applied"))
    elif current == record.base_sha256:
        provenance.discard(kernel)
    elif record.state == "pending":
        raise FatalError(
            f"{kernel}: changed during an interrupted apply; inspect by hand", Exit.REFUSED
        )


def _stale_temps(kernel: Path) -> list[Path]:
    names = (kernel, provenance.record_path(kernel), provenance.backup_path(kernel))
    return [t for n in names for t in kernel.parent.glob(f".{glob.escape(n.name)}.*.tmp")]


def torn(kernel: Path) -> bool:
    """A killed run left something for ``recover``: a pending record, a temp file, a lone backup."""
    record = provenance.read(kernel)
    lone_backup = record is None and provenance.backup_path(kernel).is_file()
    return bool(lone_backup or (record and record.state == "pending") or _stale_temps(kernel))


def commit_plan(kernel: Path, plan: Plan) -> None:
    """Carry out a write plan: backup, journal, replace, record (call under the lock)."""
    assert plan.record is not None
    backup = provenance.backup_path(kernel)
    if plan.restore_first:
        atomic_write(kernel, backup.read_bytes())
    original = kernel.read_bytes()
    if sha256_bytes(original) != plan.record.base_sha256:
        raise FatalError(f"{kernel}: changed while planning; run again", Exit.REFUSED)
    if not backup.exists() or sha256_file(backup) != plan.record.base_sha256:
        atomic_write(backup, original, mode=0o444)
    provenance.write(kernel, plan.record)
    atomic_write(kernel, plan.new_data)
    provenance.write(kernel, replace(plan.record, state="applied"))


def revert(kernel: Path) -> str:
    """Restore the backup if the kernel is exactly what we wrote (call under the lock)."""
    record = provenance.read(kernel)
    if record is None:
        return "nothing to revert: the kernel was not patched by sglang-dsv4-fix"
    current = sha256_file(kernel)
    if current != record.result_sha256:
        raise FatalError(
            f"{kernel}: sha256 {current[:16]}… is not what sglang-dsv4-fix wrote "
            f"({record.result_sha256[:16]}…); refusing to revert someone else's change",
            Exit.REFUSED,
        )
    backup = provenance.backup_path(kernel).read_bytes()
    if sha256_bytes(backup) != record.base_sha256:
        raise FatalError(
            f"{provenance.backup_path(kernel)}: does not hold the recorded original; refusing",
            Exit.REFUSED,
        )
    atomic_write(kernel, backup)
    provenance.discard(kernel)
    return f"restored the original kernel (sha256 {record.base_sha256[:16]}…)"
