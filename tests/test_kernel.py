from __future__ import annotations

import pytest
from kernels import kernel_text
from trees import AFFECTED, FIXED

from sglang_dsv4_fix.kernel import classify
from sglang_dsv4_fix.rewrite import rewrite

INIT = """  if (tx < kNumWarps) {
    warp_max[tx] = 0;
    warp_min[tx] = 0xFFFFFFFFu;
  }
"""
PER_WARP = "  warp_max[warp_id] = warp::reduce_max(e_for_max);\n"
READ_BARRIER = "  warp_min[warp_id] = warp::reduce_min(e_for_min);\n  __syncthreads();\n"


def base() -> str:
    text = kernel_text("0.5.16")
    assert INIT in text and PER_WARP in text and READ_BARRIER in text
    return text


@pytest.mark.parametrize("version", AFFECTED)
def test_affected_releases_are_racy(version: str) -> None:
    verdict = classify(kernel_text(version))
    assert verdict.variant == "racy-init"
    assert verdict.preconditions_ok and not verdict.safe


@pytest.mark.parametrize("version", FIXED)
def test_fixed_releases_are_no_init_and_safe(version: str) -> None:
    verdict = classify(kernel_text(version))
    assert (verdict.variant, verdict.safe) == ("no-init", True)


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.15", "0.5.16"])
@pytest.mark.parametrize("target", ["no-init", "barrier"])
def test_rewrite_gives_a_safe_target(version: str, target: str) -> None:
    verdict = classify(rewrite(kernel_text(version), target))  # type: ignore[arg-type]
    assert (verdict.variant, verdict.safe) == (target, True)


def test_no_init_rewrite_is_the_upstream_hunk() -> None:
    # 0.5.18 is upstream's no-init: the same five lines are gone from the same place.
    fixed = rewrite(base(), "no-init")
    assert fixed == base().replace(INIT + "\n", "")


def test_barrier_goes_right_after_the_init_block() -> None:
    assert rewrite(base(), "barrier") == base().replace(INIT, INIT + "  __syncthreads();\n")


def test_crlf_comments_and_whitespace_do_not_matter() -> None:
    noisy = base().replace(INIT, "  /* scratch */\n" + INIT.replace("{", "{  // init", 1))
    noisy = noisy.replace("  ", "\t").replace("\n", "\r\n")
    assert classify(noisy).variant == "racy-init"
    fixed = rewrite(noisy, "barrier")
    assert classify(fixed).variant == "barrier"
    assert fixed.count("\n") == fixed.count("\r\n")


def test_commented_out_init_is_no_init() -> None:
    commented = base().replace(INIT, "  /*\n" + INIT + "  */\n")
    assert classify(commented).variant == "no-init"


def test_commented_out_barrier_is_still_racy() -> None:
    commented = base().replace(INIT, INIT + "  // __syncthreads();\n")
    assert classify(commented).variant == "racy-init"


OTHER_SPELLING = """  if (threadIdx.x < 32) { warp_min[threadIdx.x] = ~0u; warp_max[threadIdx.x] = 0u; }
"""


def test_init_in_another_spelling_without_barrier_is_racy() -> None:
    assert classify(base().replace(INIT, OTHER_SPELLING)).variant == "racy-init"


def test_unguarded_init_by_lane_is_racy() -> None:
    lane = "  warp_max[lane_id] = 0;\n  warp_min[lane_id] = 0xFFFFFFFFu;\n"
    assert classify(base().replace(INIT, lane)).variant == "racy-init"


@pytest.mark.parametrize(
    "placement",
    [
        pytest.param(lambda t: t.replace(INIT, "  __syncthreads();\n" + INIT), id="before-init"),
        pytest.param(
            lambda t: t.replace(INIT, INIT.replace("  }\n", "    __syncthreads();\n  }\n")),
            id="inside-the-init-branch",
        ),
        pytest.param(
            lambda t: t.replace(INIT, INIT + "  if (tx == 0) { __syncthreads(); }\n"),
            id="conditional",
        ),
    ],
)
def test_barrier_in_the_wrong_place_is_racy(placement) -> None:  # type: ignore[no-untyped-def]
    assert classify(placement(base())).variant == "racy-init"


def _no_init() -> str:
    return base().replace(INIT + "\n", "")


@pytest.mark.parametrize(
    ("edit", "violated"),
    [
        (
            ("LaunchKernel(1, kMaxPrefillBatchSize", "LaunchKernel(2, kMaxPrefillBatchSize"),
            "one block of 1024 threads",
        ),
        (
            ("kMaxPrefillBatchSize = 1024", "kMaxPrefillBatchSize = 2048"),
            "32 warps (kNumWarps == block / 32)",
        ),
        (("__launch_bounds__(1024, 1)", "__launch_bounds__(512, 1)"), "one block of 1024 threads"),
        (
            (PER_WARP, f"  if (tx < params.batch_size) {{\n  {PER_WARP}  }}\n"),
            "every warp writes its own slot",
        ),
        (
            (READ_BARRIER, READ_BARRIER.replace("  __syncthreads();\n", "")),
            "barrier between per-warp writes and warp 0's read",
        ),
        (("if (warp_id == 0) {", "if (warp_id == 1) {"), "warp 0 reads exactly kNumWarps lanes"),
    ],
)
def test_violated_preconditions_make_no_init_unsafe(edit: tuple[str, str], violated: str) -> None:
    text = _no_init()
    assert edit[0] in text
    verdict = classify(text.replace(*edit))
    assert not verdict.safe
    assert violated in [p.name for p in verdict.preconditions if not p.ok]


def test_missing_kernel0_is_unknown() -> None:
    verdict = classify(base().replace("plan_compress_prefill_kernel0", "plan_other_kernel"))
    assert (verdict.variant, verdict.reason) == (
        "unknown",
        "no definition of plan_compress_prefill_kernel0",
    )


def test_per_warp_writes_edited_out_is_unknown() -> None:
    verdict = classify(base().replace(PER_WARP, ""))
    assert verdict.variant == "unknown"
    assert "per-warp write" in verdict.reason


def test_write_between_per_warp_writes_and_read_is_unknown() -> None:
    late = READ_BARRIER.replace(
        "  __syncthreads();\n", "  warp_max[lane_id] = 0;\n  __syncthreads();\n"
    )
    assert classify(_no_init().replace(READ_BARRIER, late)).variant == "unknown"


def test_truncated_kernel_is_unknown() -> None:
    text = base()
    cut = text[: text.index("plan_compress_prefill_kernel0") + 400]
    assert classify(cut).variant == "unknown"
