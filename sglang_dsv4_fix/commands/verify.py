"""verify: exit 0 only if the tree's kernel is fixed (for CI gates and image builds)."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import state
from sglang_dsv4_fix.commands._common import add_tree, command, emit, tree_dict, tree_of
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.state import KernelState

HELP = """\
exit codes: 0 fixed (on a known release: the exact sha256 of its fix or of an upstream-fixed
release); 1 racy kernel; 3 unknown kernel, drifted from its release, or a violated precondition;
4 no DeepSeek-V4 planner in the tree (0 with --allow-not-applicable); 11 fixed but not the
--require-variant; 2 bad usage. See the README for the full table."""


def add_parser(sub: Any) -> None:
    p = command(sub, "verify", __doc__, HELP)
    add_tree(p)
    p.add_argument(
        "--require-variant",
        choices=("no-init", "barrier"),
        help="also fail (11) unless the kernel is this variant",
    )
    p.add_argument(
        "--allow-not-applicable",
        action="store_true",
        help="pass (0) a tree without the planner, e.g. SGLang <= 0.5.11",
    )
    p.add_argument(
        "--ignore-cache",
        action="store_true",
        help="do not fail (5) on racy builds in the JIT cache",
    )
    p.add_argument("--cache-dir", metavar="DIR", help="TVM-FFI cache (default: as SGLang finds it)")


def run(args: argparse.Namespace) -> int:
    tree = tree_of(args)
    if tree.kernel_path is None:
        code = Exit.OK if args.allow_not_applicable else Exit.NOT_APPLICABLE
        message = "not applicable: no DeepSeek-V4 planner in this tree"
        emit(
            args,
            {**tree_dict(tree), "verdict": "not-applicable", "exit": int(code), "message": message},
            [f"{tree.package_dir}: {message}"],
        )
        return int(code)
    current = state.inspect(tree)
    code, message = judge(current, args.require_variant)
    if code == Exit.OK and not args.ignore_cache:
        from sglang_dsv4_fix.jitcache import stale_message

        stale = stale_message(tree, args.cache_dir)
        code, message = (Exit.STALE_BUILD, stale) if stale else (code, message)
    emit(
        args,
        {**tree_dict(tree), **current.to_dict(), "exit": int(code), "message": message},
        [f"{tree.kernel_path}: {message}"],
    )
    return int(code)


def judge(current: KernelState, required: str | None) -> tuple[Exit, str]:
    v = current.verdict
    if v.variant == "unknown":
        return Exit.UNKNOWN, f"UNKNOWN: kernel0 not recognised ({v.reason})"
    if v.variant == "racy-init":
        return Exit.VULNERABLE, "VULNERABLE: racy-init kernel0 (run: sglang-dsv4-fix apply)"
    if not v.preconditions_ok:
        failed = "; ".join(f"{p.name} ({p.detail})" for p in v.preconditions if not p.ok)
        return Exit.UNKNOWN, f"UNSAFE: {v.variant} but preconditions violated: {failed}"
    if current.drift:
        return Exit.UNKNOWN, f"DRIFTED: {current.drift}"
    if required and v.variant != required:
        return Exit.WRONG_VARIANT, f"WRONG VARIANT: {v.variant}, required {required}"
    return Exit.OK, f"OK: {v.variant} (sha256 {current.sha256[:16]}…)"
