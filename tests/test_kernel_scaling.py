"""The classifier is linear in its input: hostile text appended to a real kernel cannot stall it.

The plugin classifies the kernel at every SGLang process start, so a file that makes the parser
quadratic (``const x = `` runs without ``;`` took 4/16/65 s for 100/200/400 KB) would stall every
server. Each pattern is appended to the real 0.5.16 ``c_plan.cuh`` at two sizes, 8x apart: a
linear classifier takes about 8x as long, a quadratic one 64x. The absolute budget on the small
size stops a quadratic scan early instead of waiting for it. ``benchmarks/classifier_scaling.py``
times 10 MB.
"""

from __future__ import annotations

import time

import pytest
from trees import fetch_wheel

from sglang_dsv4_fix.kernel import classify, constants

PATTERNS = {
    "const runs without ';'": "const x = ",
    "constexpr chains": "constexpr int kA = kB + ",
    "consts before one '='": "const const ",
    "'=' after a bracket": "const ]= ",
    "unbalanced brackets": "{ ( [ ",
    "open block comment": "/* ",
    "string literals": '"abc\\" ',
    "launch sites": "LaunchKernel(a, b, ",
    "launch bounds": "__launch_bounds__(aa ",
    "kernel0 mentions": "plan_compress_prefill_kernel0(x) ",
}
SMALL = 100_000
GROWTH = 8
BUDGET_S = 1.0  # for SMALL bytes; the scan takes ~10 ms
MAX_RATIO = 24  # linear: ~8; quadratic: ~64


@pytest.fixture(scope="module")
def real_kernel() -> str:
    import zipfile

    with zipfile.ZipFile(fetch_wheel("0.5.16")) as wheel:
        return wheel.read("sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh").decode("utf-8")


def best_of(text: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        classify(text)
        times.append(time.process_time() - t0)
        if times[-1] > BUDGET_S * GROWTH * 2:  # far too slow already: no need to repeat
            break
    return min(times)


@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=list(PATTERNS))
def test_classify_time_grows_linearly(real_kernel: str, pattern: str) -> None:
    small = real_kernel + pattern * (SMALL // len(pattern))
    large = real_kernel + pattern * (SMALL * GROWTH // len(pattern))
    t_small = best_of(small, 3)
    assert t_small < BUDGET_S, f"{SMALL} bytes of {pattern!r} took {t_small:.2f} s"
    t_large = max(best_of(large, 3), 1e-3)
    ratio = t_large / max(t_small, 1e-3)
    assert ratio < MAX_RATIO, (
        f"{GROWTH}x the input took {ratio:.1f}x the time ({t_small:.3f} s -> {t_large:.3f} s)"
    )
    assert classify(large).variant == "racy-init"  # the appended text changes nothing


def test_constants_unchanged_by_the_linear_scan() -> None:
    """Definitions that refer to later ones settle in passes over the text; the first to settle
    a name wins (here ``a = 99``, in the pass that also settles ``c``, before ``b``)."""
    text = "const int a = b * 2; constexpr int b = c + 1; const c = 3; const int a = 99;"
    assert constants(text) == {"kWarpThreads": 32, "c": 3, "b": 4, "a": 99}
    assert constants("const x = y; const x = 5; const y = 3;") == {
        "kWarpThreads": 32,
        "x": 5,
        "y": 3,
    }
    # f: a '(' before the '='; g: its expression runs to the ';' and holds an '='.
    assert constants("const int f(x) = 3; const g = 1 + const h = 2;") == {"kWarpThreads": 32}
    huge = "const a = 4294967296; const b = a * a * a * a * a; const c = b * b;"
    assert constants(huge) == {"kWarpThreads": 32, "a": 4294967296}  # over 2**64: not folded
