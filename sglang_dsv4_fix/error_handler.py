"""The one handler: expected failures, Ctrl-C and bugs become a one-line message and an exit code.

The CLI's alone (commands/_common.py), kept out of errors.py, which every SGLang process imports
with the plugin (docs/plugin.md, "Cost").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from sglang_dsv4_fix.errors import Exit, FatalError

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
