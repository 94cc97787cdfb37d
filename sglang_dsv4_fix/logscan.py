"""Stream SGLang server logs for the failure signatures of the planner race (sgl-project/sglang#32467).

The race makes kernel0 plan ragged rows up to B*s_max-1, past the real row count; the consumer
kernels have no bounds check, so what operators see is an illegal memory access on one TP rank
(often during CUDA-graph capture), then the scheduler's exception, then the other ranks' NCCL
watchdogs timing out. Those are the signatures below.

Speed and memory: a log is read in fixed blocks (constant memory however long the log or a line).
An engine finds, in each block, the lines that hold a signature and which ones:

- ``hyperscan`` (the ``[fast]`` extra): every signature in one compiled database, one pass.
- ``re2`` (google-re2, where hyperscan is missing): one alternation per block, then each
  signature on the lines it hit.
- ``python`` (no dependency, the fallback): ``bytes.find`` for a few literal anchors (C speed),
  then CPython's ``re`` on the lines holding one. One alternation regex over every byte would be
  ~15x slower in CPython's ``re``.

None of the patterns can match a newline, so a match never spans two lines and every engine
answers the same question: which lines hold which signatures (proved line for line in the tests).
"""

from __future__ import annotations

import gzip
import importlib
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

BLOCK = (
    1 << 18
)  # bytes read per step (256 KiB: the anchor passes stay in cache; 4 MiB is ~10% slower)
MAX_LINE = 1 << 20  # a line longer than this is scanned in pieces (memory stays bounded)
TEXT_LIMIT = 400  # characters of a matched line kept for the report
MAX_RANKS = 256  # distinct ranks kept per signature


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    why: str  # how it relates to this bug class, for the operator
    pattern: re.Pattern[bytes]


def _sig(id: str, title: str, why: str, *alternatives: bytes) -> Signature:
    return Signature(id, title, why, re.compile(b"|".join(alternatives)))


SIGNATURES: tuple[Signature, ...] = (
    _sig(
        "illegal-address",
        "illegal memory access (CUDA error 700)",
        "what an out-of-range ragged_id from the racy planner looks like in the consumer kernels",
        rb"illegal memory access",
        rb"CUDA_ERROR_ILLEGAL_ADDRESS",
        rb"cudaErrorIllegalAddress",
    ),
    _sig(
        "device-assert",
        "device-side assert",
        "a bounds assert in a kernel fed with bad indices",
        # cudaGetErrorString(cudaErrorAssert). Not a bare "device-side assert": PyTorch follows
        # every CUDA error with "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
        rb"device-side assert triggered",
        rb"CUDA_ERROR_ASSERT",
        rb"cudaErrorAssert",
        rb"\] Assertion `",
    ),
    _sig(
        "nccl-watchdog",
        "NCCL watchdog timeout",
        "the other TP ranks waiting on a collective after one rank died",
        rb"Watchdog caught collective operation timeout",
        rb"ProcessGroupNCCL's watchdog got stuck",
        rb"Heartbeat monitor timed out",
        rb"[Ww]atchdog thread terminated with exception",
        rb" watchdog timeout \(self\.watchdog_timeout=",  # SGLang's own scheduler watchdog
    ),
    _sig(
        "scheduler-exception",
        "scheduler exception / child process failed",
        "SGLang's scheduler (or DP controller) dying, often right after the CUDA error",
        rb"Scheduler hit an exception",
        rb"TpModelWorkerClient hit an exception",
        rb"DataParallelController hit an exception",
        rb"It usually means \w+ child failed",
    ),
    _sig(
        "cuda-graph-capture",
        "CUDA-graph capture failure",
        "the race often fires during capture, when many ragged batches run back to back",
        rb"Capture [\w -]*?[Cc][Uu][Dd][Aa] graph failed",
        rb"cudaErrorStreamCapture\w+",
        rb"CUDA_ERROR_STREAM_CAPTURE\w+",
        rb"operation not permitted when stream is capturing",
        rb"operation failed due to a previous error during capture",
    ),
)

# Literals of which every signature above contains at least one (checked in the tests).
ANCHORS: tuple[bytes, ...] = (
    b"llegal memory access",
    b"ILLEGAL_ADDRESS",
    b"IllegalAddress",
    b"device-side assert triggered",
    b"ERROR_ASSERT",
    b"ErrorAssert",
    b"] Assertion `",
    b"atchdog",
    b"Heartbeat monitor timed out",
    b" hit an exception",
    b"child failed",
    b"graph failed",
    b"StreamCapture",
    b"STREAM_CAPTURE",
    b"stream is capturing",
    b"during capture",
)
OVERLAP = 256  # bytes kept across a forced split of a very long line (longer than any match)

_RANK = re.compile(rb"\b(?:DP|PP|TP|EP|CP)\d+(?: (?:DP|PP|TP|EP|CP)\d+)*\]|\[[Rr]ank ?(\d+)\]")

# (start, stop, signature ids) of one line of a block that holds at least one signature
Hit = tuple[int, int, frozenset[str]]


class Engine(Protocol):
    name: str

    def hits(self, data: bytes, end: int) -> list[Hit]:
        """The lines of data[:end] holding a signature, in order; the last may end at ``end``."""
        ...


class EngineUnavailable(Exception):
    """The engine's module is not installed (or cannot run on this CPU)."""


class PythonEngine:
    """Literal anchors with ``bytes.find``, then CPython's ``re`` on the lines holding one."""

    name = "python"

    def __init__(self, signatures: Sequence[Signature] = SIGNATURES) -> None:
        self.signatures = tuple(signatures)

    def hits(self, data: bytes, end: int) -> list[Hit]:
        found = []
        for start, stop in _anchored_lines(data, end):
            text = data[start:stop]
            kinds = frozenset(s.id for s in self.signatures if s.pattern.search(text))
            if kinds:
                found.append((start, stop, kinds))
        return found


class HyperscanEngine:
    """All signatures in one Hyperscan block-mode database (Intel's multi-pattern matcher)."""

    name = "hyperscan"

    def __init__(self, signatures: Sequence[Signature] = SIGNATURES) -> None:
        hs = _import("hyperscan")
        self.ids = [s.id for s in signatures]
        self.db = hs.Database(mode=hs.HS_MODE_BLOCK)
        try:
            self.db.compile(
                expressions=[s.pattern.pattern for s in signatures],
                ids=list(range(len(self.ids))),
                elements=len(self.ids),
            )
        except hs.error as e:  # e.g. a CPU without the instructions the library needs
            raise EngineUnavailable(f"hyperscan cannot compile the signatures here ({e})") from e

    def hits(self, data: bytes, end: int) -> list[Hit]:
        lines: dict[int, tuple[int, set[int]]] = {}
        current = [-1, -1]  # (start, stop) of the line of the last match

        def on_match(index: int, _start: int, to: int, _flags: int, _context: object) -> None:
            if not current[0] < to <= current[1]:  # a match ends inside its line, never at 0
                current[0], current[1] = _line_around(data, to, end)
            lines.setdefault(current[0], (current[1], set()))[1].add(index)

        self.db.scan(memoryview(data)[:end], match_event_handler=on_match)
        return [
            (start, stop, frozenset(self.ids[i] for i in kinds))
            for start, (stop, kinds) in sorted(lines.items())
        ]


class Re2Engine:
    """google-re2: one alternation finds the next hit line, each signature then names it."""

    name = "re2"

    def __init__(self, signatures: Sequence[Signature] = SIGNATURES) -> None:
        re2 = _import("re2")
        self.each = [(s.id, re2.compile(s.pattern.pattern)) for s in signatures]
        self.any = re2.compile(b"|".join(b"(?:%s)" % s.pattern.pattern for s in signatures))

    def hits(self, data: bytes, end: int) -> list[Hit]:
        found = []
        pos = 0
        while (m := self.any.search(data, pos, end)) is not None:
            start, stop = _line_around(data, m.end(), end)
            text = data[start:stop]
            found.append((start, stop, frozenset(i for i, p in self.each if p.search(text))))
            pos = stop
        return found


ENGINES: dict[str, Callable[[Sequence[Signature]], Engine]] = {
    "hyperscan": HyperscanEngine,
    "re2": Re2Engine,
    "python": PythonEngine,
}
AUTO = ("hyperscan", "re2", "python")  # what "auto" tries, in order


def engine(name: str = "auto", signatures: Sequence[Signature] = SIGNATURES) -> Engine:
    """The named engine, or for "auto" the first of AUTO that is installed."""
    if name != "auto":
        return ENGINES[name](signatures)
    for candidate in AUTO[:-1]:
        try:
            return ENGINES[candidate](signatures)
        except EngineUnavailable:
            continue
    return PythonEngine(signatures)


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EngineUnavailable(
            f"the {module} engine needs the {'google-re2' if module == 're2' else module} "
            "package (the [fast] extra)"
        ) from e


def _line_around(data: bytes, to: int, end: int) -> tuple[int, int]:
    """(start, stop) of the line of data[:end] in which a match ends at ``to``."""
    stop = data.find(b"\n", to, end)
    return data.rfind(b"\n", 0, to) + 1, end if stop == -1 else stop


def _anchored_lines(data: bytes, end: int) -> list[tuple[int, int]]:
    """(start, stop) of every line in data[:end] holding an anchor, in order, once each."""
    spans: dict[int, int] = {}
    for anchor in ANCHORS:
        i = data.find(anchor, 0, end)
        while i != -1:
            start = data.rfind(b"\n", 0, i) + 1
            stop = data.find(b"\n", i, end)
            stop = end if stop == -1 else stop
            spans[start] = stop
            i = data.find(anchor, stop, end)
    return sorted(spans.items())


@dataclass
class Occurrence:
    source: str
    line: int
    text: str


@dataclass
class Finding:
    signature: Signature
    count: int = 0  # matching lines
    first: Occurrence | None = None
    last: Occurrence | None = None
    ranks: set[str] = field(default_factory=set)

    def absorb(self, later: Finding) -> None:
        """Add the finding of a later input (arguments keep their order)."""
        if not later.count:
            return
        self.count += later.count
        self.first = self.first or later.first
        self.last = later.last
        room = MAX_RANKS - len(self.ranks)
        self.ranks |= set(sorted(later.ranks - self.ranks)[: max(room, 0)])


@dataclass
class Source:
    name: str
    bytes: int = 0  # as read (compressed size for .gz)
    lines: int = 0
    error: str | None = None  # why it could not be read to its end (what was read still counts)


@dataclass
class Report:
    """What was found, over any number of inputs, in input order."""

    signatures: Sequence[Signature] = SIGNATURES
    findings: dict[str, Finding] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)
    matched_lines: int = 0  # lines holding at least one signature (what `grep -c` counts)

    def __post_init__(self) -> None:
        self.findings = self.findings or {s.id: Finding(s) for s in self.signatures}

    @property
    def found(self) -> list[Finding]:
        return [f for f in self.findings.values() if f.count]

    @property
    def failed(self) -> list[Source]:
        return [s for s in self.sources if s.error is not None]

    def absorb(self, later: Report) -> None:
        for kind, finding in later.findings.items():
            self.findings[kind].absorb(finding)
        self.sources += later.sources
        self.matched_lines += later.matched_lines


# Told how a stream's scan goes: (source so far, seconds since it started, whether it is done).
Progress = Callable[[Source, float, bool], None]
PROGRESS_EVERY = 5.0  # seconds between two progress calls on one stream


class Scanner:
    """Accumulates findings over any number of streams, with one engine.

    ``progress``, if given, is called at most every ``every`` seconds while a stream is read (after
    a block) and once when it is done, with what was read so far.
    """

    def __init__(
        self,
        signatures: Sequence[Signature] = SIGNATURES,
        engine: Engine | None = None,
        progress: Progress | None = None,
        every: float = PROGRESS_EVERY,
    ) -> None:
        self.engine = engine or PythonEngine(signatures)
        self.report = Report(signatures)
        self.progress, self.every = progress, every

    def scan(self, stream: BinaryIO, name: str) -> Source:
        """Scan one stream (plain or gzip) to its end; a read error is kept in ``Source.error``."""
        source = Source(name)
        self.report.sources.append(source)
        started = time.monotonic()
        try:
            if _is_gzip(stream):
                with gzip.GzipFile(fileobj=stream) as unzipped:
                    self._scan_plain(unzipped, source, started)  # type: ignore[arg-type]
            else:
                self._scan_plain(stream, source, started)
        except (OSError, EOFError, zlib.error) as e:  # e.g. a truncated or corrupt .gz
            source.error = f"cannot read ({e})"
        if self.progress is not None:
            self.progress(source, time.monotonic() - started, True)
        return source

    def _scan_plain(self, stream: BinaryIO, source: Source, started: float) -> None:
        pending = b""
        line = 1  # number of the first line in `pending`
        seen: tuple[int, set[str]] = (0, set())  # kinds already counted on a split long line
        told = started
        try:
            while block := stream.read(BLOCK):
                source.bytes += len(block)
                data = pending + block if pending else block
                end = data.rfind(b"\n") + 1
                if end == 0 and len(data) <= MAX_LINE:
                    pending = data
                    continue
                split = end == 0  # a very long line: scan what we have, keep a small overlap
                end = len(data) if split else end
                seen = self._block(data, end, line, source.name, seen)
                line += data.count(b"\n", 0, end)
                pending = data[end - OVERLAP :] if split else data[end:]
                if self.progress is not None and (now := time.monotonic()) - told >= self.every:
                    source.lines, told = line - 1, now  # the whole lines scanned so far
                    self.progress(source, now - started, False)
            if pending:
                self._block(pending, len(pending), line, source.name, seen)
                line += 1
        finally:  # a read error keeps the count of the lines read whole
            source.lines = line - 1

    def _block(
        self, data: bytes, end: int, line: int, name: str, seen: tuple[int, set[str]]
    ) -> tuple[int, set[str]]:
        """Scan data[:end], whose first line is number ``line``.

        ``seen`` is (line number, kinds counted on it) of the last matched line so far: a very
        long line scanned in pieces keeps its number, so it is counted once per kind.
        """
        pos, counted = 0, line  # data[pos] starts line number `counted`
        for start, stop, kinds in self.engine.hits(data, end):
            counted += data.count(b"\n", pos, start)
            pos = start
            before = seen[1] if seen[0] == counted else set()
            self.report.matched_lines += not before
            seen = (counted, before | kinds)
            text = data[start:stop]
            for kind in kinds - before:
                _record(self.report.findings[kind], Occurrence(name, counted, _text(text)), text)
        return seen


def _record(finding: Finding, where: Occurrence, raw: bytes) -> None:
    finding.count += 1
    finding.first = finding.first or where
    finding.last = where
    if len(finding.ranks) < MAX_RANKS and (m := _RANK.search(raw)):
        finding.ranks.add(f"rank{m[1].decode()}" if m[1] else m[0][:-1].decode())


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…"


def _is_gzip(stream: BinaryIO) -> bool:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    return head == b"\x1f\x8b"


# Parallel scans: inputs are opened by the caller, then forked worker processes each read their
# own. A stream is inherited through fork (never pickled), so every path is opened exactly once.
_INPUTS: Sequence[tuple[str, BinaryIO]] = ()
_ENGINE: Engine | None = None
_PROGRESS: Progress | None = None


def scan_all(
    inputs: Sequence[tuple[str, BinaryIO]],
    engine: Engine,
    jobs: int = 1,
    local: Sequence[bool] = (),
    progress: Progress | None = None,
) -> Report:
    """Scan every (name, stream), up to ``jobs`` at a time; the report keeps the inputs' order.

    ``local[i]`` keeps input i in this process (standard input: worker processes close it).
    ``progress`` (see Scanner) is called from whichever process scans the input.
    """
    local = list(local) or [False] * len(inputs)
    remote = [i for i, keep in enumerate(local) if not keep]
    if jobs <= 1 or len(remote) <= 1:
        return _merge(_scan_one(name, stream, engine, progress) for name, stream in inputs)
    results: dict[int, Report] = {}
    with _pool(inputs, engine, min(jobs, len(remote)), progress) as pool:
        pending = pool.map(_scan_inherited, remote)
        for i, keep in enumerate(local):
            if keep:
                results[i] = _scan_one(*inputs[i], engine, progress)
        results.update(zip(remote, pending, strict=True))
    return _merge(results[i] for i in range(len(inputs)))


def default_jobs() -> int:
    return len(os.sched_getaffinity(0))


def _pool(
    inputs: Sequence[tuple[str, BinaryIO]], engine: Engine, workers: int, progress: Progress | None
) -> Any:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _INPUTS, _ENGINE, _PROGRESS
    _INPUTS, _ENGINE, _PROGRESS = inputs, engine, progress  # seen by the workers, forked later
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))


def _scan_inherited(index: int) -> Report:
    assert _ENGINE is not None
    return _scan_one(*_INPUTS[index], _ENGINE, _PROGRESS)


def _scan_one(
    name: str, stream: BinaryIO, engine: Engine, progress: Progress | None = None
) -> Report:
    scanner = Scanner(engine=engine, progress=progress)
    scanner.scan(stream, name)
    return scanner.report


def _merge(reports: Iterable[Report]) -> Report:
    merged = Report()
    for report in reports:
        merged.absorb(report)
    return merged
