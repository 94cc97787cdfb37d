"""apply: rewrite the no-init fix (or the barrier control) into the tree's kernel."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import gitops, jitcache, state, transaction
from sglang_dsv4_fix.commands._common import add_tree, command, emit, tree_dict, tree_of
from sglang_dsv4_fix.commands.clear_cache import add_cache_options
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import file_lock
from sglang_dsv4_fix.tree import Tree

HELP = """\
Known releases (0.5.12-0.5.17) get the shipped patch and must reach the manifest's exact sha256;
an unknown base (a fork) is rewritten structurally and must classify as a safe fix. Already fixed
-> nothing written, exit 0. The original is kept beside the kernel for `revert`, with a
provenance record that `status` and the runtime plugin read."""


def add_parser(sub: Any) -> None:
    p = command(sub, "apply", __doc__, HELP)
    add_tree(p)
    p.add_argument(
        "--variant",
        choices=("no-init", "barrier"),
        default="no-init",
        help="no-init: the upstream fix (default); barrier: the A/B control",
    )
    p.add_argument(
        "--check", action="store_true", help="dry run: say what would happen, write nothing"
    )
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
    tree = tree_of(args)
    kernel = transaction.kernel_of(tree)
    plan = transaction.plan_apply(state.inspect(tree), args.variant)
    if args.check or (plan.action == "none" and not transaction.torn(kernel)):
        return _report(args, tree, plan, written=False)
    transaction.check_writable(kernel, tree)
    with file_lock(kernel.parent):
        transaction.recover(kernel)
        plan = transaction.plan_apply(state.inspect(tree), args.variant)  # again, under the lock
        if plan.action == "write":
            # Under the lock: outside it, another apply's write looks like a foreign change.
            _refuse_foreign_changes(args, tree)
            transaction.commit_plan(kernel, plan)
            _after_write(tree, plan, args)
    if plan.action == "write" and args.commit:
        _commit(tree, plan)
    return _report(args, tree, plan, written=plan.action == "write")


def _refuse_foreign_changes(args: argparse.Namespace, tree: Tree) -> None:
    if tree.kind != "git" or args.force:
        return
    assert tree.git_root is not None and tree.kernel_relpath is not None
    current = state.inspect(tree)
    if gitops.uncommitted(tree.git_root, tree.kernel_relpath) and not current.ours:
        raise FatalError(
            f"{tree.kernel_relpath} has uncommitted changes not made by sglang-dsv4-fix; "
            "commit or stash them, or pass --force",
            Exit.REFUSED,
        )


def _after_write(tree: Tree, plan: transaction.Plan, args: argparse.Namespace) -> None:
    """Drop the now-stale JIT build of this kernel (the racy one, after a fix)."""
    assert plan.record is not None
    jitcache.after_kernel_change(tree, plan.record.base_sha256, plan.record.result_sha256, args)


def _commit(tree: Tree, plan: transaction.Plan) -> None:
    if tree.kind != "git" or tree.git_root is None or tree.kernel_relpath is None:
        raise FatalError(
            "--commit needs a git checkout; the kernel was patched, not committed", Exit.REFUSED
        )
    r = plan.record
    assert r is not None
    message = gitops.apply_message(r.variant, r.base_release, r.base_sha256, r.result_sha256)
    gitops.commit(tree.git_root, tree.kernel_relpath, message)


def _report(args: argparse.Namespace, tree: Tree, plan: transaction.Plan, written: bool) -> int:
    verb = (
        "would write"
        if args.check and plan.action == "write"
        else ("wrote" if written else "no change")
    )
    payload = {
        **tree_dict(tree),
        "action": plan.action,
        "written": written,
        "message": plan.message,
        "variant": args.variant,
        "check": args.check,
        "result_sha256": plan.record.result_sha256 if plan.record else None,
    }
    emit(args, payload, [f"{tree.kernel_path}: {verb}: {plan.message}"])
    return int(Exit.OK)
