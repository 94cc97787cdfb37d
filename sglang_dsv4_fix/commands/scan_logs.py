"""scan-logs: find the failure signatures of the planner race in SGLang server logs."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from sglang_dsv4_fix.commands._common import command
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.logscan import SIGNATURES, Finding, Occurrence, Scanner

HELP = """\
Streams each FILE (or standard input for '-'; .gz files are read transparently) in constant
memory and reports, per signature, how many lines show it, the ranks seen, and the first and last
occurrence as FILE:LINE. Signatures: illegal memory access / CUDA_ERROR_ILLEGAL_ADDRESS /
cudaErrorIllegalAddress, device-side assert, NCCL and SGLang watchdog timeouts, scheduler
exceptions, CUDA-graph capture failures.
exit codes: 0 no signature found; 10 signatures found; 7 a FILE is missing or unreadable;
2 bad usage."""


def add_parser(sub: Any) -> None:
    p = command(sub, "scan-logs", __doc__, HELP)
    p.add_argument("files", nargs="+", metavar="FILE", help="log file, or '-' for standard input")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    names: list[str] = args.files
    if names.count("-") > 1:
        raise FatalError("'-' (standard input) can be named only once", Exit.USAGE)
    for name in names:
        _check_readable(name)
    scanner = Scanner()
    for name in names:
        with _open(name) as stream:
            try:
                scanner.scan(stream, "<stdin>" if name == "-" else name)
            except (OSError, EOFError, zlib.error) as e:  # e.g. a truncated or corrupt .gz
                raise FatalError(f"{name}: cannot read ({e})", Exit.NOT_FOUND) from None
    code = Exit.FINDINGS if scanner.found else Exit.OK
    if args.json:
        json.dump(_payload(scanner, code), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print("\n".join(_lines(scanner)))
    return int(code)


def _check_readable(name: str) -> None:
    """Fail before scanning anything, so a typo in the last FILE does not waste a long scan."""
    if name == "-":
        return
    path = Path(name)
    if path.is_dir():
        raise FatalError(f"{name}: is a folder, not a log file", Exit.NOT_FOUND)
    try:
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise FatalError(f"{name}: no such file", Exit.NOT_FOUND) from None
    except OSError as e:
        raise FatalError(f"{name}: cannot read ({e.strerror})", Exit.NOT_FOUND) from None


@contextlib.contextmanager
def _open(name: str) -> Iterator[BinaryIO]:
    if name == "-":
        yield sys.stdin.buffer
        return
    try:
        stream = open(name, "rb")  # noqa: SIM115 - closed below, after the scan
    except OSError as e:
        raise FatalError(f"{name}: cannot read ({e.strerror})", Exit.NOT_FOUND) from None
    with stream:
        yield stream


def _where(o: Occurrence) -> str:
    return f"{o.source}:{o.line}"


def _lines(scanner: Scanner) -> list[str]:
    lines_total = sum(s.lines for s in scanner.sources)
    head = f"scanned {len(scanner.sources)} file(s), {lines_total} lines"
    found = scanner.found
    if not found:
        return [f"{head}: no failure signatures found"]
    out = [f"{head}: {len(found)} failure signature(s) in {scanner.matched_lines} line(s)"]
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


def _payload(scanner: Scanner, code: Exit) -> dict[str, Any]:
    return {
        "files": [{"file": s.name, "bytes": s.bytes, "lines": s.lines} for s in scanner.sources],
        "matched_lines": scanner.matched_lines,
        "findings": [_finding(f) for f in scanner.found],
        "signatures": [s.id for s in SIGNATURES],
        "exit": int(code),
    }
