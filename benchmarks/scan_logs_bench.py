"""Benchmark: `sglang-dsv4-fix scan-logs`, each engine, versus `grep -E` of the same patterns, one log.

    python benchmarks/scan_logs_bench.py [--size-gb 1] [--dir /tmp] [--runs 2] [--engines ...]

Writes an SGLang-style log (prefill/decode/HTTP lines, a few very long lines, planted failure
signatures at known lines) into a temporary folder under --dir, reads it once untimed so every
arm sees it in the page cache, then per run times, in turn: `grep -E -c` with the signatures'
patterns, the real CLI (`scan-logs --json --engine E`) for every engine installed here, and the
fastest engine on the log named twice with `--jobs 1` and `--jobs 2` (two files in parallel).
Prints MB/s, wall seconds, peak RSS and the ratio to grep's MB/s in the same run, and checks that
every arm's matched-line count equals grep's and the planted count. The folder is removed at the
end. Run it from outside the repository with the interpreter that has the package installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_dsv4_fix.logscan import ENGINES, SIGNATURES

BLOCK_LINES = 20_000
PLANTED = (
    "[{t} TP{r}] RuntimeError: CUDA error: an illegal memory access was encountered",
    "[{t} TP{r}] Scheduler hit an exception: Traceback (most recent call last):",
    "[rank{r}]:[E1202 {t} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=4242, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
    "[{t} TP{r}] Exception: Capture cuda graph failed: CUDA error: operation not permitted when "
    "stream is capturing",
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [7,0,0], thread: "
    '[64,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.',
)
NOISE = (
    "[{t} TP{r}] Prefill batch, #new-seq: {a}, #new-token: {b}, #cached-token: {c}, token usage: "
    "0.{a}, #running-req: {a}, #queue-req: 0, input throughput (token/s): {b}.{c}",
    "[{t} TP{r}] Decode batch, #running-req: {a}, #token: {b}, token usage: 0.{c}, cuda graph: "
    "True, gen throughput (token/s): {b}.{a}, #queue-req: 0",
    '[{t}] INFO:     10.0.{a}.{c}:{b} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
)
ANCHOR_ONLY = "[{t} TP{r}] Watchdog Scheduler initialized."  # an anchor, not a signature


def grep_pattern() -> str:
    """The signatures as one POSIX ERE (GNU grep understands \\w)."""
    parts = []
    for sig in SIGNATURES:
        ere = sig.pattern.pattern.decode().replace("(?:", "(").replace("*?", "*")
        parts.append(
            ere.replace("\\w", "[[:alnum:]_]").replace("[[[:alnum:]_] -]", "[[:alnum:]_ -]")
        )
    return "|".join(parts)


def make_block(rng: random.Random, planted_every: int) -> tuple[bytes, int]:
    lines, planted = [], 0
    for i in range(BLOCK_LINES):
        t = f"2026-12-02 {rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
        fields = {
            "t": t,
            "r": rng.randrange(8),
            "a": rng.randrange(1, 256),
            "b": rng.randrange(1, 65536),
            "c": rng.randrange(1000),
        }
        if i % planted_every == planted_every - 1:
            lines.append(rng.choice(PLANTED).format(**fields))
            planted += 1
        elif i % 5_000 == 7:
            lines.append(ANCHOR_ONLY.format(**fields))
        elif i == BLOCK_LINES // 2:
            lines.append(
                "[{t} TP0] Received reqs: ".format(**fields) + "x" * rng.randrange(10_000, 200_000)
            )
        else:
            lines.append(rng.choice(NOISE).format(**fields))
    return ("\n".join(lines) + "\n").encode(), planted


def generate(path: Path, size: int, seed: int = 32467) -> int:
    rng = random.Random(seed)
    blocks = [make_block(rng, planted_every=rng.choice((2_000, 5_000, 20_000))) for _ in range(16)]
    written = planted = 0
    with path.open("wb", buffering=1 << 22) as f:
        while written < size:
            data, n = rng.choice(blocks)
            f.write(data)
            written += len(data)
            planted += n
    return planted


def timed(cmd: list[str]) -> tuple[float, int, bytes]:
    """(wall seconds, peak RSS in KiB, stdout) of one child process.

    Peak RSS is polled from /proc/PID/status (VmHWM) while it runs: on some kernels (this VM's)
    ru_maxrss from wait4 includes the parent's memory and is useless. The output must fit a pipe.
    """
    read_fd, write_fd = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, write_fd, 1), (os.POSIX_SPAWN_CLOSE, read_fd)]
    start = time.perf_counter()
    pid = os.posix_spawnp(cmd[0], cmd, os.environ, file_actions=actions)
    os.close(write_fd)
    peak = 0
    while (done := os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)) is None:
        peak = max(peak, _hwm(pid))
        time.sleep(0.02)
    peak = max(peak, _hwm(pid))
    elapsed = time.perf_counter() - start
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as pipe:
        out = pipe.read()
    if done.si_status not in (0, 1, 10):  # grep: 1 = no match; scan-logs: 10 = findings
        sys.exit(f"{cmd[0]} failed with {done.si_status}")
    return elapsed, peak, out


def _hwm(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:")), 0)


def installed_engines() -> list[str]:
    modules = {"hyperscan": "hyperscan", "re2": "re2"}
    return [e for e in ENGINES if e not in modules or importlib.util.find_spec(modules[e])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--engines", nargs="+", choices=list(ENGINES), default=installed_engines())
    args = ap.parse_args()
    if not Path(args.dir).is_dir():
        sys.exit(f"{ap.prog}: error: --dir {args.dir}: no such folder")
    size = int(args.size_gb * 1e9)
    free = shutil.disk_usage(args.dir).free
    if free < size * 1.5:
        sys.exit(
            f"{ap.prog}: error: {args.dir}: {free / 1e9:.1f} GB free, need {size * 1.5 / 1e9:.1f} GB"
        )
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="scan-logs-bench.") as tmp:
        log = Path(tmp) / "server.log"
        t0 = time.perf_counter()
        planted = generate(log, size)
        print(
            f"generated {log.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s "
            f"({planted} planted signature lines)"
        )
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # page cache
        return bench(log, planted, args.engines, args.runs)


def bench(log: Path, planted: int, engines: list[str], runs: int) -> int:
    mb = log.stat().st_size / 1e6
    cli = [sys.executable, "-m", "sglang_dsv4_fix", "scan-logs", "--json"]
    arms: list[tuple[str, list[str], int]] = [
        (f"scan-logs --engine {e}", [*cli, "--engine", e, str(log)], 1) for e in engines
    ]
    best = engines[0]  # the order of ENGINES: fastest first
    arms += [
        (
            f"{best}, 2 files --jobs {j}",
            [*cli, "--engine", best, "--jobs", str(j), str(log), str(log)],
            2,
        )
        for j in (1, 2)
    ]
    print(f"grep command: grep -E -c '{grep_pattern()}' server.log")
    print(f"{'run arm':<40} {'MB/s':>6} {'x grep':>7} {'wall s':>7} {'RSS MiB':>8} {'lines':>6}")
    ok = True
    for run in range(1, runs + 1):
        g_s, g_rss, g_out = timed(["grep", "-E", "-c", grep_pattern(), str(log)])
        grep_mbs = mb / g_s
        print(
            f"{run} {'grep -E -c':<38} {grep_mbs:6.0f} {1:7.2f} {g_s:7.2f} {g_rss / 1024:8.0f} {int(g_out):6}"
        )
        for name, cmd, files in arms:
            s, rss, out = timed(cmd)
            matched = json.loads(out)["matched_lines"]
            mbs = mb * files / s
            print(
                f"{run} {name:<38} {mbs:6.0f} {mbs / grep_mbs:7.2f} {s:7.2f} {rss / 1024:8.0f} {matched:6}"
            )
            ok = ok and matched == int(g_out) * files == planted * files
    if not ok:
        print(f"MISMATCH: planted {planted}: an arm's matched-line count differs (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
