"""Whole-process wall time of `verify` and `apply --check` on a real tree, next to `git apply --check`.

    python benchmarks/cli_bench.py [--release 0.5.16] [--runs 30]

Builds a git checkout of the release from its real wheel (tests/trees.py), then times each command
as a fresh process, interleaved, and prints median / p90 / min in milliseconds. Target: verify
median <= 150 ms.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trees import make_git_tree

from sglang_dsv4_fix import manifest


def commands(root: Path, release: str) -> dict[str, tuple[str, ...]]:
    patch = (
        resources.files("sglang_dsv4_fix.patches")
        / manifest.load().releases[release].results["no-init"].patch
    )
    tool = (sys.executable, "-m", "sglang_dsv4_fix")
    return {
        "sglang-dsv4-fix verify": (*tool, "verify", "--tree", str(root)),
        "sglang-dsv4-fix apply --check": (*tool, "apply", "--check", "--tree", str(root)),
        "git apply --check (baseline)": ("git", "-C", str(root), "apply", "--check", str(patch)),
        "python -c pass (interpreter floor)": (sys.executable, "-c", "pass"),
    }


def time_once(cmd: tuple[str, ...]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", default="0.5.16")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = make_git_tree(args.release, Path(tmp) / "co")
        cmds = commands(root, args.release)
        samples: dict[str, list[float]] = {name: [] for name in cmds}
        for cmd in cmds.values():
            time_once(cmd)  # warm the page cache
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                samples[name].append(time_once(cmd))
    print(f"release {args.release}, git checkout, {args.runs} runs each, interleaved (ms)")
    print(f"{'command':<38} {'median':>8} {'p90':>8} {'min':>8}")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:<38} {statistics.median(values):8.1f} {p90:8.1f} {min(values):8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
