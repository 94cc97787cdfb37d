"""verify: exit 0 only if the tree's kernel is fixed (for CI gates and image builds)."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import verdict
from sglang_dsv4_fix.commands._common import (
    add_tree,
    command,
    emit,
    options,
    tree_dict,
    tree_of,
    verdict_dict,
    verdict_lines,
)
from sglang_dsv4_fix.tree import Tree

HELP = """\
exit codes: 0 verified (the sha256 of a release's fix, of an upstream-fixed release, or of what
sglang-dsv4-fix wrote), fixed-unpinned or edited-since (a safe fix we cannot pin: 3 with --strict);
1 racy; 3 unknown kernel0 or violated preconditions; 4 no DeepSeek-V4 planner (0 with
--allow-not-applicable); 5 a racy planner build still in the JIT cache; 11 not the
--require-variant; 2 bad usage. See the README's verdict table."""


def add_parser(sub: Any) -> None:
    p = command(sub, "verify", __doc__, HELP)
    add_tree(p)
    p.add_argument(
        "--strict",
        action="store_true",
        help="also fail (3) a safe fix whose sha256 nothing pins (fixed-unpinned, edited-since)",
    )
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
    v = verdict.assess(tree, options(args))
    where = tree.kernel_path or tree.package_dir
    lines = verdict_lines(where, v)
    if args.verbose:
        lines += _details(tree, v)
    emit(args, {**tree_dict(tree), **verdict_dict(v)}, lines)
    return int(v.exit)


def _details(tree: Tree, v: verdict.Verdict) -> list[str]:
    """-v: what the verdict rests on."""
    out = [
        f"  tree: {tree.root} ({tree.kind}); release {tree.release or 'unknown'} "
        f"(from {tree.release_source}); layout {tree.layout or '-'}",
        f"  state: {v.state} (exit {int(v.exit)}); variant {v.variant}; sha256 {v.sha256 or '-'}",
    ]
    if v.pinned_by:
        out.append(f"  pinned by: {v.pinned_by}")
    out += [f"  problem: {p.kind}: {p.message}" for p in v.problems]
    if v.fix:
        out.append(f"  fix: {v.fix}")
    return out
