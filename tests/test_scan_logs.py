from __future__ import annotations

import gzip
import json
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from trees import fetch_wheel

from sglang_dsv4_fix import logscan
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.logscan import ANCHORS, SIGNATURES, Scanner
from sglang_dsv4_fix.main import main

T = "2026-12-02 10:00:00"

# One line per signature alternative, as the emitting code writes it (CUDA, torch, NCCL, SGLang).
SAMPLES: dict[str, list[str]] = {
    "illegal-address": [
        f"[{T} TP3] RuntimeError: CUDA error: an illegal memory access was encountered",
        "NCCL WARN Cuda failure 'an illegal memory access was encountered'",
        "torch.AcceleratorError: CUDA_ERROR_ILLEGAL_ADDRESS",
        "tvm_ffi error: cudaErrorIllegalAddress at c_plan.cuh:212",
    ],
    "device-assert": [
        "RuntimeError: CUDA error: device-side assert triggered",
        "CUDA_ERROR_ASSERT: kernel assert",
        "cudaErrorAssert in flashmla",
        "IndexKernel.cu:93: operator(): block: [7,0,0], thread: [64,0,0] Assertion `index out of "
        'bounds"` failed.',
    ],
    "nccl-watchdog": [
        "[rank1]:[E1202 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=4242, OpType=ALLREDUCE) ran for 600012 milliseconds",
        "[rank2]:[E1202] [PG ID 0 Rank 2] ProcessGroupNCCL's watchdog got stuck for 480 seconds",
        "[rank0]:[F1202] [PG ID 0 Rank 0] Heartbeat monitor timed out! Process will be terminated",
        "[rank3]:[E1202] [PG ID 0 Rank 3] Process group watchdog thread terminated with exception",
        f"[{T} TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
    ],
    "scheduler-exception": [
        f"[{T} TP3] Scheduler hit an exception: Traceback (most recent call last):",
        f"[{T} TP0] TpModelWorkerClient hit an exception: Traceback (most recent call last):",
        f"[{T}] DataParallelController hit an exception: Traceback (most recent call last):",
        f"[{T}] Received sigquit from a child process. It usually means the child failed.",
        f"[{T}] SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
    ],
    "cuda-graph-capture": [
        f"[{T} TP2] Exception: Capture cuda graph failed: CUDA error: out of memory",
        f"[{T} TP2] Exception: Capture prefill CUDA graph failed: boom",
        f"[{T} TP2] Exception: Capture frozen-KV MTP cuda graph failed: boom",
        "RuntimeError: CUDA error: operation not permitted when stream is capturing",
        "torch.AcceleratorError: cudaErrorStreamCaptureInvalidated: operation failed due to a "
        "previous error during capture",
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    ],
}

NOISE = [
    f"[{T} TP0] Prefill batch, #new-seq: 1, #new-token: 4096, #cached-token: 0, token usage: 0.01",
    f"[{T} TP1] Decode batch, #running-req: 64, #token: 81920, cuda graph: True",
    f"[{T} TP0] Watchdog Scheduler initialized.",
    f"[{T} TP0] Capture cuda graph begin. This can take up to several minutes.",
    f"[{T} TP0] Capture cuda graph end. Time elapsed: 12.3 s.",
    "[rank0]:[W1202] ProcessGroupNCCL.cpp:1500 Warning: the watchdog is healthy",
    f'[{T}] INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK',
]


def scan(tmp_path: Path, text: str | bytes, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    log = tmp_path / "server.log"
    log.write_bytes(text.encode() if isinstance(text, str) else text)
    return _main_json(str(log), *extra)


def _main_json(*argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["scan-logs", "--json", *argv])
    return code, json.loads(out.getvalue())


def reference(data: bytes) -> dict[str, list[int]]:
    """The obvious per-line scan the streaming scanner must agree with: kind -> line numbers."""
    found: dict[str, list[int]] = {s.id: [] for s in SIGNATURES}
    for number, line in enumerate(data.split(b"\n"), 1):
        for s in SIGNATURES:
            if s.pattern.search(line):
                found[s.id].append(number)
    return found


@pytest.mark.parametrize(("kind", "line"), [(k, x) for k, xs in SAMPLES.items() for x in xs])
def test_each_signature_is_found_with_its_location(tmp_path: Path, kind: str, line: str) -> None:
    code, out = scan(tmp_path, "\n".join([*NOISE, line, *NOISE]) + "\n")
    assert code == Exit.FINDINGS
    [finding] = out["findings"]
    assert finding["id"] == kind
    assert finding["count"] == 1
    assert finding["first"] == {"file": str(tmp_path / "server.log"), "line": 8, "text": line}


def test_every_signature_alternative_holds_an_anchor() -> None:
    """The prefilter only looks at lines with an anchor: each alternative must contain one."""
    for s in SIGNATURES:
        for alternative in s.pattern.pattern.split(b"|"):
            literal = re.sub(rb"\\(.)", rb"\1", alternative)
            assert any(a in literal for a in ANCHORS), alternative


def test_clean_log_exits_0_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "ok.log"
    log.write_text("\n".join(NOISE * 100) + "\n")
    assert main(["scan-logs", str(log)]) == Exit.OK
    assert capsys.readouterr().out == "scanned 1 file(s), 700 lines: no failure signatures found\n"


def test_text_report_counts_ranks_first_and_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = SAMPLES["illegal-address"][0], SAMPLES["illegal-address"][0].replace("TP3", "TP5")
    log = tmp_path / "s.log"
    log.write_text(f"{NOISE[0]}\n{a}\n{NOISE[1]}\n{b}\n{a} {a}\n")
    assert main(["scan-logs", str(log)]) == Exit.FINDINGS
    assert capsys.readouterr().out.splitlines()[:5] == [
        "scanned 1 file(s), 5 lines: 1 failure signature(s) in 3 line(s)",
        "illegal-address: 3 line(s) on TP3, TP5 - illegal memory access (CUDA error 700)",
        f"  first: {log}:2: {a}",
        f"  last:  {log}:5: {a} {a}",
        f"  why:   {SIGNATURES[0].why}",
    ]


def test_several_files_keep_their_own_line_numbers(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("\n".join(NOISE) + "\n")
    (tmp_path / "b.log").write_text(f"x\n{SAMPLES['nccl-watchdog'][0]}\n")
    code, out = _main_json(str(tmp_path / "a.log"), str(tmp_path / "b.log"))
    assert code == Exit.FINDINGS
    assert out["findings"][0]["first"]["file"] == str(tmp_path / "b.log")
    assert out["findings"][0]["first"]["line"] == 2
    assert out["findings"][0]["ranks"] == ["rank1"]
    assert [f["lines"] for f in out["files"]] == [7, 2]


def test_stdin_and_gzip_through_the_real_cli(tmp_path: Path) -> None:
    body = ("\n".join(NOISE) + "\n" + SAMPLES["scheduler-exception"][0] + "\n").encode()
    (tmp_path / "rotated.log.gz").write_bytes(gzip.compress(body))
    cmd = [sys.executable, "-m", "sglang_dsv4_fix", "scan-logs", "--json", "-"]
    done = subprocess.run([*cmd, str(tmp_path / "rotated.log.gz")], input=body, capture_output=True)
    assert done.returncode == Exit.FINDINGS, done.stderr
    out = json.loads(done.stdout)
    assert [(f["file"], f["lines"]) for f in out["files"]] == [
        ("<stdin>", 8),
        (str(tmp_path / "rotated.log.gz"), 8),
    ]
    assert out["findings"][0]["count"] == 2
    assert out["findings"][0]["first"] == {
        "file": "<stdin>",
        "line": 8,
        "text": SAMPLES["scheduler-exception"][0],
    }


def test_crlf_and_invalid_utf8_lines(tmp_path: Path) -> None:
    line = SAMPLES["device-assert"][0].encode()
    code, out = scan(tmp_path, b"ok\r\n\xff\xfe " + line + b"\r\nend")
    assert code == Exit.FINDINGS
    assert out["findings"][0]["first"]["text"] == "\ufffd\ufffd " + line.decode()
    assert out["files"][0]["lines"] == 3


@pytest.mark.parametrize("seed", range(12))
def test_streaming_agrees_with_a_per_line_scan_across_block_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Tiny blocks and line limits put signatures across every kind of boundary."""
    rng = random.Random(seed)
    monkeypatch.setattr(logscan, "BLOCK", rng.choice((17, 64, 200, 1000)))
    monkeypatch.setattr(logscan, "MAX_LINE", rng.choice((300, 700, 5000)))
    monkeypatch.setattr(logscan, "OVERLAP", 256)
    samples = [x for xs in SAMPLES.values() for x in xs]
    lines = []
    for _ in range(400):
        r = rng.random()
        if r < 0.1:
            lines.append(rng.choice(samples))
        elif r < 0.13:  # a very long line with signatures inside, maybe two of one kind
            pad = "y" * rng.randrange(0, 3000)
            lines.append(pad + rng.choice(samples) + pad + rng.choice(samples) + pad)
        elif r < 0.15:
            lines.append("")
        else:
            lines.append(rng.choice(NOISE))
    data = "\n".join(lines).encode() + rng.choice((b"", b"\n"))
    scanner = Scanner()
    log = tmp_path / "r.log"
    log.write_bytes(data)
    with log.open("rb") as f:
        scanner.scan(f, "r.log")
    expected = reference(data)
    for kind, numbers in expected.items():
        finding = scanner.findings[kind]
        assert finding.count == len(numbers), kind
        if numbers:
            assert finding.first is not None and finding.last is not None
            assert (finding.first.line, finding.last.line) == (numbers[0], numbers[-1]), kind
    assert scanner.matched_lines == len({n for ns in expected.values() for n in ns})
    assert scanner.sources[0].lines == data.count(b"\n") + (not data.endswith(b"\n"))


def test_memory_stays_flat_on_a_large_stream(tmp_path: Path) -> None:
    """130 MB through stdin, including one 50 MB line: the scanner's peak RSS stays small."""
    script = (
        "import sys, resource\n"
        "from sglang_dsv4_fix.main import main\n"
        "code = main(['scan-logs', '-'])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print('HWM', hwm, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    chunk = ("\n".join(NOISE) + "\n").encode() * 2000
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        fed = 0
        while fed < 80_000_000:
            proc.stdin.write(chunk)
            fed += len(chunk)
        proc.stdin.write(b"z" * 50_000_000 + SAMPLES["illegal-address"][0].encode() + b"\n")
        proc.stdin.close()
        out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == Exit.FINDINGS, err
    hwm_kib = int(re.search(rb"HWM (\d+)", err)[1])  # type: ignore[index]
    assert hwm_kib < 80_000, f"peak RSS {hwm_kib} KiB"
    assert b"illegal-address: 1 line(s) on TP3" in out


def test_signatures_follow_the_real_sglang_sources() -> None:
    """The SGLang-emitted messages we match are in the real releases' code (0.5.12 and 0.5.23)."""
    wanted = {
        "Scheduler hit an exception": "sglang/srt/managers/scheduler.py",
        "DataParallelController hit an exception": "sglang/srt/managers/data_parallel_controller.py",
        "It usually means the child failed.": None,
        "Capture cuda graph failed: ": None,
        " watchdog timeout ": "sglang/srt/utils/watchdog.py",
    }
    for version in ("0.5.12", "0.5.16", "0.5.23"):
        with zipfile.ZipFile(fetch_wheel(version)) as wheel:
            sources = {n: wheel.read(n) for n in wheel.namelist() if n.startswith("sglang/srt/")}
        for text, path in wanted.items():
            holders = [n for n, b in sources.items() if text.encode() in b]
            assert holders, (version, text)
            if path is not None:
                assert path in holders, (version, text, holders)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["/no/such.log"], Exit.NOT_FOUND, "sglang-dsv4-fix: error: /no/such.log: no such file\n"),
        (
            ["-", "-"],
            Exit.USAGE,
            "sglang-dsv4-fix: error: '-' (standard input) can be named only once\n",
        ),
    ],
)
def test_bad_arguments(
    argv: list[str], code: Exit, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan-logs", *argv]) == code
    assert capsys.readouterr().err == message


def test_a_folder_or_an_unreadable_file_is_refused_before_scanning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.log"
    good.write_text(SAMPLES["illegal-address"][0] + "\n")
    assert main(["scan-logs", str(good), str(tmp_path)]) == Exit.NOT_FOUND
    captured = capsys.readouterr()
    assert captured.err == f"sglang-dsv4-fix: error: {tmp_path}: is a folder, not a log file\n"
    assert captured.out == ""  # nothing scanned, nothing half-reported
    locked = tmp_path / "locked.log"
    locked.write_text("x\n")
    locked.chmod(0)
    try:
        if not _readable(locked):
            assert main(["scan-logs", str(locked)]) == Exit.NOT_FOUND
            assert "cannot read (Permission denied)" in capsys.readouterr().err
    finally:
        locked.chmod(0o644)


def test_a_truncated_gzip_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "server.log.gz"
    log.write_bytes(gzip.compress(("\n".join(NOISE) * 50).encode())[:300])
    assert main(["scan-logs", str(log)]) == Exit.NOT_FOUND
    err = capsys.readouterr().err
    assert err == (
        f"sglang-dsv4-fix: error: {log}: cannot read "
        "(Compressed file ended before the end-of-stream marker was reached)\n"
    )


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
    except PermissionError:
        return False
    return True


def test_no_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["scan-logs"])
    assert e.value.code == Exit.USAGE
    assert "the following arguments are required: FILE" in capsys.readouterr().err
