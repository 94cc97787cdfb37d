"""apply: rewrite the no-init fix (or the barrier control) into the tree's kernel."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import gitops, state, transaction, verdict
from sglang_dsv4_fix.commands._common import (
    add_dry_run,
    add_tree,
    command,
    emit,
    options,
    tree_dict,
    verdict_dict,
    writable_tree,
)
from sglang_dsv4_fix.commands.clear_cache import add_cache_options, report_removals
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fswrite import file_lock
from sglang_dsv4_fix.state import KernelState
from sglang_dsv4_fix.tree import Tree

HELP = """\
Known releases (0.5.12-0.5.17) get the shipped patch and must reach the manifest's exact sha256;
an unknown base (a fork) is rewritten structurally and must classify as a safe fix; its result's
sha256 is recorded, so `verify` pins it. Already fixed -> nothing written, exit 0. The original is
kept beside the kernel for `revert`, with a provenance record that `status` and the plugin read.
--dry-run (alias --check) runs every check apply runs (dirty git file, read-only, symlink,
--commit's git identity) and exits with the code apply would, writing nothing."""


def add_parser(sub: Any) -> None:
    p = command(sub, "apply", __doc__, HELP)
    add_tree(p)
    p.add_argument(
        "--variant",
        choices=("no-init", "barrier"),
        default="no-init",
        help="no-init: the upstream fix (default); barrier: the A/B control",
    )
    add_dry_run(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="git checkout: patch even if the kernel has uncommitted changes not made by us",
    )
    p.add_argument(
        "--commit",
        action="store_true",
        help="git checkout: commit just the kernel, citing sgl-project/sglang#32467",
    )
    add_cache_options(p)


def run(args: argparse.Namespace) -> int:
    tree, kernel = writable_tree(args)
    current = state.inspect(tree)
    before = verdict.assess(tree, options(args), current)
    plan = transaction.plan_apply(current, args.variant)
    torn = transaction.torn(kernel)
    if plan.action == "write" or torn:
        _refusals(args, tree, current, plan)
    if args.check or (plan.action == "none" and not torn):
        return _report(args, tree, plan, before, written=False)
    done = transaction.apply_fix(
        tree, args.variant, options(args), force=args.force, clear_cache=not args.no_clear_cache
    )
    report_removals(list(done.removed), done.cache_warning)
    sha = _commit(tree, done.plan) if done.written and args.commit else None
    return _report(args, tree, done.plan, before, done.written, list(done.removed), sha)


def _refusals(args: argparse.Namespace, tree: Tree, current: KernelState, plan: Any) -> None:
    """Everything that makes apply refuse (6) before it writes; --check runs it too."""
    assert tree.kernel_path is not None
    transaction.check_writable(tree.kernel_path, tree)
    if plan.action != "write":
        return
    if args.check:  # a real apply checks this under the lock, where another apply's write is seen
        transaction.refuse_foreign_changes(tree, current, options(args), args.force)
    if args.commit:
        assert tree.git_root is not None
        gitops.check_identity(tree.git_root)


def _commit(tree: Tree, plan: transaction.Plan) -> str:
    """Commit just the kernel; if git refuses, put the kernel and the index back (exit 6)."""
    assert tree.git_root is not None and tree.kernel_relpath is not None
    assert tree.kernel_path is not None and plan.record is not None
    r = plan.record
    message = gitops.apply_message(r.variant, r.base_release, r.base_sha256, r.result_sha256)
    try:
        return gitops.commit(tree.git_root, tree.kernel_relpath, message)
    except FatalError as e:
        with file_lock(tree.kernel_path.parent):
            transaction.revert(tree.kernel_path)
        raise FatalError(f"{e}; the kernel and the index were restored", Exit.REFUSED) from e


def _report(
    args: argparse.Namespace,
    tree: Tree,
    plan: transaction.Plan,
    before: verdict.Verdict,
    written: bool,
    removed: list[Any] | None = None,
    sha: str | None = None,
) -> int:
    if args.check and plan.action == "write":
        verb = "would write"
    else:
        verb = "wrote" if written else "no change"
    payload = {
        **tree_dict(tree),
        "action": plan.action,
        "written": written,
        "message": plan.message,
        "variant": args.variant,
        "check": args.check,
        "result_sha256": plan.record.result_sha256 if plan.record else None,
        "before": verdict_dict(before),
        "headline": before.headline,
        "exit": int(Exit.OK),
        "cache_removed": [str(r.path) for r in removed or []],
        "commit": sha,
    }
    lines = [f"{tree.kernel_path}: {verb}: {plan.message}"]
    if args.check or args.verbose:
        lines.insert(0, f"{tree.kernel_path}: now: {before.headline}")
    emit(args, payload, lines)
    return int(Exit.OK)
