"""scan-logs: find the failure signatures of the planner race in SGLang server logs."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import select
import stat
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from sglang_dsv4_fix import logscan
from sglang_dsv4_fix.commands import to_a_reader_who_may_leave
from sglang_dsv4_fix.commands._common import command
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.logscan import SIGNATURES, Finding, Occurrence, Report

HELP = """\
Streams each FILE (or standard input for '-'; .gz files are read transparently; a FIFO is read
as a stream until its writer closes it) in constant memory and reports, per signature, how many
lines show it, the ranks seen, and the first and last occurrence as FILE:LINE. Signatures:
illegal memory access / CUDA_ERROR_ILLEGAL_ADDRESS / cudaErrorIllegalAddress, device-side assert,
NCCL and SGLang watchdog timeouts, scheduler exceptions, CUDA-graph capture failures. Several
FILEs are scanned in parallel; the report keeps their order. Control characters in log lines are
printed escaped (\\x1b); --json keeps the text as read. Progress goes to standard error (by
default only when it is a terminal and without --quiet): a line per FILE every few seconds while
it is read, and one when it is done.
engines: hyperscan or re2 when installed (the [fast] extra), else python; all find the same lines.
exit codes: 0 no signature found; 10 signatures found; 7 a FILE is missing, unreadable or not a
regular file or FIFO (nothing is scanned), or could not be read to its end, e.g. a truncated .gz
(what was found is still printed); 9 --engine names one that is not installed; 2 bad usage."""


def add_parser(sub: Any) -> None:
    p = command(sub, "scan-logs", __doc__, HELP)
    p.add_argument("files", nargs="+", metavar="FILE", help="log file, or '-' for standard input")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--engine",
        choices=("auto", *logscan.ENGINES),
        default="auto",
        help="matching engine (default: auto = hyperscan, else re2, else python)",
    )
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=0,
        metavar="N",
        help="files scanned at once (default: the CPUs this process may use)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines on standard error (default: when it is a terminal, unless --quiet)",
    )


def _jobs(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    names: list[str] = args.files
    if names.count("-") > 1:
        raise FatalError("'-' (standard input) can be named only once", Exit.USAGE)
    engine = _engine(args.engine)
    with contextlib.ExitStack() as stack:
        # Every path is opened once, up front: a typo in the last FILE fails before a long scan,
        # and a FIFO is never opened twice (a second open would hang, or lose what was written).
        inputs = [(_display(name), stack.enter_context(_open(name))) for name in names]
        report = logscan.scan_all(
            inputs,
            engine,
            jobs=args.jobs or logscan.default_jobs(),
            local=[name == "-" for name in names],
            progress=_progress if _wants_progress(args.progress, args.quiet) else None,
        )
    failed = report.failed
    code = Exit.NOT_FOUND if failed else Exit.FINDINGS if report.found else Exit.OK
    if args.json:
        _write(json.dumps(_payload(report, code, engine.name), indent=2, sort_keys=True) + "\n")
    else:
        _write("".join(_safe(line) + "\n" for line in _lines(report)))
    for source in failed:  # after the report, which already holds them (not a FatalError: with
        # --json that would print a second JSON object)
        print(f"sglang-dsv4-fix: error: {source.name}: {source.error}", file=sys.stderr)
    return int(code)


def _wants_progress(asked: bool | None, quiet: bool) -> bool:
    if asked is not None:
        return asked
    if quiet:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # no or a closed standard error
        return False


def _progress(source: logscan.Source, seconds: float, done: bool) -> None:
    """One line per call (whole lines: files scanned in parallel write to one standard error)."""
    state = "reading" if not done else "done" if source.error is None else "incomplete"
    mib = source.bytes / (1 << 20)
    line = f"scan-logs: {source.name}: {state}, {mib:,.1f} MiB, {source.lines:,} lines, {seconds:.1f} s"
    try:
        sys.stderr.write(_safe(line) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or gone standard error must not stop the scan
        pass


def _engine(name: str) -> logscan.Engine:
    try:
        return logscan.engine(name)
    except logscan.EngineUnavailable as e:
        raise FatalError(f"--engine {name}: {e}", Exit.ENVIRONMENT) from None


def _display(name: str) -> str:
    return "<stdin>" if name == "-" else name


@contextlib.contextmanager
def _open(name: str) -> Iterator[BinaryIO]:
    """Open ``name`` once, without blocking, and refuse anything but a regular file or a FIFO."""
    if name == "-":
        yield sys.stdin.buffer
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FatalError(f"{name}: no such file", Exit.NOT_FOUND) from None
    except OSError as e:
        raise FatalError(f"{name}: cannot read ({e.strerror})", Exit.NOT_FOUND) from None
    try:
        stream = _stream(name, fd)
    except BaseException:
        os.close(fd)
        raise
    with stream:
        yield stream


def _stream(name: str, fd: int) -> BinaryIO:
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        os.set_blocking(fd, True)
        return open(fd, "rb")  # the caller closes it
    if stat.S_ISFIFO(mode):
        return io.BufferedReader(_Fifo(fd))
    if stat.S_ISDIR(mode):
        raise FatalError(f"{name}: is a folder, not a log file", Exit.NOT_FOUND)
    raise FatalError(f"{name}: not a regular file or a FIFO", Exit.NOT_FOUND)


class _Fifo(io.RawIOBase):
    """A FIFO opened with O_NONBLOCK, read as a stream: wait for a writer and for data, then read.

    Reading before any writer came would see end-of-file at once; poll() on a FIFO opened
    O_NONBLOCK reports a hang-up only after a writer has come and gone (Linux fifo_open), so
    polling first waits for the first writer and ends at its close, as `cat FIFO` would.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        while True:
            self._poll.poll()
            try:
                return os.readv(self._fd, [buffer])
            except BlockingIOError:  # woken, but another reader took the data
                continue

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _write(text: str) -> None:
    """Print the report; a reader that went away (`| head`) ends the output, not the exit code."""
    with to_a_reader_who_may_leave():
        sys.stdout.write(text)


# C0 controls but tab, DEL and C1 controls, as \xNN: a log line must not drive the terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}


def _safe(line: str) -> str:
    return line.translate(_CONTROLS)


def _where(o: Occurrence) -> str:
    return f"{o.source}:{o.line}"


def _lines(report: Report) -> list[str]:
    lines_total = sum(s.lines for s in report.sources)
    head = f"scanned {len(report.sources)} file(s), {lines_total} lines"
    incomplete = [f"incomplete: {s.name}: {s.error} after line {s.lines}" for s in report.failed]
    found = report.found
    if not found:
        return [f"{head}: no failure signatures found", *incomplete]
    out = [f"{head}: {len(found)} failure signature(s) in {report.matched_lines} line(s)"]
    for f in found:
        assert f.first is not None and f.last is not None
        ranks = f" on {', '.join(sorted(f.ranks))}" if f.ranks else ""
        out += [
            f"{f.signature.id}: {f.count} line(s){ranks} - {f.signature.title}",
            f"  first: {_where(f.first)}: {f.first.text}",
        ]
        if f.count > 1:
            out.append(f"  last:  {_where(f.last)}: {f.last.text}")
        out.append(f"  why:   {f.signature.why}")
    out += incomplete
    out.append(
        "next: `sglang-dsv4-fix verify --tree ...` on the image that wrote these logs "
        "(exit 1 = racy planner; see docs/operators.md)"
    )
    return out


def _occurrence(o: Occurrence | None) -> dict[str, Any] | None:
    return None if o is None else {"file": o.source, "line": o.line, "text": o.text}


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "id": f.signature.id,
        "title": f.signature.title,
        "count": f.count,
        "ranks": sorted(f.ranks),
        "first": _occurrence(f.first),
        "last": _occurrence(f.last),
    }


def _payload(report: Report, code: int, engine: str) -> dict[str, Any]:
    return {
        "files": [
            {"file": s.name, "bytes": s.bytes, "lines": s.lines, "error": s.error}
            for s in report.sources
        ],
        "matched_lines": report.matched_lines,
        "findings": [_finding(f) for f in report.found],
        "signatures": [s.id for s in SIGNATURES],
        "engine": engine,
        "exit": int(code),
    }
