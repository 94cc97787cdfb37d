"""Parse ``plan_compress_prefill_kernel0`` and classify it: racy-init, barrier, no-init or unknown.

sgl-project/sglang#32467: warp 0 initialises ``warp_max``/``warp_min`` while the other warps write
their own slots, with no barrier between. The fix removes the init ("no-init"); the PR's first form
put ``__syncthreads()`` after it ("barrier"). No-init is only correct under the launch geometry the
reviewers asked to make explicit, so the classifier also checks those preconditions.

The parser works on text with comments masked out (same length, newlines kept), so offsets map back
to the original file and comments, whitespace or CRLF line endings never change a verdict.
"""

from __future__ import annotations

import ast
import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

Variant = Literal["racy-init", "barrier", "no-init", "unknown"]
FIXED: tuple[Variant, ...] = ("barrier", "no-init")
KERNEL0 = "plan_compress_prefill_kernel0"
WARP_THREADS = 32  # device::kWarpThreads in sgl_kernel/utils.cuh; a static_assert there pins it
BLOCK_THREADS = 1024  # the one block kernel0 must run as (kMaxPrefillBatchSize)

_IDENT = r"[A-Za-z_]\w*"
_THREAD_IDX = r"threadIdx\.x"


@dataclass(frozen=True)
class Precondition:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Classification:
    variant: Variant
    reason: str
    preconditions: tuple[Precondition, ...] = ()

    @property
    def preconditions_ok(self) -> bool:
        return bool(self.preconditions) and all(p.ok for p in self.preconditions)

    @property
    def fixed(self) -> bool:
        return self.variant in FIXED

    @property
    def safe(self) -> bool:
        return self.fixed and self.preconditions_ok


@dataclass(frozen=True)
class Access:
    """One ``array[index]`` occurrence inside kernel0 (offsets are absolute in the file text)."""

    array: str
    index: str
    start: int
    end: int  # end of the statement holding it (the ';')
    is_write: bool
    guards: tuple[str, ...]  # headers of enclosing blocks / inline if, outermost first


@dataclass
class Kernel0:
    """What the classifier knows about kernel0; also what the rewriter edits."""

    text: str  # masked, LF-normalised file text
    body_start: int
    body_end: int
    constants: dict[str, int]
    thread_vars: set[str]
    warp_var: str | None
    lane_var: str | None
    num_warps_name: str | None
    warp_arrays: list[str]
    accesses: list[Access] = field(default_factory=list)
    barriers: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)

    def per_warp_writes(self) -> list[Access]:
        return [a for a in self.accesses if a.is_write and a.index == self.warp_var]

    def init_writes(self) -> list[Access]:
        first = min((a.start for a in self.per_warp_writes()), default=self.body_end)
        return [
            a for a in self.accesses if a.is_write and a.index != self.warp_var and a.start < first
        ]

    def reads_after(self, offset: int) -> list[Access]:
        return [a for a in self.accesses if not a.is_write and a.start > offset]

    def top_level_barrier_between(self, lo: int, hi: int) -> bool:
        return any(lo < pos < hi and not guards for pos, guards in self.barriers)


class ParseError(Exception):
    """kernel0 is not in a shape the classifier understands; the message says why."""


# ---------------------------------------------------------------- lexing


def normalise(text: str) -> str:
    return text.replace("\r\n", "\n")


_COMMENT_OR_STRING = re.compile(
    r"//[^\n]*|/\*.*?(?:\*/|\Z)|\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?", re.DOTALL
)
_NOT_NEWLINE = re.compile(r"[^\n]+")


def mask_comments(text: str) -> str:
    """Blank out // and /* */ comments and string literals, keeping length and newlines."""
    return _COMMENT_OR_STRING.sub(_blank, text)


def _blank(m: re.Match[str]) -> str:
    piece = m.group(0)
    if piece[0] in "\"'":  # keep the quotes so the literal stays a token
        if len(piece) < 3:
            return piece
        if "\n" not in piece:  # the common case, once per literal: no second call
            return piece[0] + " " * (len(piece) - 2) + piece[-1]
        return piece[0] + _spaces(piece[1:-1]) + piece[-1]
    return _spaces(piece)


def _spaces(piece: str) -> str:
    """``piece`` with everything but newlines blanked (a run at a time: linear and fast)."""
    if "\n" not in piece:
        return " " * len(piece)
    return _NOT_NEWLINE.sub(lambda run: " " * len(run.group(0)), piece)


def matching(text: str, open_pos: int) -> int:
    """Offset of the bracket closing the one at ``open_pos``."""
    opener = text[open_pos]
    depth = 0
    for m in _BRACKETS[opener].finditer(text, open_pos):  # visits brackets only
        depth += 1 if m.group(0) == opener else -1
        if depth == 0:
            return m.start()
    raise ParseError(f"unbalanced '{opener}' at offset {open_pos}")


_BRACKETS = {"(": re.compile(r"[()]"), "{": re.compile(r"[{}]"), "[": re.compile(r"[\[\]]")}
_BODY_OPEN = re.compile(r"\s*\{")
# Patterns run over the whole (hostile) file start with a literal, not \b: re then finds
# candidates with a fast substring search; at_word_start checks the boundary.
_KERNEL0_CALL = re.compile(rf"{KERNEL0}\s*\(")
_CHEVRONS = re.compile(rf"{KERNEL0}\s*<<<\s*([^,>]+?)\s*,\s*([^,>]+?)\s*(?:,[^>]*)?>>>")


def at_word_start(text: str, pos: int) -> bool:
    return pos == 0 or not (text[pos - 1].isalnum() or text[pos - 1] == "_")


# ---------------------------------------------------------------- constants


def constants(text: str) -> dict[str, int]:
    """``constexpr``/``const`` integer definitions whose value folds to a number.

    Linear in the text (a kernel file is hostile input, and the plugin classifies it at every
    SGLang process start): statements are split once at ``;``/``{``/``}``, each ``const`` looks
    only inside its own statement, and definitions that refer to later ones settle through a
    work list instead of passes over all of them.
    """
    defs = [(name, expr) for name, expr in _definitions(text) if _ARITHMETIC.match(expr)]
    return _settle_all(defs, {"kWarpThreads": WARP_THREADS})


_CONST = re.compile(r"const(?:expr)?\b")  # a literal first: re's fast prefix search
_STATEMENT_END = re.compile(r"[;{}]")
_STOP = re.compile(r"[=()]")
_NAME_BEFORE = re.compile(rf"(?<!\w)({_IDENT})\s*\Z")
_EXPR_LIMIT = 256  # a real constant's expression is a few dozen characters


def _definitions(text: str) -> list[tuple[str, str]]:
    """(name, expression) of ``const[expr] ... name = expression;`` in text order: per statement,
    the first ``const`` whose next ``=``/``(``/``)`` is an ``=`` right after a name."""
    out: list[tuple[str, str]] = []
    consts = (m for m in _CONST.finditer(text) if at_word_start(text, m.start()))
    m = next(consts, None)
    while m is not None:
        end = _STATEMENT_END.search(text, m.end())
        if end is None:
            break  # no statement end after this const: nothing more to find
        found, m = _statement(text, m, end.start(), consts)
        if found is not None:
            out.append(found)
    return out


def _statement(
    text: str, m: re.Match[str] | None, stmt_end: int, consts: Iterator[re.Match[str]]
) -> tuple[tuple[str, str] | None, re.Match[str] | None]:
    """The definition the consts from ``m`` on make in the statement ending at ``stmt_end``, and
    the first const after the statement. Each character is looked at a bounded number of times:
    consts before the same ``=`` share one search for it and for the name before it."""
    stop: re.Match[str] | None = None
    tried = -1
    while m is not None and m.start() < stmt_end:
        if stop is None or stop.start() < m.end():
            stop = _STOP.search(text, m.end(), stmt_end)
            if stop is None:
                break
        if text[stop.start()] == "=" and stop.start() != tried:
            tried = stop.start()
            found = _named(text, m.end(), stop.start(), stmt_end)
            if found is not None:
                return found, _first_after(consts, stmt_end)
        m = next(consts, None)
    if m is not None and m.start() < stmt_end:
        m = _first_after(consts, stmt_end)
    return None, m


def _named(text: str, start: int, eq: int, stmt_end: int) -> tuple[str, str] | None:
    name = _NAME_BEFORE.search(text, start, eq)
    rest = text[eq + 1 : stmt_end] if text[stmt_end] == ";" else ""
    if name is None or not rest:
        return None
    return name.group(1), rest.lstrip() or rest[-1]


def _first_after(consts: Iterator[re.Match[str]], pos: int) -> re.Match[str] | None:
    return next((m for m in consts if m.start() > pos), None)


def _settle_all(defs: list[tuple[str, str]], known: dict[str, int]) -> dict[str, int]:
    """Fold every definition whose names are known, in text order, passing over the list again
    while new names settle (a definition may refer to a later one); the first to settle a name
    wins. A work list keyed by (pass, position) gives the passes' result without re-reading the
    definitions that still wait."""
    parsed = [(name, _parse(expr)) for name, expr in defs]
    waiting: dict[str, list[int]] = {}
    heap: list[tuple[int, int]] = []
    for i, (_, tree) in enumerate(parsed):
        if tree is not None:
            heapq.heappush(heap, (0, i))
    missing = [set[str]() for _ in parsed]
    while heap:
        round_, i = heapq.heappop(heap)
        name, tree = parsed[i]
        if name in known or tree is None:
            continue
        missing[i] = {n for n in _names(tree) if n not in known}
        if missing[i]:
            for n in missing[i]:
                waiting.setdefault(n, []).append(i)
            continue
        value = _eval(tree, known)
        if value is None:
            continue
        known[name] = value
        for j in waiting.pop(name, []):  # later in this pass, or in the next one
            heapq.heappush(heap, (round_ if j > i else round_ + 1, j))
    return known


_ARITHMETIC = re.compile(r"^[\w\s+\-*/%:]+$")


def fold(expr: str, known: dict[str, int]) -> int | None:
    """Evaluate a small integer expression (literals, known names, + - * / %), else None."""
    tree = _parse(expr)
    return None if tree is None else _eval(tree, known)


def _parse(expr: str) -> ast.expr | None:
    if len(expr) > _EXPR_LIMIT:
        return None
    cleaned = re.sub(r"\b(?:device|sglang|std)::", "", expr)
    cleaned = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", cleaned).strip()
    cleaned = re.sub(r"static_cast<[^>]*>", "", cleaned)
    try:
        return ast.parse(cleaned, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _names(tree: ast.expr) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _eval(node: ast.AST, known: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, known), _eval(node.right, known)
        if left is None or right is None:
            return None
        return _binop(node.op, left, right)
    return None


def _binop(op: ast.operator, a: int, b: int) -> int | None:
    value = _binop_unbounded(op, a, b)
    return value if value is None or abs(value) <= _VALUE_LIMIT else None


_VALUE_LIMIT = 1 << 64  # a launch size or a warp count; nothing in a kernel file is larger


def _binop_unbounded(op: ast.operator, a: int, b: int) -> int | None:
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, (ast.Div, ast.FloorDiv)) and b:
        return a // b
    if isinstance(op, ast.Mod) and b:
        return a % b
    return None


# ---------------------------------------------------------------- kernel0


def find_kernel0(text: str) -> tuple[int, int]:
    """(offset of '{', offset of '}') of kernel0's one definition."""
    bodies = []
    for m in _KERNEL0_CALL.finditer(text):
        if not at_word_start(text, m.start()):
            continue
        close = matching(text, m.end() - 1)
        after = _BODY_OPEN.match(text, close + 1)  # no slice: a copy per call is quadratic
        if after:
            open_brace = after.end() - 1
            bodies.append((open_brace, matching(text, open_brace)))
    if not bodies:
        raise ParseError(f"no definition of {KERNEL0}")
    if len(bodies) > 1:
        raise ParseError(f"{KERNEL0} is defined {len(bodies)} times")
    return bodies[0]


def parse(original: str) -> Kernel0:
    text = mask_comments(normalise(original))
    start, end = find_kernel0(text)
    body = text[start:end]
    consts = constants(text)
    consts.update(constants(body))
    threads = {"threadIdx.x", *re.findall(rf"\b({_IDENT})\s*=\s*{_THREAD_IDX}\s*;", body)}
    k = Kernel0(
        text=text,
        body_start=start,
        body_end=end,
        constants=consts,
        thread_vars=threads,
        warp_var=_derived_var(body, threads, "/"),
        lane_var=_derived_var(body, threads, "%"),
        num_warps_name=_num_warps_name(body),
        warp_arrays=[],
    )
    k.warp_arrays = _warp_arrays(body, k)
    _scan(k)
    return k


def _derived_var(body: str, threads: set[str], op: str) -> str | None:
    """The variable defined as ``tx / kWarpThreads`` (op '/') or ``tx % kWarpThreads`` ('%')."""
    alts = "|".join(re.escape(t) for t in sorted(threads))
    m = re.search(rf"\b({_IDENT})\s*=\s*(?:{alts})\s*{re.escape(op)}\s*(kWarpThreads|32)\b", body)
    return m.group(1) if m else None


def _num_warps_name(body: str) -> str | None:
    m = re.search(rf"\b({_IDENT})\s*=\s*{_IDENT}\s*/\s*(?:kWarpThreads|32)\b\s*;", body)
    return m.group(1) if m else None


def _warp_arrays(body: str, k: Kernel0) -> list[str]:
    """``__shared__`` arrays with one slot per warp (sized by the warp-count constant)."""
    found = re.findall(rf"__shared__[^;]*?\b({_IDENT})\s*\[\s*({_IDENT}|\d+)\s*\]\s*;", body)
    num_warps = k.constants.get(k.num_warps_name or "", None)
    return [
        name
        for name, size in found
        if size == k.num_warps_name
        or (num_warps is not None and fold(size, k.constants) == num_warps)
    ]


def _scan(k: Kernel0) -> None:
    """Record every access to a warp array and every barrier, with its enclosing guards."""
    if not k.warp_arrays:
        return
    names = "|".join(re.escape(a) for a in k.warp_arrays)
    pattern = re.compile(rf"\b({names})\s*\[|\b__syncthreads\s*\(\s*\)")
    body_text = k.text
    for m in pattern.finditer(body_text, k.body_start, k.body_end):
        guards = _guards(body_text, k.body_start, m.start())
        if m.group(1) is None:
            k.barriers.append((m.start(), guards))
            continue
        if "__shared__" in _statement_prefix(body_text, k.body_start, m.start()):
            continue  # the declaration
        close = matching(body_text, m.end() - 1)
        after = body_text[close + 1 :].lstrip()[:2]
        is_write = after[:1] == "=" and after != "=="
        stmt_end = body_text.find(";", close)
        index = " ".join(body_text[m.end() : close].split())
        k.accesses.append(Access(m.group(1), index, m.start(), stmt_end, is_write, guards))


def _guards(text: str, body_start: int, pos: int) -> tuple[str, ...]:
    """Headers of the blocks enclosing ``pos`` (plus an inline ``if (...)`` on its statement)."""
    stack = open_blocks(text, body_start, pos)
    headers = [_header(text, body_start, b) for b in stack]
    stmt = _statement_prefix(text, body_start, pos)
    if re.match(r"\s*(if|for|while|else)\b", stmt):
        headers.append(" ".join(stmt.split()))
    return tuple(h for h in headers if h)


def open_blocks(text: str, body_start: int, pos: int) -> list[int]:
    """Offsets of the '{' still open at ``pos`` inside kernel0's body, outermost first."""
    stack: list[int] = []
    for m in _BRACE.finditer(text, body_start + 1, pos):
        if m.group(0) == "{":
            stack.append(m.start())
        elif stack:
            stack.pop()
    return stack


_BRACE = re.compile(r"[{}]")


def _header(text: str, body_start: int, brace: int) -> str:
    prefix = _statement_prefix(text, body_start, brace)
    return " ".join(prefix.split()) or "{"


def _statement_prefix(text: str, body_start: int, pos: int) -> str:
    k = pos - 1
    while k > body_start and text[k] not in ";{}":
        k -= 1
    return text[k + 1 : pos]


# ---------------------------------------------------------------- classification


def classify(original: str) -> Classification:
    """The variant of kernel0 in ``original`` (a whole c_plan.cuh) and its safety preconditions."""
    try:
        k = parse(original)
    except ParseError as e:
        return Classification("unknown", str(e))
    pre = preconditions(k)
    variant, reason = _variant(k)
    return Classification(variant, reason, pre)


def _variant(k: Kernel0) -> tuple[Variant, str]:
    if len(k.warp_arrays) < 2:
        return "unknown", "no pair of per-warp __shared__ scratch arrays (warp_max/warp_min)"
    writes = k.per_warp_writes()
    if {a.array for a in writes} != set(k.warp_arrays) or len(writes) != len(k.warp_arrays):
        return "unknown", "expected exactly one per-warp write (array[warp_id] = ...) per array"
    first_write = min(a.start for a in writes)
    last_write = max(a.end for a in writes)
    late = [a for a in k.accesses if a.is_write and a.index != k.warp_var and a.start > first_write]
    if late and min(a.start for a in late) < _first_read(k, last_write):
        return (
            "unknown",
            f"{late[0].array}[{late[0].index}] is written between the per-warp writes and the read",
        )
    inits = k.init_writes()
    if not inits:
        return "no-init", "no initialisation of the per-warp slots before the per-warp writes"
    last_init = max(a.end for a in inits)
    names = ", ".join(sorted({a.array for a in inits}))
    if k.top_level_barrier_between(last_init, first_write):
        return (
            "barrier",
            f"init of {names} is followed by __syncthreads() before the per-warp writes",
        )
    return "racy-init", (
        f"init of {names} races the per-warp writes: no unconditional __syncthreads() between them "
        "(sgl-project/sglang#32467)"
    )


def _first_read(k: Kernel0, after: int) -> int:
    reads = k.reads_after(after)
    return min((a.start for a in reads), default=k.body_end)


def preconditions(k: Kernel0) -> tuple[Precondition, ...]:
    return (
        _single_block_launch(k),
        _warp_count(k),
        _every_warp_writes(k),
        _barrier_before_read(k),
        _warp0_reads_all(k),
    )


def _launches(text: str) -> list[tuple[str, str]]:
    calls = re.findall(
        rf"LaunchKernel\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*(?:,[^()]*)?\)\s*\(\s*{KERNEL0}\b",
        text,
    )
    chevrons = [
        (m.group(1), m.group(2)) for m in _CHEVRONS.finditer(text) if at_word_start(text, m.start())
    ]
    return calls + chevrons


def _single_block_launch(k: Kernel0) -> Precondition:
    """Every host launch of kernel0 (a fork may have several entry points) is one block of 1024."""
    name = "one block of 1024 threads"
    launches = _launches(k.text)
    if not launches:
        return Precondition(name, False, f"found no launch site of {KERNEL0}")
    bounds = re.search(
        rf"__launch_bounds__\s*\(\s*([^,)]+)(?:,[^)]*)?\)\s*(?:/+\s*)?\s*void\s+{KERNEL0}", k.text
    )
    bound = fold(bounds.group(1), k.constants) if bounds else BLOCK_THREADS
    shown = [_launch_detail(k, grid, block) for grid, block in launches]
    bad = [
        i
        for i, (grid, block) in enumerate(launches)
        if (fold(grid, k.constants), fold(block, k.constants)) != (1, BLOCK_THREADS)
    ]
    if len(launches) == 1:
        detail = f"launched as {shown[0]}"
    elif bad:
        detail = f"launch {bad[0] + 1} of {len(launches)} is {shown[bad[0]]}"
    else:
        detail = f"all {len(launches)} launch sites as {shown[0]}"
    if bounds:
        detail += f", __launch_bounds__({_show(bound, bounds.group(1))})"
    return Precondition(name, not bad and bound == BLOCK_THREADS, detail)


def _launch_detail(k: Kernel0, grid: str, block: str) -> str:
    g, b = fold(grid, k.constants), fold(block, k.constants)
    return f"grid={_show(g, grid)}, block={_show(b, block)}"


def _show(value: int | None, expr: str) -> str:
    return str(value) if value is not None else f"{expr.strip()}=?"


def _warp_count(k: Kernel0) -> Precondition:
    name = "32 warps (kNumWarps == block / 32)"
    value = k.constants.get(k.num_warps_name or "")
    ok = value == BLOCK_THREADS // WARP_THREADS and bool(k.warp_var) and bool(k.lane_var)
    detail = f"{k.num_warps_name or 'warp count'} = {value}, warp id = {k.warp_var}, lane id = {k.lane_var}"
    return Precondition(name, ok, detail)


def _every_warp_writes(k: Kernel0) -> Precondition:
    name = "every warp writes its own slot"
    writes = k.per_warp_writes()
    arrays = {a.array for a in writes}
    guarded = [a for a in writes if a.guards]
    ok = len(k.warp_arrays) >= 2 and arrays == set(k.warp_arrays) and not guarded
    if guarded:
        detail = f"{guarded[0].array}[{guarded[0].index}] is written only under '{guarded[0].guards[-1]}'"
    else:
        detail = f"unconditional writes to {', '.join(sorted(arrays)) or 'nothing'} indexed by {k.warp_var}"
    return Precondition(name, ok, detail)


def _barrier_before_read(k: Kernel0) -> Precondition:
    name = "barrier between per-warp writes and warp 0's read"
    writes = k.per_warp_writes()
    if not writes:
        return Precondition(name, False, "no per-warp writes found")
    last = max(a.end for a in writes)
    read = _first_read(k, last)
    ok = read < k.body_end and k.top_level_barrier_between(last, read)
    detail = (
        "unconditional __syncthreads() before the read"
        if ok
        else "no unconditional barrier before the read"
    )
    return Precondition(name, ok, detail)


def _warp0_reads_all(k: Kernel0) -> Precondition:
    name = "warp 0 reads exactly kNumWarps lanes"
    writes = k.per_warp_writes()
    reads = k.reads_after(max((a.end for a in writes), default=k.body_end))
    first = [a for a in reads if a.start == min((r.start for r in reads), default=-1)]
    if not reads:
        return Precondition(name, False, "no read of the per-warp slots after the writes")
    read_arrays = {a.array for a in reads if a.guards == reads[0].guards}
    warp0 = _is_warp0_guard(reads[0].guards, k)
    by_lane = all(a.index == k.lane_var for a in reads if a.guards == reads[0].guards)
    lanes_match = k.constants.get(k.num_warps_name or "") == WARP_THREADS
    ok = warp0 and by_lane and lanes_match and read_arrays == set(k.warp_arrays)
    detail = (
        f"read {first[0].array}[{first[0].index}] under '{(reads[0].guards or ('(none)',))[-1]}'"
    )
    if not lanes_match:
        detail += f"; {k.num_warps_name} != {WARP_THREADS} lanes"
    return Precondition(name, ok, detail)


def _is_warp0_guard(guards: tuple[str, ...], k: Kernel0) -> bool:
    if not guards:
        return False
    guard = guards[-1].replace(" ", "")
    warp0 = f"if({k.warp_var}==0)" if k.warp_var else None
    lanes = {f"if({t}<{w})" for t in k.thread_vars for w in ("32", "kWarpThreads")}
    return guard == warp0 or guard in lanes
