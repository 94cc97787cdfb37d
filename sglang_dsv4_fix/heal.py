"""``SGLANG_DSV4_FIX_MODE=heal``: a racy tree fixes itself at the next server start.

SGLang compiles the planner from ``c_plan.cuh`` at its first JIT load, after plugins have run, so
a process that rewrites the file at start compiles the fixed kernel: no image rebuild, one restart.
Heal decides from the tree's one verdict (verdict.py) and writes through apply's own transaction
(``transaction.apply_fix``: lock, journal, atomic replace, provenance ``written_by: "plugin"``,
the stale planner build removed), all before ``load_plugins()`` returns. Many ranks start at once
on one tree: one writes, the others wait on the lock and then find the kernel final.

Where it cannot heal (a read-only image layer, an unknown or unsafe kernel, a foreign edit in a git
checkout), the status keeps the verdict's problem and exit code plus why healing was not possible,
and the plugin refuses to start exactly as ``enforce`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_dsv4_fix import transaction, verdict
from sglang_dsv4_fix.errors import FatalError
from sglang_dsv4_fix.fswrite import file_lock
from sglang_dsv4_fix.tree import Tree, find_tree

if TYPE_CHECKING:  # the plugin renders the status; heal only changes the tree beneath it
    from sglang_dsv4_fix.cacheclean import Removal
    from sglang_dsv4_fix.plugin import Status

HEALABLE = ("racy", "stale-build")  # the verdict's states heal fixes; the rest is enforce's


@dataclass(frozen=True)
class Healed:
    """What one heal did to a tree: ``wrote`` the plan's message if this process wrote the
    kernel, ``removed`` the planner builds it took out of the JIT cache, ``cache_warning`` why it
    could not clear the cache."""

    before: verdict.Verdict
    wrote: str | None = None
    removed: tuple[Removal, ...] = ()
    cache_warning: str | None = None

    @property
    def changed(self) -> bool:
        return self.wrote is not None or any(r.outcome == "removed" for r in self.removed)


def at_start(status: Status, inspect_tree: Callable[[Path], Status]) -> Status:
    """heal mode, in ``register()``: heal the tree if its verdict says how, and return the status
    the plugin renders (``healed`` set if this process changed the tree; ``problem`` kept, with
    why, if it could not heal). ``inspect_tree`` is the plugin's own: the tree is judged again."""
    tree = find_tree(Path(status.package_dir))
    if tree.kernel_path is None:
        return status
    if status.state not in HEALABLE and not _torn(tree.kernel_path):
        return _not_healed(status, _unhealable(status)) if status.problem else status
    why = unwritable(tree.kernel_path)
    if why is not None:
        return _not_healed(status, why) if status.problem else status
    try:
        done = heal_tree(tree, verdict.Options(tree=status.tree_arg))
    except (FatalError, OSError) as e:  # the transaction left the kernel whole: say what is there
        after = inspect_tree(Path(status.package_dir))
        return _not_healed(after, str(e)) if after.problem else after
    after = inspect_tree(Path(status.package_dir))
    if done.changed:
        after = after._replace(healed=healed_line(tree, done))
    if after.problem and done.cache_warning:
        return _not_healed(after, done.cache_warning)
    return after


def heal_tree(tree: Tree, opts: verdict.Options) -> Healed:
    """Fix what the verdict names: a racy kernel (apply's transaction, no-init), or a racy build
    left in the cache of a fixed one; a killed run's journal is finished either way."""
    assert tree.kernel_path is not None
    before = verdict.assess(tree, opts)
    if before.state == "racy":
        done = transaction.apply_fix(tree, "no-init", opts, written_by="plugin")
        wrote = done.plan.message if done.written else None
        return Healed(before, wrote, done.removed, done.cache_warning)
    with file_lock(tree.kernel_path.parent):  # a healer may be dropping the build right now
        transaction.recover(tree.kernel_path)
        now = verdict.assess(tree, opts)
        if now.state != "stale-build":
            return Healed(before)
        removed, warning = transaction.drop_stale_builds(tree, opts.cache_dir)
        return Healed(before, removed=removed, cache_warning=warning)


def unwritable(kernel: Path) -> str | None:
    """Why this process cannot replace the kernel (checked before taking any lock)."""
    folder = kernel.parent
    if os.access(folder, os.W_OK):
        return None
    return f"{folder} is not writable by this process (a read-only image layer or mount?)"


def healed_line(tree: Tree, done: Healed) -> str:
    """The one ERROR line saying what was healed."""
    parts = []
    if done.wrote is not None:
        sha = (done.before.sha256 or "")[:12]
        parts.append(
            f"{tree.kernel_path} was {done.before.variant} (sha256 {sha}, {verdict.PR}); "
            f"wrote the no-init fix through apply's transaction: {done.wrote}; "
            "provenance written_by=plugin, original kept for `sglang-dsv4-fix revert`"
        )
    names = ", ".join(r.path.name for r in done.removed if r.outcome == "removed")
    parts.append(f"stale planner builds removed from the JIT cache: {names or 'none'}")
    return "HEALED: " + "; ".join(parts)


def _torn(kernel: Path) -> bool:
    """A killed apply or heal left a journal to finish (a damaged record is not ours to fix)."""
    try:
        return transaction.torn(kernel)
    except (FatalError, OSError):
        return False


def _unhealable(status: Status) -> str:
    look = verdict.Options(tree=status.tree_arg).command("status")
    return f"heal rewrites only a racy-init kernel, this one is {status.state} (inspect: {look})"


def _not_healed(status: Status, why: str) -> Status:
    """The verdict's problem and exit code stand (enforce's); the line adds why and the fix."""
    fix = f" (fix: {status.fix})" if status.fix and status.fix not in (status.problem or "") else ""
    return status._replace(problem=f"{status.problem}; not healed: {why}{fix}")
