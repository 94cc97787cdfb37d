"""Stream SGLang server logs for the failure signatures of the planner race (sgl-project/sglang#32467).

The race makes kernel0 plan ragged rows up to B*s_max-1, past the real row count; the consumer
kernels have no bounds check, so what operators see is an illegal memory access on one TP rank
(often during CUDA-graph capture), then the scheduler's exception, then the other ranks' NCCL
watchdogs timing out. Those are the signatures below.

Speed and memory: a log is read in fixed blocks (constant memory however long the log or a line).
Each block is searched with ``bytes.find`` for a few literal anchors (C speed, GB/s each); only the
lines holding an anchor go through the exact per-signature regular expressions. One alternation
regex over every byte would be ~15x slower in CPython's ``re``.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

BLOCK = (
    1 << 18
)  # bytes read per step (256 KiB: the anchor passes stay in cache; 4 MiB is ~10% slower)
MAX_LINE = 1 << 20  # a line longer than this is scanned in pieces (memory stays bounded)
TEXT_LIMIT = 400  # characters of a matched line kept for the report


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
        rb"device-side assert",
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
    b"device-side assert",
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


@dataclass
class Source:
    name: str
    bytes: int = 0  # as read (compressed size for .gz)
    lines: int = 0


class Scanner:
    """Accumulates findings over any number of streams."""

    def __init__(self, signatures: Iterable[Signature] = SIGNATURES) -> None:
        self.findings = {s.id: Finding(s) for s in signatures}
        self.sources: list[Source] = []
        self.matched_lines = 0  # lines holding at least one signature (what `grep -c` counts)

    @property
    def found(self) -> list[Finding]:
        return [f for f in self.findings.values() if f.count]

    def scan(self, stream: BinaryIO, name: str) -> Source:
        """Scan one stream (plain or gzip) to its end."""
        source = Source(name)
        self.sources.append(source)
        if _is_gzip(stream):
            with gzip.GzipFile(fileobj=stream) as unzipped:
                self._scan_plain(unzipped, source)  # type: ignore[arg-type]
        else:
            self._scan_plain(stream, source)
        return source

    def _scan_plain(self, stream: BinaryIO, source: Source) -> None:
        pending = b""
        line = 1  # number of the first line in `pending`
        seen: tuple[int, set[str]] = (0, set())  # kinds already counted on a split long line
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
        if pending:
            self._block(pending, len(pending), line, source.name, seen)
            line += 1
        source.lines = line - 1

    def _block(
        self, data: bytes, end: int, line: int, name: str, seen: tuple[int, set[str]]
    ) -> tuple[int, set[str]]:
        """Scan data[:end], whose first line is number ``line``.

        ``seen`` is (line number, kinds counted on it) of the last matched line so far: a very
        long line scanned in pieces keeps its number, so it is counted once per kind.
        """
        pos, counted = 0, line  # data[pos] starts line number `counted`
        for start, stop in _anchored_lines(data, end):
            counted += data.count(b"\n", pos, start)
            pos = start
            text = data[start:stop]
            kinds = {
                f.signature.id for f in self.findings.values() if f.signature.pattern.search(text)
            }
            before = seen[1] if seen[0] == counted else set()
            self.matched_lines += bool(kinds) and not before
            seen = (counted, before | kinds)
            for kind in kinds - before:
                self._record(self.findings[kind], Occurrence(name, counted, _text(text)), text)
        return seen

    @staticmethod
    def _record(finding: Finding, where: Occurrence, raw: bytes) -> None:
        finding.count += 1
        finding.first = finding.first or where
        finding.last = where
        if len(finding.ranks) < 256 and (m := _RANK.search(raw)):
            finding.ranks.add(f"rank{m[1].decode()}" if m[1] else m[0][:-1].decode())


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


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…"


def _is_gzip(stream: BinaryIO) -> bool:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    return head == b"\x1f\x8b"
