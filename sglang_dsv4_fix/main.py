"""Command line: parse, dispatch, map errors to exit codes. Nothing heavy is imported here."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from sglang_dsv4_fix import __version__
from sglang_dsv4_fix.commands import Formatter, add_loudness

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
    "report": "report",
}

# Commands that take --tree several times (one result per tree, the most severe exit code).
MANY_TREES = ("apply", "verify", "revert", "status")

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
    "report": "one table of the fleet's planner kernels from the plugin's JSON-lines report files",
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Find, fix, verify and report the DeepSeek-V4 prefill-planner race "
        "(sgl-project/sglang#32467) in an SGLang tree.",
        epilog="Exit codes are listed in the README ('Exit codes').",
        formatter_class=Formatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"{PROG} {__version__}")
    add_loudness(parser)
    # prog given: argparse would otherwise build a help formatter (and import shutil) to name it
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, prog=PROG)
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


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse; an error in a subcommand's arguments is reported with that subcommand's usage."""
    completing = _completion_words()
    chosen = _chosen(argv if completing is None else completing)
    parser = build_parser(chosen)
    if completing is not None:
        _complete(parser)
    args, extra = parser.parse_known_args(argv)
    own = _subparser(parser, args.command)
    if extra:
        message = f"unrecognized arguments: {' '.join(extra)}"
        bare = next((a for a in extra if not a.startswith("-")), None)
        if bare is not None and _takes_tree(own):
            message += f" (did you mean --tree {bare}?)"
        own.error(message)
    if len(getattr(args, "trees", None) or ()) > 1 and args.command not in MANY_TREES:
        own.error(f"--tree: {args.command} takes one tree (several: {', '.join(MANY_TREES)})")
    return args


def _completion_words() -> list[str] | None:
    """The words of the line being completed, when the shell asks argcomplete (else None)."""
    import os

    if "_ARGCOMPLETE" not in os.environ:
        return None
    import shlex

    line = os.environ.get("COMP_LINE", "")[: int(os.environ.get("COMP_POINT", "0") or 0) or None]
    try:
        return shlex.split(line)[1:]
    except ValueError:  # an open quote
        return line.split()[1:]


def _complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion through argcomplete, if installed (the ``completion`` extra); it exits."""
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = action.choices[name]
    return found


def _takes_tree(parser: argparse.ArgumentParser) -> bool:
    return any("--tree" in a.option_strings for a in parser._actions)


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args = parse(list(sys.argv[1:] if argv is None else argv))
    from sglang_dsv4_fix.commands._common import run_trees

    return run_trees(PROG, _load(COMMANDS[args.command]).run, args)
