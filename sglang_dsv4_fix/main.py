"""Command line: parse, dispatch, map errors to exit codes. Nothing heavy is imported here."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from sglang_dsv4_fix import __version__
from sglang_dsv4_fix.errors import error_handler

PROG = "sglang-dsv4-fix"

# Subcommand name -> module in sglang_dsv4_fix.commands, imported only when chosen.
COMMANDS: dict[str, str] = {
    "apply": "apply",
    "verify": "verify",
    "revert": "revert",
    "status": "status",
    "clear-cache": "clear_cache",
    "prewarm": "prewarm",
    "repro": "repro",
    "scan-logs": "scan_logs",
}

# One-line help shown in `sglang-dsv4-fix --help` without importing every command module.
SUMMARIES: dict[str, str] = {
    "apply": "rewrite the no-init fix (or the barrier control) into the tree's kernel",
    "verify": "exit 0 only if the tree's kernel is fixed (for CI gates and image builds)",
    "revert": "restore the original kernel byte for byte (only if it is what we wrote)",
    "status": "one screen: tree, release, kernel, variant, preconditions, provenance",
    "clear-cache": "remove this tree's stale compress-plan JIT builds (--all: the whole cache)",
    "prewarm": "compile the fixed planner into the JIT cache under the loader's own name",
    "repro": "build the kernel variants and hunt the race on this GPU (racecheck, latency)",
    "scan-logs": "find the race's failure signatures in SGLang logs (files or -)",
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Find, fix, verify and report the DeepSeek-V4 prefill-planner race "
        "(sgl-project/sglang#32467) in an SGLang tree.",
        epilog="Exit codes are listed in the README ('Exit codes').",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        if name == chosen:
            _load(module).add_parser(sub)
        else:
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


def _load(module: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"sglang_dsv4_fix.commands.{module}")


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand: the first word that is not an option (global options take no value)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args_in = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen(args_in)
    args = build_parser(chosen).parse_args(args_in)
    as_json = {"command": args.command, "tree": getattr(args, "tree", None)}
    with error_handler(PROG, as_json if getattr(args, "json", False) else None) as result:
        result[0] = int(_load(COMMANDS[args.command]).run(args))
    return result[0]
