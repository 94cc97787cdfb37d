"""clear-cache: remove this tree's stale compress-plan JIT builds (--all: the whole TVM-FFI cache)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sglang_dsv4_fix import cacheclean, jitcache, jitnames, jitroot
from sglang_dsv4_fix.cacheclean import Removal
from sglang_dsv4_fix.commands._common import add_tree, command, emit, progress, tree_dict, tree_of
from sglang_dsv4_fix.errors import Exit, FatalError

HELP = """\
Default: remove only this tree's compress-plan builds that are not provably built from the
kernel's current bytes (the racy original after apply, the fix after revert, and on 0.5.12 any
build of this tree whose bytes cannot be told). Builds of other kernels and of other trees stay,
so the next server start recompiles one module (~9 s), not every JIT kernel.
--all removes every JIT build in the cache (what `rm -rf ~/.cache/tvm-ffi` did, done safely).
Only folders that are tvm-ffi builds by name and files go, only from a folder that holds one;
/, the home folder, an empty TVM_FFI_CACHE_DIR (the current folder to tvm-ffi) are refused; a
link goes only if it leads to a build (the link, never its target); a build being compiled
right now (its lock held) is left in place; others are renamed aside, then deleted. Anything
left that was asked for exits 6 with the reason."""


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="TVM-FFI cache (default: $TVM_FFI_CACHE_DIR, else ~/.cache/tvm-ffi)",
    )


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    """apply/revert: they clear this tree's stale planner builds after writing, unless told not."""
    add_cache_dir(parser)
    parser.add_argument(
        "--no-clear-cache",
        action="store_true",
        help="leave the JIT cache alone (default: remove this tree's stale compress-plan builds)",
    )


def add_parser(sub: Any) -> None:
    p = command(sub, "clear-cache", __doc__, HELP)
    add_tree(p)
    add_cache_dir(p)
    p.add_argument("--all", action="store_true", help="every build in the cache, all kernels")
    p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")


def run(args: argparse.Namespace) -> int:
    root = cacheclean.clear_root(args.cache_dir)
    tree = None if args.all and args.tree is None else tree_of(args)
    if root is None:
        return _report(args, tree, jitroot.cache_root(args.cache_dir), [], [], "no cache folder")
    builds = [] if tree is None else _builds(tree, root)
    stale = [] if tree is None or not builds else jitcache.stale_builds(tree, root)
    targets = cacheclean.whole_cache(root) if args.all else [b.path for b in stale]
    with progress(f"removing {len(targets)} build folder(s) from {root}", args):
        done = cacheclean.remove_entries(root, targets, dry_run=args.dry_run)
    return _report(args, tree, root, builds, done, "")


def after_kernel_change(
    tree: Any, old_sha256: str, new_sha256: str, args: argparse.Namespace
) -> list[Removal]:
    """apply/revert, after the kernel's bytes changed: drop this tree's stale planner builds
    (not the rest of the cache) unless ``--no-clear-cache``, and say so on stderr. Never fails
    the write: a refused or unreadable cache is a warning."""
    if getattr(args, "no_clear_cache", False) or old_sha256 == new_sha256:
        return []
    try:
        done = cacheclean.clear_stale(tree, getattr(args, "cache_dir", None))
    except (FatalError, OSError) as e:
        report_removals([], f"JIT cache not cleared: {e}")
        return []
    report_removals(done, None)
    return done


def report_removals(done: list[Removal], warning: str | None) -> None:
    """What clearing the cache after a write did, on stderr."""
    if warning:
        print(f"sglang-dsv4-fix: warning: {warning}", file=sys.stderr)
    for r in done:
        print(
            f"jit cache: {r.outcome}: {r.path}" + (f" ({r.detail})" if r.detail else ""),
            file=sys.stderr,
        )


def _builds(tree: Any, root: Path) -> list[jitcache.Build]:
    if jitnames.modelled_kernel(tree) is None:  # no planner, or SGLang's own cache (0.5.18+)
        return []
    return jitcache.inventory(tree, root)


def _report(
    args: argparse.Namespace,
    tree: Any,
    root: Path,
    builds: list[jitcache.Build],
    done: list[Removal],
    note: str,
) -> int:
    payload = {
        **(tree_dict(tree) if tree is not None else {}),
        "cache_dir": str(root),
        "all": args.all,
        "dry_run": args.dry_run,
        "builds": [b.to_dict() for b in builds],
        "removals": [{"path": str(r.path), "outcome": r.outcome, "detail": r.detail} for r in done],
        "note": note,
    }
    lines = [f"cache: {root}" + (f" ({note})" if note else "")]
    lines += [f"  build: {b.name}: {b.origin} ({b.detail})" for b in builds]
    lines += [
        f"  {r.outcome}: {r.path.name}" + (f" ({r.detail})" if r.detail else "") for r in done
    ]
    if not done and not note:
        lines.append("  nothing to remove")
    emit(args, payload, lines)
    return int(Exit.REFUSED if any(r.refused for r in done) else Exit.OK)
