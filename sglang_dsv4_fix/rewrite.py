"""Structural rewrite of a racy-init kernel0 into the no-init fix or the barrier control.

Used for bases the manifest does not know (forks) and by ``backport/`` to generate the per-release
patches. Works on whole lines of the original text, so comments, indentation and CRLF line endings
outside the edited lines survive byte for byte.
"""

from __future__ import annotations

from typing import Literal

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.kernel import Kernel0, ParseError, classify, matching, open_blocks, parse

Target = Literal["no-init", "barrier"]


def rewrite(text: str, variant: Target) -> str:
    """``text`` with kernel0 turned into ``variant``; the result is re-classified before return."""
    before = classify(text)
    if before.variant != "racy-init":
        raise FatalError(
            f"cannot rewrite: kernel0 is {before.variant} ({before.reason})", Exit.UNKNOWN
        )
    try:
        first, last = init_lines(parse(text))
    except ParseError as e:
        raise FatalError(f"cannot rewrite: {e}", Exit.UNKNOWN) from e
    lines = text.split("\n")
    out = _drop(lines, first, last) if variant == "no-init" else _barrier(lines, last)
    result = "\n".join(out)
    _check(result, variant)
    return result


def init_lines(k: Kernel0) -> tuple[int, int]:
    """First and last line (0-based) of the init statement(s), which must own those lines."""
    spans = sorted({_statement_span(k, a.start) for a in k.init_writes()})
    start, end = spans[0][0], spans[-1][1]
    between = k.text[start:end]
    for s, e in spans:
        between = between.replace(k.text[s:e], "")
    if between.strip():
        raise ParseError("the init writes are interleaved with other statements")
    first, last = k.text.count("\n", 0, start), k.text.count("\n", 0, end)
    _own_lines(k.text, start, end)
    return first, last


def _statement_span(k: Kernel0, pos: int) -> tuple[int, int]:
    """[start, end) of the top-level statement of kernel0 holding offset ``pos``."""
    depth_one = _outermost_block(k, pos)
    if depth_one is None:  # an unguarded write: the statement itself
        end = k.text.index(";", pos) + 1
        return _statement_start(k, pos), end
    return _statement_start(k, depth_one), matching(k.text, depth_one) + 1


def _outermost_block(k: Kernel0, pos: int) -> int | None:
    stack = open_blocks(k.text, k.body_start, pos)
    return stack[0] if stack else None


def _statement_start(k: Kernel0, pos: int) -> int:
    i = pos - 1
    while i > k.body_start and k.text[i] not in ";{}":
        i -= 1
    i += 1
    while k.text[i].isspace():
        i += 1
    return i


def _own_lines(text: str, start: int, end: int) -> None:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    if text[line_start:start].strip() or text[end:line_end].strip():
        raise ParseError("the init block shares a line with other code")


def _drop(lines: list[str], first: int, last: int) -> list[str]:
    # The upstream hunk (8549cce11b87) removes the block and the blank line after it.
    stop = last + 1
    if stop < len(lines) and not lines[stop].strip():
        stop += 1
    return lines[:first] + lines[stop:]


def _barrier(lines: list[str], last: int) -> list[str]:
    closing = lines[last]  # the init block's last line: its indent is the block's
    indent = closing[: len(closing) - len(closing.lstrip())]
    cr = "\r" if closing.endswith("\r") else ""
    # The PR's first form (sgl-project/sglang#32467): a barrier right after the init block.
    return [*lines[: last + 1], f"{indent}__syncthreads();{cr}", *lines[last + 1 :]]


def _check(result: str, variant: Target) -> None:
    after = classify(result)
    if after.variant != variant:
        raise FatalError(
            f"rewrite produced {after.variant}, not {variant}: {after.reason}", Exit.INTERNAL
        )
