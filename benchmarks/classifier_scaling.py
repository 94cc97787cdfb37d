"""The classifier on hostile text: the old constant scanner against the linear one, then 10 MB.

Usage: python benchmarks/classifier_scaling.py [--release 0.5.16] [--mb 10]
Part 1 times ``constants()`` (the scanner the plugin runs at every SGLang start) on the real
kernel with ``const x = `` runs (no ``;``) appended, for the previous regex-and-passes scanner
(kept here verbatim as the baseline) and the current one, side by side. Part 2 times the whole
``classify()`` on the real kernel with --mb megabytes of each hostile pattern appended.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trees import fetch_wheel

from sglang_dsv4_fix import kernel
from sglang_dsv4_fix.kernel import _ARITHMETIC, _IDENT, WARP_THREADS, classify, constants, fold

PATTERNS = {
    "const runs without ';'": "const x = ",
    "constexpr chains": "constexpr int kA = kB + ",
    "consts before one '='": "const const ",
    "unbalanced brackets": "{ ( [ ",
    "open block comment": "/* ",
    "string literals": '"abc\\" ',
    "launch sites": "LaunchKernel(a, b, ",
    "launch bounds": "__launch_bounds__(aa ",
    "kernel0 mentions": "plan_compress_prefill_kernel0(x) ",
    "plain words": "abcdefgh ",
}


def old_constants(text: str) -> dict[str, int]:
    """The scanner before the linear rewrite (quadratic on ``const`` runs without ``;``)."""
    defs = re.findall(rf"\b(?:constexpr|const)\b[^;=(){{}}]*?\b({_IDENT})\s*=\s*([^;{{}}]+);", text)
    known: dict[str, int] = {"kWarpThreads": WARP_THREADS}
    pending = [(name, expr) for name, expr in defs if _ARITHMETIC.match(expr)]
    while pending:
        left = []
        for n, e in pending:
            value = None if n in known else fold(e, known)
            if value is not None:
                known[n] = value
            elif n not in known:
                left.append((n, e))
        if len(left) == len(pending):
            break
        pending = left
    return known


def seconds(fn: object, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", default="0.5.16")
    parser.add_argument("--mb", type=float, default=10.0)
    args = parser.parse_args()
    with zipfile.ZipFile(fetch_wheel(args.release)) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith("deepseek_v4/c_plan.cuh"))
        real = wheel.read(name).decode("utf-8")
    masked = kernel.mask_comments(kernel.normalise(real))
    print(f"constants() on the {args.release} kernel + 'const x = ' runs")
    print(f"{'appended':>10} {'previous':>12} {'linear':>10}")
    for kb in (25, 50, 100):
        text = masked + "const x = " * (kb * 1024 // 10)
        print(
            f"{kb:>7} KB {seconds(old_constants, text):>10.3f} s {seconds(constants, text):>8.4f} s"
        )
    size = int(args.mb * 1024 * 1024)
    print(f"\nclassify() on the {args.release} kernel + {args.mb:g} MB of each pattern")
    for label, pattern in PATTERNS.items():
        text = real + pattern * (size // len(pattern))
        t0 = time.perf_counter()
        variant = classify(text).variant
        print(f"{label:>24}: {time.perf_counter() - t0:6.2f} s  ({variant})")


if __name__ == "__main__":
    main()
