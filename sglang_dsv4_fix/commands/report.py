"""report: one table of the fleet's planner kernels from the plugin's JSON-lines report files."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sglang_dsv4_fix.commands import to_a_reader_who_may_leave
from sglang_dsv4_fix.commands._common import command
from sglang_dsv4_fix.errors import Exit, FatalError

HELP = """\
Reads the SGLANG_DSV4_FIX_REPORT files of many hosts (or standard input for '-'; .gz files are
read transparently) and prints, per process, its latest record: host, rank (or pid), release,
variant, verdict, last seen. A restarted rank replaces its earlier records; a process without a
rank is keyed by its pid. Torn or foreign lines are skipped with a one-line warning.
exit codes: 0 every latest record is healthy; 1 one is racy (kernel or loaded build);
5 one runs a stale racy build; 3 one is unknown or unsafe; 7 a FILE is missing, not a regular
file, or unreadable; 2 bad usage."""

MAX_LINE = 1 << 20  # a record is ~1 KB; a longer line is not one of ours
BAD = {"racy": Exit.VULNERABLE, "stale-build": Exit.STALE_BUILD, "unknown": Exit.UNKNOWN,
       "unsafe": Exit.UNKNOWN}  # fmt: skip
COLUMNS = ("host", "process", "release", "variant", "verdict", "last seen")


@dataclass
class Fleet:
    latest: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    records: int = 0
    skipped: int = 0

    def add(self, record: dict[str, Any]) -> None:
        self.records += 1
        key = (str(record.get("host")), _who(record))
        seen = self.latest.get(key)
        if seen is None or str(record.get("time", "")) >= str(seen.get("time", "")):
            self.latest[key] = record


def add_parser(sub: Any) -> None:
    p = command(sub, "report", __doc__, HELP)
    p.add_argument(
        "files", nargs="+", metavar="FILE", help="report file, or '-' for standard input"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    names: list[str] = args.files
    if names.count("-") > 1:
        raise FatalError("'-' (standard input) can be named only once", Exit.USAGE)
    fleet = Fleet()
    for name in names:
        with _open(name) as stream:
            _read(stream, "<stdin>" if name == "-" else name, fleet)
    rows = [_row(r) for _, r in sorted(fleet.latest.items())]
    code = _exit(rows)
    with to_a_reader_who_may_leave():
        if args.json:
            payload = {"processes": rows, "records": fleet.records, "skipped": fleet.skipped,
                       "exit": int(code)}  # fmt: skip
            json.dump(payload, sys.stdout, indent=2, sort_keys=True)
            sys.stdout.write("\n")
        else:
            print("\n".join(_table(rows)))
            print(f"{len(rows)} process(es) from {fleet.records} record(s); {_summary(rows, code)}")
    return int(code)


@contextlib.contextmanager
def _open(name: str) -> Iterator[IO[bytes]]:
    """A regular file (never blocks on a FIFO or a device), gunzipped when it starts like gzip."""
    if name == "-":
        yield sys.stdin.buffer
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise FatalError(f"{name}: cannot read ({e.strerror})", Exit.NOT_FOUND) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FatalError(f"{name}: not a regular file (a FIFO, device or folder)", Exit.NOT_FOUND)
    with os.fdopen(fd, "rb") as raw:
        if raw.peek(2)[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield unzipped  # type: ignore[misc]
        else:
            yield raw


def _read(stream: IO[bytes], name: str, fleet: Fleet) -> None:
    try:
        for number, line in enumerate(_lines(stream), 1):
            record = _record(line)
            if isinstance(record, str):
                fleet.skipped += 1
                print(f"warning: {name}:{number}: {record}; skipped", file=sys.stderr)
            elif record is not None:
                fleet.add(record)
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz
        raise FatalError(f"{name}: cannot read ({e})", Exit.NOT_FOUND) from None


def _lines(stream: IO[bytes]) -> Iterator[bytes | None]:
    """Lines of at most MAX_LINE bytes in constant memory; a longer one comes back as None."""
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # drain the rest of the huge line
                line = stream.readline(MAX_LINE)
            yield None
        else:
            yield line


def _record(line: bytes | None) -> dict[str, Any] | str | None:
    """The record, None for a blank line, or why the line is not a record."""
    if line is None:
        return f"line longer than {MAX_LINE} bytes"
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return "not a JSON record (a torn write?)"
    if not isinstance(record, dict) or record.get("event") not in ("start", "jit-load"):
        return "not a sglang-dsv4-fix record"
    return record


def _who(record: dict[str, Any]) -> str:
    rank = record.get("rank")
    return str(rank) if rank else f"pid {record.get('pid')}"


def _verdict(record: dict[str, Any]) -> str:
    state = record.get("state")
    if isinstance(state, str) and state:
        return state
    return "racy" if record.get("variant") == "racy-init" else str(record.get("action", "?"))


def _row(r: dict[str, Any]) -> dict[str, Any]:
    verdict = _verdict(r)
    if r.get("action") == "refused":
        verdict += " (refused)"
    return {
        "host": r.get("host"),
        "process": f"{r['rank']} ({r.get('process')} {r.get('pid')})" if r.get("rank") else _who(r),
        "release": r.get("release"),
        "variant": r.get("built_variant") if r.get("event") == "jit-load" else r.get("variant"),
        "verdict": verdict,
        "last seen": r.get("time"),
        "event": r.get("event"),
        "fix": r.get("fix"),
    }


def _exit(rows: list[dict[str, Any]]) -> int:
    """1 before 5 before 3: the worst first (a refused process is not running: not counted)."""
    found = {BAD[row["verdict"]] for row in rows if row["verdict"] in BAD}
    for code in (Exit.VULNERABLE, Exit.STALE_BUILD, Exit.UNKNOWN):
        if code in found:
            return code
    return Exit.OK


def _table(rows: list[dict[str, Any]]) -> list[str]:
    cells = [[str(row[c] if row[c] is not None else "-") for c in COLUMNS] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(COLUMNS)]
    return ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
            for line in [list(COLUMNS), *cells]]  # fmt: skip


def _summary(rows: list[dict[str, Any]], code: int) -> str:
    if code == Exit.OK:
        return "all healthy"
    bad = [r for r in rows if r["verdict"] in BAD]
    return f"{len(bad)} not healthy (exit {int(code)})"
