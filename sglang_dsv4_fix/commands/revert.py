"""revert: restore the original kernel byte for byte (only if it is what we wrote)."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import gitops, provenance, transaction
from sglang_dsv4_fix.commands._common import add_tree, command, emit, tree_dict, tree_of
from sglang_dsv4_fix.commands.clear_cache import add_cache_options, after_kernel_change
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import file_lock


def add_parser(sub: Any) -> None:
    p = command(sub, "revert", __doc__)
    add_tree(p)
    p.add_argument("--commit", action="store_true", help="git checkout: commit the restored kernel")
    add_cache_options(p)


def run(args: argparse.Namespace) -> int:
    tree = tree_of(args)
    kernel = transaction.kernel_of(tree)
    record = provenance.read(kernel)
    if record is not None:
        transaction.check_writable(kernel, tree)
    with file_lock(kernel.parent):
        transaction.recover(kernel)
        record = provenance.read(kernel)
        message = transaction.revert(kernel)
    if record is not None:
        _after_write(tree, record, args)
        if args.commit:
            _commit(tree, record.base_sha256)
    emit(
        args,
        {**tree_dict(tree), "reverted": record is not None, "message": message},
        [f"{kernel}: {message}"],
    )
    return int(Exit.OK)


def _after_write(tree: Any, record: provenance.Provenance, args: argparse.Namespace) -> None:
    """Drop the now-stale JIT build of this kernel (the fixed one, after a revert)."""
    after_kernel_change(tree, record.result_sha256, record.base_sha256, args)


def _commit(tree: Any, base_sha: str) -> None:
    if tree.kind != "git":
        raise FatalError(
            "--commit needs a git checkout; the kernel was restored, not committed", Exit.REFUSED
        )
    gitops.commit(tree.git_root, tree.kernel_relpath, gitops.revert_message(base_sha))
