"""`report`: the fleet table from the plugin's JSON-lines files (the records the plugin writes)."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_dsv4_fix.main import main


def rec(host: str, pid: int, time: str, state: str, **extra: Any) -> dict[str, Any]:
    variant = "racy-init" if state == "racy" else "no-init"
    return {"schema": 1, "event": "start", "host": host, "pid": pid, "time": time,
            "state": state, "variant": variant, "release": "0.5.16", "process": "scheduler",
            "rank": None, "action": "warned" if state == "racy" else "ok", **extra}  # fmt: skip


def write(path: Path, *records: dict[str, Any], tail: bytes = b"") -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail)
    return path


def test_latest_record_per_rank_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A re-patched host: the rank's old racy record is replaced by its newer fixed one."""
    f = write(tmp_path / "a.jsonl",
              rec("h1", 10, "2026-12-02T10:00:00Z", "racy", rank="tp0"),
              rec("h1", 20, "2026-12-02T11:00:00Z", "verified", rank="tp0"),
              rec("h2", 30, "2026-12-02T11:00:00Z", "verified"))  # fmt: skip
    assert main(["report", str(f)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["host", "process", "release", "variant", "verdict", "last", "seen"]
    assert out[1].split() == ["h1", "tp0", "(scheduler", "20)", "0.5.16", "no-init", "verified",
                              "2026-12-02T11:00:00Z"]  # fmt: skip
    assert out[-1] == "2 process(es) from 3 record(s); all healthy"


@pytest.mark.parametrize(("state", "code"), [("racy", 1), ("stale-build", 5), ("unknown", 3)])
def test_exit_code_names_the_worst(tmp_path: Path, state: str, code: int) -> None:
    f = write(tmp_path / "a.jsonl", rec("h1", 1, "t1", "verified"), rec("h2", 2, "t1", state))
    assert main(["report", str(f)]) == code


def test_a_racy_build_at_jit_load_is_the_latest_word(tmp_path: Path) -> None:
    start = rec("h1", 5, "2026-12-02T10:00:00Z", "verified")
    jit = {**start, "event": "jit-load", "time": "2026-12-02T10:00:09Z", "state": "stale-build",
           "built_variant": "racy-init"}  # fmt: skip
    assert main(["report", str(write(tmp_path / "a.jsonl", start, jit))]) == 5


def test_gzip_stdin_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(json.dumps(rec("h9", 9, "t", "racy")).encode() + b"\n"))
    stdin = io.TextIOWrapper(io.BytesIO(json.dumps(rec("h8", 8, "t", "verified")).encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["report", "--json", str(gz), "-"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert [(p["host"], p["verdict"]) for p in payload["processes"]] == [
        ("h8", "verified"),
        ("h9", "racy"),
    ]
    assert payload["exit"] == 1 and payload["records"] == 2


def test_torn_and_huge_lines_are_skipped_with_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = b'{"event": "start", "pad": "' + b"x" * (2 << 20) + b'"}\n'
    f = write(tmp_path / "a.jsonl", rec("h1", 1, "t", "verified"), tail=huge + b'{"event": "st')
    assert main(["report", str(f)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: {f}:2: line longer than 1048576 bytes; skipped",
        f"warning: {f}:3: not a JSON record (a torn write?); skipped",
    ]


def test_a_fifo_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    assert main(["report", str(fifo)]) == 7
    assert capsys.readouterr().err == (
        f"sglang-dsv4-fix: error: {fifo}: not a regular file (a FIFO, device or folder)\n"
    )


def test_a_missing_file_and_a_corrupt_gzip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 7
    assert capsys.readouterr().err == (
        f"sglang-dsv4-fix: error: {tmp_path / 'nope'}: cannot read (No such file or directory)\n"
    )
    bad = tmp_path / "x.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"not deflate data at all")
    assert main(["report", str(bad)]) == 7
    assert capsys.readouterr().err.startswith(f"sglang-dsv4-fix: error: {bad}: cannot read (")
