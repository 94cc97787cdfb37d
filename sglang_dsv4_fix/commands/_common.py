"""Options and output shared by the subcommands, and the loop that runs one over many trees."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sglang_dsv4_fix.commands import Formatter, add_loudness, to_a_reader_who_may_leave
from sglang_dsv4_fix.error_handler import error_handler, most_severe
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.tree import Tree, find_tree
from sglang_dsv4_fix.verdict import Options, Verdict


def command(sub: Any, name: str, doc: str, details: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser: one-line help from the module docstring ("name: help"), details below."""
    summary = doc.split(": ", 1)[1].strip()
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=f"{summary}\n\n{details}" if details else summary,
        formatter_class=Formatter,
    )
    add_loudness(p, argparse.SUPPRESS)  # after the command; else the top-level default stands
    return p


def add_tree(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tree",
        metavar="PATH",
        action="append",
        dest="trees",
        help="SGLang tree: a git checkout, its python/ folder, a site-packages folder or the sglang "
        "package folder (default: the sglang this Python would import)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (an array of them, one per tree, with several --tree)",
    )


def add_dry_run(parser: argparse.ArgumentParser) -> None:
    """``--dry-run`` everywhere; ``--check`` kept as its alias (what apply first called it)."""
    parser.add_argument(
        "--dry-run",
        "--check",
        dest="check",
        action="store_true",
        help="run every check, say what would happen, write nothing (--check: the same)",
    )


def tree_of(args: argparse.Namespace) -> Tree:
    return find_tree(args.tree)


def writable_tree(args: argparse.Namespace) -> tuple[Tree, Path]:
    """The tree ``apply``/``revert`` will write, and its kernel; ``--commit`` outside a git
    checkout is refused (6) here, before anything is read or written."""
    from sglang_dsv4_fix.transaction import kernel_of

    tree = tree_of(args)
    kernel = kernel_of(tree)
    if args.commit and tree.kind != "git":
        raise FatalError(f"--commit needs a git checkout; {tree.root} is not one", Exit.REFUSED)
    return tree, kernel


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


def verdict_dict(v: Verdict) -> dict[str, Any]:
    """The verdict as every ``--json`` gives it."""
    return {
        "state": v.state,
        "exit": int(v.exit),
        "headline": v.headline,
        "variant": v.variant,
        "sha256": v.sha256,
        "pinned_by": v.pinned_by,
        "problems": [p._asdict() for p in v.problems],
        "notes": list(v.notes),
        "fix": v.fix,
        "stale_builds": list(v.stale_builds),
    }


class Output:
    """What one call prints: text per tree as it is judged, JSON once at the end."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.payloads: list[dict[str, Any]] = []
        self.lines: list[str] = []

    def flush(self, show: bool) -> None:
        if show:
            with to_a_reader_who_may_leave():
                for line in self.lines:
                    print(line)
        self.lines = []

    def dump(self, several: bool) -> None:
        import json  # only for --json

        if not self.payloads:
            return
        body: Any = self.payloads if several else self.payloads[0]
        with to_a_reader_who_may_leave():
            json.dump(body, sys.stdout, indent=2, sort_keys=True, default=str)
            sys.stdout.write("\n")


def emit(args: argparse.Namespace, payload: dict[str, Any], lines: Iterable[str]) -> None:
    out: Output | None = getattr(args, "output", None)
    if out is None:  # a command run outside run_trees: print at once
        out = Output(args.json)
        emit_to(out, payload, lines)
        out.flush(True)
        out.dump(False)
        return
    emit_to(out, payload, lines)


def emit_to(out: Output, payload: dict[str, Any], lines: Iterable[str]) -> None:
    if out.as_json:
        out.payloads.append(payload)
    else:
        out.lines.extend(lines)


def run_trees(prog: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run the command once per ``--tree`` (in order); exit with the most severe code.

    A tree that fails (not found, refused) is reported and the next one still runs; Ctrl-C stops.
    """
    names: list[str | None] = list(getattr(args, "trees", None) or [None])
    several = len(names) > 1
    args.output = out = Output(getattr(args, "json", False))
    codes: list[int] = []
    for name in names:
        args.tree = name if hasattr(args, "trees") else getattr(args, "tree", None)
        what = {"command": args.command, "tree": args.tree}
        rerun = options(args).command(args.command) if hasattr(args, "trees") else None
        with error_handler(prog, what if out.as_json else None, out.payloads.append, rerun) as r:
            r[0] = int(run(args))
        codes.append(r[0])
        out.flush(show=not getattr(args, "quiet", False) or r[0] != 0)
        if r[0] == 130:
            break
    out.dump(several)
    return most_severe(codes)


@contextlib.contextmanager
def progress(
    what: str, args: argparse.Namespace | None = None, after: float = 2.0
) -> Iterator[None]:
    """While the body runs past ``after`` seconds, a ``what… 12 s`` line on stderr, redrawn each
    second and erased at the end; on a terminal only (never in a pipe or a log), not with -q."""
    stream = sys.stderr
    if not stream.isatty() or (args is not None and getattr(args, "quiet", False)):
        yield
        return
    import threading  # only on a terminal

    done = threading.Event()
    start = time.monotonic()

    def draw() -> None:
        if done.wait(after):
            return
        while True:
            stream.write(f"\r{what}… {time.monotonic() - start:.0f} s\x1b[K")
            stream.flush()
            if done.wait(1.0):
                stream.write("\r\x1b[K")
                stream.flush()
                return

    painter = threading.Thread(target=draw, daemon=True)
    painter.start()
    try:
        yield
    finally:
        done.set()
        painter.join()


def options(args: argparse.Namespace) -> Options:
    """The verdict's options from a command's flags (the ones it does not have keep defaults)."""
    return Options(
        tree=getattr(args, "tree", None),
        cache_dir=getattr(args, "cache_dir", None),
        strict=getattr(args, "strict", False),
        require_variant=getattr(args, "require_variant", None),
        allow_not_applicable=getattr(args, "allow_not_applicable", False),
        check_cache=not getattr(args, "ignore_cache", False),
    )


def verdict_lines(where: object, v: Verdict) -> list[str]:
    """A verdict as text: the headline, then one indented line per note."""
    return [f"{where}: {v.headline}", *(f"  note: {n}" for n in v.notes)]
