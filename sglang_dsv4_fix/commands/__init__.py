"""One module per subcommand; each exposes ``add_parser(sub)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


def columns() -> int:
    """``$COLUMNS``, else the terminal's width, else 80 (as ``shutil.get_terminal_size``)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, told its width: argparse builds one for every add_argument, and
    left to itself imports ``shutil`` (with bz2 and lzma) to ask, on every verify."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        super().__init__(
            prog, indent_increment, max_help_position, columns() - 2 if width is None else width
        )


def add_loudness(parser: argparse.ArgumentParser, default: Any = False) -> None:
    """``-q``/``-v``, before or after the subcommand (as pip and git take them)."""
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", default=default,
                      help="print only what is wrong (errors, failing trees)")  # fmt: skip
    loud.add_argument("-v", "--verbose", action="store_true", default=default,
                      help="also print the details behind each verdict")  # fmt: skip


@contextlib.contextmanager
def to_a_reader_who_may_leave() -> Iterator[None]:
    """Print the body's output; a reader that went away (``| head``) ends the output, never the
    exit code, and leaves no traceback.

    As the Python docs advise for SIGPIPE: stdout is pointed at /dev/null, so the interpreter's
    final flush of what is still buffered does not raise again at exit."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
