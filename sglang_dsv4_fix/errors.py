"""Exit codes and the one handler that turns expected failures into a one-line message."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class Exit:
    """Documented exit codes (README, 'Exit codes'). Never renumber: CI gates depend on them.

    Plain ``int`` constants, not an ``enum.IntEnum``: building the enum class was half of this
    module's import (0.27 ms on the CI-class machine), and the plugin imports it in every SGLang
    process (docs/plugin.md, "Cost"). Nothing here needs an enum's names or iteration.
    """

    OK = 0
    VULNERABLE = 1  # the kernel is the racy variant
    USAGE = 2  # bad flags (argparse) or a bad flag combination
    UNKNOWN = 3  # kernel not recognised, drifted from its release, or preconditions violated
    NOT_APPLICABLE = 4  # the tree has no DeepSeek-V4 planner (SGLang <= 0.5.11)
    STALE_BUILD = 5  # tree fixed, but a racy JIT build is still in the cache
    REFUSED = 6  # apply/revert/clear-cache refused to touch something; nothing changed
    NOT_FOUND = 7  # no SGLang tree or kernel where one was named
    REPRO_FAILED = 8  # the GPU harness saw a bad plan or a hazard on a fixed variant
    ENVIRONMENT = 9  # a required tool is missing (GPU, nvcc, compute-sanitizer)
    FINDINGS = 10  # scan-logs found failure signatures
    WRONG_VARIANT = 11  # fixed, but not the variant --require-variant asks for
    INTERNAL = 70  # a bug in sglang-dsv4-fix: please report it
    INTERRUPTED = 130  # Ctrl-C


class FatalError(Exception):
    """An expected failure: one line for the operator and the exit code that classifies it."""

    def __init__(self, message: str, code: int = Exit.REFUSED) -> None:
        super().__init__(message)
        self.code = code


# The order in which one call's per-tree results outrank each other (most severe first): what
# endangers a server (a bug, racy, unknown, a stale racy build) before what leaves a tree
# unchecked or untouched (not found, refused), before what is safe but not as asked.
SEVERITY: tuple[int, ...] = (
    Exit.INTERRUPTED,
    Exit.INTERNAL,
    Exit.VULNERABLE,
    Exit.UNKNOWN,
    Exit.REPRO_FAILED,
    Exit.STALE_BUILD,
    Exit.FINDINGS,
    Exit.ENVIRONMENT,
    Exit.NOT_FOUND,
    Exit.REFUSED,
    Exit.WRONG_VARIANT,
    Exit.NOT_APPLICABLE,
    Exit.USAGE,
    Exit.OK,
)


def most_severe(codes: Iterable[int]) -> int:
    """The exit code of a call that produced ``codes`` (one per tree); 0 for none."""
    rank = {int(code): i for i, code in enumerate(SEVERITY)}
    return min(codes, key=lambda c: rank.get(c, 0), default=int(Exit.OK))


@contextmanager
def error_handler(
    prog: str,
    as_json: dict[str, object] | None = None,
    sink: Callable[[dict[str, object]], None] | None = None,
    rerun: str | None = None,
) -> Iterator[list[int]]:
    """Run the body; map FatalError, Ctrl-C and bugs to their exit codes in ``result[0]``.

    With ``as_json`` (the command's ``--json``: what it was asked to inspect), an error is also
    given as one JSON object, to ``sink`` or else printed on stdout, so a caller parsing stdout
    always gets one. ``rerun``: the user's own command, added to a message that says "run again".
    """
    result = [int(Exit.OK)]
    try:
        yield result
    except FatalError as e:
        message = str(e)
        if rerun and message.endswith("run again"):
            message += f": {rerun}"
        _fail(prog, f"error: {message}", int(e.code), result, as_json, sink)
    except KeyboardInterrupt:
        _fail(prog, "interrupted", int(Exit.INTERRUPTED), result, as_json, sink)
    except Exception as e:  # a bug: a short report, never a silent success
        _fail(prog, f"internal error: {type(e).__name__}: {e}", int(Exit.INTERNAL), result, as_json, sink)  # fmt: skip
        import traceback  # only for a bug: its import costs a plain verify ~2 ms

        traceback.print_exc(limit=4, file=sys.stderr)


def _fail(
    prog: str,
    message: str,
    code: int,
    result: list[int],
    as_json: dict[str, object] | None,
    sink: Callable[[dict[str, object]], None] | None,
) -> None:
    print(f"{prog}: {message}", file=sys.stderr)
    result[0] = code
    if as_json is None:
        return
    payload = {**as_json, "exit": code, "error": message.split(": ", 1)[-1]}
    if sink is not None:
        sink(payload)
        return
    import json

    print(json.dumps(payload, indent=2, sort_keys=True, default=str))
