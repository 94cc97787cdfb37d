"""Options and output shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from sglang_dsv4_fix.tree import Tree, find_tree
from sglang_dsv4_fix.verdict import Options, Verdict


def command(sub: Any, name: str, doc: str, details: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser: one-line help from the module docstring ("name: help"), details below."""
    summary = doc.split(": ", 1)[1].strip()
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=f"{summary}\n\n{details}" if details else summary,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_tree(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tree",
        metavar="PATH",
        help="SGLang tree: a git checkout, its python/ folder, a site-packages folder or the sglang "
        "package folder (default: the sglang this Python would import)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def tree_of(args: argparse.Namespace) -> Tree:
    return find_tree(args.tree)


def tree_dict(tree: Tree) -> dict[str, Any]:
    return {
        "tree": str(tree.root),
        "kind": tree.kind,
        "package": str(tree.package_dir),
        "release": tree.release,
        "release_source": tree.release_source,
        "layout": tree.layout,
        "kernel": None if tree.kernel_path is None else str(tree.kernel_path),
        "git_root": None if tree.git_root is None else str(tree.git_root),
    }


def emit(args: argparse.Namespace, payload: dict[str, Any], lines: Iterable[str]) -> None:
    if args.json:
        json.dump(payload, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        for line in lines:
            print(line)


def options(args: argparse.Namespace) -> Options:
    """The verdict's options from a command's flags (the ones it does not have keep defaults)."""
    return Options(
        tree=args.tree,
        cache_dir=getattr(args, "cache_dir", None),
        strict=getattr(args, "strict", False),
        require_variant=getattr(args, "require_variant", None),
        allow_not_applicable=getattr(args, "allow_not_applicable", False),
        check_cache=not getattr(args, "ignore_cache", False),
    )


def verdict_lines(where: object, v: Verdict) -> list[str]:
    """A verdict as text: the headline, then one indented line per note."""
    return [f"{where}: {v.headline}", *(f"  note: {n}" for n in v.notes)]
