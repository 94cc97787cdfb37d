from __future__ import annotations

import gzip
import json
import os
import pwd
import random
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from trees import fetch_wheel

from sglang_dsv4_fix import logscan
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.logscan import ANCHORS, SIGNATURES, Engine, EngineUnavailable, Scanner
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


# What PyTorch (c10_cuda_check_implementation) prints after every CUDA error, and what a crashing
# SGLang TP rank logs around it: real messages, as operators paste them into bug reports.
TORCH_HINT = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
REAL_CRASH = [
    f"[{T} TP3] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2913, in '
    "run_scheduler_process",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    *TORCH_HINT,
    "",
    "Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44",
    "[rank2]:[E1202 10:00:04.324142902 ProcessGroupNCCL.cpp:1515] [PG 3 Rank 2] Process group "
    "watchdog thread terminated with exception: CUDA error: an illegal memory access was "
    "encountered CUDA kernel errors might be asynchronously reported at some other API call, so "
    "the stacktrace below might be incorrect. For debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1 Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "RuntimeError: CUDA error: device-side assert triggered",
    *TORCH_HINT,
    "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.",
    "Device-side assertions were explicitly omitted for this error check; the error probably "
    "arose while initializing the DSA handlers.",
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [59829,0,0], "
    'thread: [120,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of '
    'bounds"` failed.',
    "RuntimeError: CUDA error: operation not permitted when stream is capturing",
    *TORCH_HINT,
    f"[{T} TP0] Received sigquit from a child process. It usually means the child failed.",
]
ENGINE_NAMES = tuple(logscan.ENGINES)


def installed(name: str) -> Engine:
    """The named engine; the [fast] engines come with the test extra, so CI runs them all."""
    try:
        return logscan.engine(name)
    except EngineUnavailable as e:
        pytest.skip(str(e))


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
@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_streaming_agrees_with_a_per_line_scan_across_block_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, engine: str
) -> None:
    """Tiny blocks and line limits put signatures across every kind of boundary, in every engine."""
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
    scanner = Scanner(engine=installed(engine))
    log = tmp_path / "r.log"
    log.write_bytes(data)
    with log.open("rb") as f:
        scanner.scan(f, "r.log")
    expected = reference(data)
    report = scanner.report
    for kind, numbers in expected.items():
        finding = report.findings[kind]
        assert finding.count == len(numbers), kind
        if numbers:
            assert finding.first is not None and finding.last is not None
            assert (finding.first.line, finding.last.line) == (numbers[0], numbers[-1]), kind
    assert report.matched_lines == len({n for ns in expected.values() for n in ns})
    assert report.sources[0].lines == data.count(b"\n") + (not data.endswith(b"\n"))


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
    argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan-logs", *argv]) == code
    assert capsys.readouterr().err == message


def test_a_folder_is_refused_before_scanning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.log"
    good.write_text(SAMPLES["illegal-address"][0] + "\n")
    assert main(["scan-logs", str(good), str(tmp_path)]) == Exit.NOT_FOUND
    captured = capsys.readouterr()
    assert captured.err == f"sglang-dsv4-fix: error: {tmp_path}: is a folder, not a log file\n"
    assert captured.out == ""  # nothing scanned, nothing half-reported


def test_an_unreadable_file_is_refused_before_scanning_also_under_root() -> None:
    """Root reads a mode-0 file anyway (CI runs as root): there the CLI drops to `nobody` first."""
    with tempfile.TemporaryDirectory(prefix="scan-logs-unreadable.") as folder:
        Path(folder).chmod(0o755)  # nobody must reach the files, just not read the locked one
        good, locked = Path(folder) / "good.log", Path(folder) / "locked.log"
        good.write_text(SAMPLES["illegal-address"][0] + "\n")
        good.chmod(0o644)
        locked.write_text(SAMPLES["illegal-address"][0] + "\n")
        locked.chmod(0)
        done = as_non_root("scan-logs", str(good), str(locked))
    assert (done.returncode, done.stdout) == (Exit.NOT_FOUND, b"")
    assert done.stderr == (
        f"sglang-dsv4-fix: error: {locked}: cannot read (Permission denied)\n".encode()
    )


def as_non_root(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI in a fresh interpreter that, if root, becomes `nobody` (no groups) before main().

    It imports what the command needs first: this interpreter and its standard library may sit
    under root's home, which nobody cannot read.
    """
    nobody = pwd.getpwnam("nobody")
    script = (
        "import os, sys\n"
        "from sglang_dsv4_fix.main import build_parser, main\n"
        "from sglang_dsv4_fix.commands import scan_logs\n"
        "build_parser('scan-logs').parse_args(sys.argv[1:]), scan_logs.logscan.engine()\n"
        "if os.geteuid() == 0:\n"
        f"    os.setgroups([]); os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})\n"
        "assert os.geteuid() != 0\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, timeout=60)


def cli(*argv: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """The real CLI in a fresh interpreter."""
    cmd = [sys.executable, "-m", "sglang_dsv4_fix", "scan-logs", *argv]
    return subprocess.run(cmd, timeout=60, **kwargs)


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


def test_a_truncated_gzip_keeps_the_findings_of_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Findings made before (other files, and the .gz's own readable part) are printed, then 7."""
    before = tmp_path / "a.log"
    before.write_text(f"{NOISE[0]}\n{SAMPLES['nccl-watchdog'][0]}\n")
    body = f"{NOISE[1]}\n{SAMPLES['illegal-address'][0]}\n".encode() + random.Random(1).randbytes(
        1 << 20
    )
    cut = tmp_path / "b.log.gz"
    cut.write_bytes(gzip.compress(body)[:600_000])
    message = (
        f"{cut}: cannot read (Compressed file ended before the end-of-stream marker was reached)"
    )
    code, payload = _main_json(str(before), str(cut))
    assert code == Exit.NOT_FOUND and payload["exit"] == Exit.NOT_FOUND
    assert [f["id"] for f in payload["findings"]] == ["illegal-address", "nccl-watchdog"]
    assert [f["error"] for f in payload["files"]] == [None, message.split(": ", 1)[1]]
    read_whole = payload["files"][1]["lines"]
    assert read_whole >= 2
    capsys.readouterr()
    assert main(["scan-logs", str(before), str(cut)]) == Exit.NOT_FOUND
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out[0] == (
        f"scanned 2 file(s), {2 + read_whole} lines: 2 failure signature(s) in 2 line(s)"
    )
    assert f"  first: {before}:2: {SAMPLES['nccl-watchdog'][0]}" in out
    assert f"  first: {cut}:2: {SAMPLES['illegal-address'][0]}" in out
    assert out[-2] == f"incomplete: {message} after line {read_whole}"
    assert captured.err == f"sglang-dsv4-fix: error: {message}\n"


def test_no_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["scan-logs"])
    assert e.value.code == Exit.USAGE
    assert "the following arguments are required: FILE" in capsys.readouterr().err


def every_hit(engine: Engine, data: bytes) -> list[tuple[int, frozenset[str]]]:
    """(line number, signature ids) of every line of ``data`` that the engine says holds one."""
    return [(data.count(b"\n", 0, a) + 1, kinds) for a, _, kinds in engine.hits(data, len(data))]


def reference_hits(data: bytes) -> list[tuple[int, frozenset[str]]]:
    hits: dict[int, set[str]] = {}
    for kind, numbers in reference(data).items():
        for n in numbers:
            hits.setdefault(n, set()).add(kind)
    return [(n, frozenset(kinds)) for n, kinds in sorted(hits.items())]


def near_misses(rng: random.Random, line: str) -> str:
    """A sample with one character dropped, doubled or swapped in case: may or may not match."""
    i = rng.randrange(len(line))
    return rng.choice(
        (line[:i] + line[i + 1 :], line[:i] + line[i] * 2 + line[i:], line.swapcase())
    )


def generated_log(seed: int) -> bytes:
    rng = random.Random(seed)
    samples = [x for xs in SAMPLES.values() for x in xs] + [x for x in REAL_CRASH if x]
    lines = []
    for _ in range(3000):
        r = rng.random()
        if r < 0.08:
            lines.append(rng.choice(samples))
        elif r < 0.16:
            lines.append(near_misses(rng, rng.choice(samples)))
        elif r < 0.18:
            lines.append(rng.choice(samples) + "\r " + rng.choice(samples))
        elif r < 0.2:
            lines.append(rng.randbytes(rng.randrange(200)).replace(b"\n", b"").decode("latin-1"))
        else:
            lines.append(rng.choice(NOISE))
    return "\n".join(lines).encode("utf-8", "surrogateescape")


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("seed", range(4))
def test_every_engine_finds_the_same_lines_on_generated_logs(engine: str, seed: int) -> None:
    data = generated_log(seed)
    expected = reference_hits(data)
    assert len(expected) > 200  # the log does exercise the signatures
    assert every_hit(installed(engine), data) == expected


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_engine_finds_the_same_lines_on_real_messages(engine: str) -> None:
    data = "\n".join([*NOISE, *REAL_CRASH, *NOISE]).encode()
    n = len(NOISE)
    assert every_hit(installed(engine), data) == [
        (n + 1, frozenset({"scheduler-exception"})),
        (n + 3, frozenset({"illegal-address"})),
        (n + 9, frozenset({"nccl-watchdog", "illegal-address"})),
        (n + 10, frozenset({"device-assert"})),
        (n + 16, frozenset({"device-assert"})),
        (n + 17, frozenset({"cuda-graph-capture"})),
        (n + 21, frozenset({"scheduler-exception"})),
    ]


def test_the_cli_reports_the_same_with_every_engine(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    log.write_bytes(generated_log(7))
    reports = {}
    for name in ENGINE_NAMES:
        installed(name)
        code, out = _main_json("--engine", name, str(log))
        assert (code, out.pop("engine")) == (Exit.FINDINGS, name)
        reports[name] = out
    assert reports["python"] == reports["re2"] == reports["hyperscan"]


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_pytorchs_dsa_hint_after_every_cuda_error_is_not_a_device_assert(
    tmp_path: Path, engine: str
) -> None:
    installed(engine)
    error = SAMPLES["illegal-address"][0]
    code, out = scan(
        tmp_path, "\n".join([*NOISE, error, *TORCH_HINT, *NOISE]) + "\n", "--engine", engine
    )
    assert code == Exit.FINDINGS
    assert [(f["id"], f["count"]) for f in out["findings"]] == [("illegal-address", 1)]


def test_auto_falls_back_to_re2_then_python(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text(SAMPLES["device-assert"][0] + "\n")
    for blocked, engine in ((["hyperscan"], "re2"), (["hyperscan", "re2"], "python")):
        done = without_modules(blocked, "scan-logs", "--json", str(log))
        assert done.returncode == Exit.FINDINGS, done.stderr
        assert json.loads(done.stdout)["engine"] == engine
    done = without_modules(["re2"], "scan-logs", "--engine", "re2", str(log))
    assert (done.returncode, done.stdout) == (Exit.ENVIRONMENT, b"")
    assert done.stderr == (
        b"sglang-dsv4-fix: error: --engine re2: the re2 engine needs the google-re2 package "
        b"(the [fast] extra)\n"
    )


def without_modules(blocked: list[str], *argv: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI in an interpreter where importing ``blocked`` fails, as if not installed."""
    script = (
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({blocked!r}))\n"
        "from sglang_dsv4_fix.main import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, timeout=60)


@pytest.mark.parametrize("jobs", ["1", "3"])
def test_files_scanned_in_parallel_report_in_argument_order(tmp_path: Path, jobs: str) -> None:
    rng = random.Random(5)
    names = []
    for i in range(7):
        log = tmp_path / f"{i}.log"
        log.write_bytes(generated_log(rng.randrange(100)) if i % 3 else b"quiet\n")
        names.append(str(log))
    names.append(names[1])  # the same file twice is two inputs
    code, out = _main_json("--jobs", jobs, *names)
    code_1, out_1 = _main_json("--jobs", "1", "--engine", "python", *names)
    out.pop("engine")
    out_1.pop("engine")
    assert (code, out) == (code_1, out_1)
    assert [f["file"] for f in out["files"]] == names
    first = {f["id"]: f["first"]["file"] for f in out["findings"]}
    last = {f["id"]: f["last"]["file"] for f in out["findings"]}
    assert set(first.values()) == {names[1]} and set(last.values()) == {names[1]}


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("pieces", [True, False], ids=["in-pieces", "at-once"])
def test_a_fifo_is_opened_once_and_read_as_a_stream(
    tmp_path: Path, jobs: str, pieces: bool
) -> None:
    """The writer comes late; writes 1 MB in pieces, or a few lines at once and goes (`echo`).

    Opened twice, the FIFO loses what a quick writer wrote before the first close and the second
    open waits forever (seen 5 of 5 times with `printf ... > FIFO` on the previous version).
    """
    fifo, after = tmp_path / "server.fifo", tmp_path / "after.log"
    os.mkfifo(fifo)
    after.write_text(f"{NOISE[0]}\n{SAMPLES['scheduler-exception'][0]}\n")
    lines = [*NOISE * (2000 if pieces else 1), SAMPLES["illegal-address"][0]]
    lines += [*NOISE, SAMPLES["nccl-watchdog"][0]]
    data = ("\n".join(lines) + "\n").encode()
    size = len(data) // 40 + 1 if pieces else len(data)
    cmd = [sys.executable, "-m", "sglang_dsv4_fix", "scan-logs", "--json", "--jobs", jobs]
    with subprocess.Popen([*cmd, str(fifo), str(after)], stdout=subprocess.PIPE) as proc:
        try:
            time.sleep(0.5)  # reading before a writer came would see an empty FIFO
            writer = open_writer(fifo, proc)
            for i in range(0, len(data), size):  # at once: os.write and close, as quick as echo
                os.write(writer, data[i : i + size])
                if pieces:
                    time.sleep(0.005)
            os.close(writer)
            out, _ = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == Exit.FINDINGS
    report = json.loads(out)
    n = len(lines)
    assert [(f["file"], f["lines"]) for f in report["files"]] == [(str(fifo), n), (str(after), 2)]
    assert [(f["id"], f["first"]["file"], f["first"]["line"]) for f in report["findings"]] == [
        ("illegal-address", str(fifo), n - 8),
        ("nccl-watchdog", str(fifo), n),
        ("scheduler-exception", str(after), 2),
    ]


def open_writer(fifo: Path, reader: subprocess.Popen[bytes]) -> int:
    """The write end, once the reader has the FIFO open (bounded: a reader may never come)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
        except OSError:
            assert reader.poll() is None and time.monotonic() < deadline, "no reader came"
            time.sleep(0.02)
            continue
        os.set_blocking(fd, True)
        return fd


def test_a_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan-logs", "/dev/null"]) == Exit.NOT_FOUND
    assert capsys.readouterr().err == (
        "sglang-dsv4-fix: error: /dev/null: not a regular file or a FIFO\n"
    )


def test_terminal_control_sequences_are_escaped_in_text_not_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = "\x1b]0;owned\x07\x1b[2J" + SAMPLES["illegal-address"][0] + "\rtab\tC1:\x9b31m\x7f"
    log = tmp_path / "a\x1b[31m.log"
    log.write_bytes(raw.encode() + b"\n")
    assert main(["scan-logs", str(log)]) == Exit.FINDINGS
    out = capsys.readouterr().out
    shown = str(tmp_path) + "/a\\x1b[31m.log"
    assert f"  first: {shown}:1: \\x1b]0;owned\\x07\\x1b[2J{SAMPLES['illegal-address'][0]}" in out
    assert "\\x0dtab\tC1:\\x9b31m\\x7f\n" in out
    assert not set(out) & {chr(c) for c in (*range(9), *range(11, 32), 0x7F, *range(0x80, 0xA0))}
    code, payload = _main_json(str(log))
    assert code == Exit.FINDINGS
    assert payload["findings"][0]["first"] == {"file": str(log), "line": 1, "text": raw}


@pytest.mark.parametrize("json_flag", [["--json"], []])
def test_a_reader_that_went_away_keeps_exit_10_without_a_traceback(
    tmp_path: Path, json_flag: list[str]
) -> None:
    log = tmp_path / "s.log"
    log.write_text(SAMPLES["illegal-address"][0] + "\n")
    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE (Python ignores SIGPIPE)
    try:
        done = cli(*json_flag, str(log), stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (Exit.FINDINGS, b"")


def test_json_piped_into_head_keeps_exit_10(tmp_path: Path) -> None:
    """`scan-logs --json ... | head -c 10` with more output than a pipe holds."""
    log = tmp_path / ("x" * 200 + ".log")
    log.write_text(SAMPLES["illegal-address"][0] + "\n")
    cmd = [sys.executable, "-m", "sglang_dsv4_fix", "scan-logs", "--json", *[str(log)] * 300]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as scan_proc:
        assert scan_proc.stdout is not None and scan_proc.stderr is not None
        head = subprocess.run(["head", "-c", "10"], stdin=scan_proc.stdout, capture_output=True)
        scan_proc.stdout.close()
        err = scan_proc.stderr.read()
        scan_proc.wait(timeout=60)
    assert head.stdout == b'{\n  "engin'
    assert (scan_proc.returncode, err) == (Exit.FINDINGS, b"")


def test_progress_is_told_while_a_stream_is_read_and_when_it_is_done() -> None:
    import io

    body = "".join(f"{NOISE[i % len(NOISE)]}\n" for i in range(40_000)).encode()
    assert len(body) > 4 * logscan.BLOCK
    calls: list[tuple[int, int, bool]] = []
    scanner = Scanner(
        progress=lambda s, seconds, done: calls.append((s.bytes, s.lines, done)), every=0.0
    )
    scanner.scan(io.BytesIO(body), "mem.log")
    *reading, last = calls
    assert last == (len(body), 40_000, True)
    assert len(reading) >= 4 and not any(done for *_, done in reading)
    assert reading == sorted(reading) and reading[-1] < last
    for read, lines, _ in reading:  # lines counted are whole lines within what was read
        assert lines <= body.count(b"\n", 0, read)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_progress_lines_only_when_asked_and_one_done_line_per_file(
    tmp_path: Path, jobs: str
) -> None:
    clean, hit, cut = tmp_path / "clean.log", tmp_path / "hit.log", tmp_path / "cut.log.gz"
    clean.write_text("quiet\n" * 7)
    hit.write_text(f"{NOISE[0]}\n{SAMPLES['illegal-address'][0]}\n")
    cut.write_bytes(gzip.compress(random.Random(2).randbytes(1 << 20))[:300_000])
    files = [str(clean), str(hit), str(cut)]
    plain = cli("--jobs", jobs, *files, capture_output=True)  # standard error is not a terminal
    asked = cli("--jobs", jobs, "--progress", *files, capture_output=True)
    assert plain.returncode == asked.returncode == Exit.NOT_FOUND
    assert asked.stdout == plain.stdout
    done = re.compile(rb"^scan-logs: (\S+): (done|incomplete), [\d.,]+ MiB, ([\d,]+) lines, ")
    told = {m[1].decode(): (m[2], m[3]) for m in map(done.match, asked.stderr.splitlines()) if m}
    assert told[str(clean)] == (b"done", b"7") and told[str(hit)] == (b"done", b"2")
    assert told[str(cut)][0] == b"incomplete" and set(told) == set(files)
    errors = [x for x in plain.stderr.splitlines() if not x.startswith(b"scan-logs: ")]
    assert plain.stderr.splitlines() == errors  # no progress line unless asked
    assert [x for x in asked.stderr.splitlines() if not x.startswith(b"scan-logs: ")] == errors
    silent = cli("--no-progress", str(hit), capture_output=True)
    assert silent.returncode == Exit.FINDINGS and silent.stderr == b""


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_by_default_on_a_terminal_unless_quiet(tmp_path: Path, quiet: bool) -> None:
    import pty

    log = tmp_path / "server.log"
    log.write_text("quiet\n" * 3)
    controller, terminal = pty.openpty()
    try:
        done = cli(
            *(["--quiet"] if quiet else []), str(log), stdout=subprocess.PIPE, stderr=terminal
        )
        os.close(terminal)
        told = b""
        while chunk := _read_pty(controller):
            told += chunk
    finally:
        os.close(controller)
    assert done.returncode == Exit.OK
    expected = b"" if quiet else f"scan-logs: {log}: done, 0.0 MiB, 3 lines, ".encode()
    assert told.startswith(expected) and (told == b"") == quiet


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: every terminal end is closed
        return b""
