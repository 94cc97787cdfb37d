"""revert: restore the original kernel byte for byte (only if it is what we wrote)."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import gitops, provenance, transaction
from sglang_dsv4_fix.commands._common import (
    add_dry_run,
    add_tree,
    command,
    emit,
    tree_dict,
    writable_tree,
)
from sglang_dsv4_fix.commands.clear_cache import add_cache_options, after_kernel_change
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import KERNEL_LIMIT, sha256_file
from sglang_dsv4_fix.fswrite import file_lock
from sglang_dsv4_fix.tree import Tree

HELP = """\
--commit (git checkout) commits the restored kernel; it is refused before anything is written on
a tree that is not a git checkout or when git has no identity, and if git refuses the commit (a
hook) the patched kernel, its record and the index are put back (exit 6). --dry-run runs the same
checks and says what would happen, writing nothing."""


def add_parser(sub: Any) -> None:
    p = command(sub, "revert", __doc__, HELP)
    add_tree(p)
    add_dry_run(p)
    p.add_argument("--commit", action="store_true", help="git checkout: commit the restored kernel")
    add_cache_options(p)


def run(args: argparse.Namespace) -> int:
    tree, kernel = writable_tree(args)
    record = provenance.read(kernel)
    if record is not None:
        _refusals(args, tree, kernel)
    if args.check:
        return _report(args, tree, record is not None, _would(kernel, record), dry=True)
    with file_lock(kernel.parent) as folder:
        transaction.recover(kernel)
        record = provenance.read(kernel)  # again: another apply or revert may have run meanwhile
        patched = folder.read(kernel.name, KERNEL_LIMIT, "kernel") if record is not None else b""
        message = transaction.revert(kernel)
    if record is not None:
        if args.commit:
            _commit(tree, record, patched)
        _after_write(tree, record, args)
    return _report(args, tree, record is not None, message, dry=False)


def _refusals(args: argparse.Namespace, tree: Tree, kernel: Any) -> None:
    """What makes revert refuse (6) before it writes anything; --dry-run runs it too."""
    transaction.check_writable(kernel, tree)
    if args.commit:
        assert tree.git_root is not None
        gitops.check_identity(tree.git_root)


def _would(kernel: Any, record: provenance.Provenance | None) -> str:
    """What revert would say, checking the same two things it checks before restoring."""
    if record is None:
        return "nothing to revert: the kernel was not patched by sglang-dsv4-fix"
    transaction.revertible(kernel, record, sha256_file(kernel))
    return f"would restore the original kernel (sha256 {record.base_sha256[:16]}…)"


def _after_write(tree: Tree, record: provenance.Provenance, args: argparse.Namespace) -> None:
    """Drop the now-stale JIT build of this kernel (the fixed one, after a revert)."""
    after_kernel_change(tree, record.result_sha256, record.base_sha256, args)


def _commit(tree: Tree, record: provenance.Provenance, patched: bytes) -> None:
    """Commit the restored kernel; if git refuses, put the patched kernel, its record and the
    index back (exit 6), as apply does for its own commit."""
    assert tree.git_root is not None and tree.kernel_relpath is not None
    assert tree.kernel_path is not None
    try:
        gitops.commit(tree.git_root, tree.kernel_relpath, gitops.revert_message(record.base_sha256))
    except FatalError as e:
        plan = transaction.Plan("write", "restore the patched kernel", patched,
                                record._replace(state="pending"))  # fmt: skip
        with file_lock(tree.kernel_path.parent):
            transaction.commit_plan(tree.kernel_path, plan)
        raise FatalError(
            f"{e}; the patched kernel and the index were restored", Exit.REFUSED
        ) from e


def _report(args: argparse.Namespace, tree: Tree, had_record: bool, message: str, dry: bool) -> int:
    assert tree.kernel_path is not None
    payload = {
        **tree_dict(tree),
        "reverted": had_record and not dry,
        "would_revert": had_record and dry,
        "check": dry,
        "message": message,
    }
    emit(args, payload, [f"{tree.kernel_path}: {message}"])
    return int(Exit.OK)
