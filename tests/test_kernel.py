from __future__ import annotations

import pytest
from kernels import kernel_text
from trees import AFFECTED, FIXED

from sglang_dsv4_fix import kernel
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


# --------------------------------------------------------------------------- every clause, every release
# Each edit breaks exactly one clause of one precondition's `ok = ...` in kernel.py (or the two
# clauses that share one fact), so dropping that clause from the check changes the verdict. The
# whole set of failed preconditions is asserted, not just membership: a clause that is removed
# while another failure hides it would otherwise go unnoticed.

LAUNCH = "one block of 1024 threads"
WARPS = "32 warps (kNumWarps == block / 32)"
WRITES = "every warp writes its own slot"
BARRIER = "barrier between per-warp writes and warp 0's read"
READS = "warp 0 reads exactly kNumWarps lanes"
ALL = [LAUNCH, WARPS, WRITES, BARRIER, READS]

CLAUSE_EDITS: dict[str, tuple[str, str, list[str]]] = {
    # _single_block_launch: grid == 1, block == 1024, bound == 1024, exactly one launch site
    "grid-2": (
        r"LaunchKernel\(1, kMaxPrefillBatchSize,",
        "LaunchKernel(2, kMaxPrefillBatchSize,",
        [LAUNCH],
    ),
    "block-512": (r"LaunchKernel\(1, kMaxPrefillBatchSize,", "LaunchKernel(1, 512,", [LAUNCH]),
    "launch-bounds-512": (
        r"__launch_bounds__\(1024, 1\)(\s*//\s*void\s+plan_compress_prefill_kernel0)",
        r"__launch_bounds__(512, 1)\1",
        [LAUNCH],
    ),
    "second-launch-site-grid-2": (
        r"( *LaunchKernel\(1, kMaxPrefillBatchSize, device\)\(plan_compress_prefill_kernel0, params0\);\n)",
        r"\1  LaunchKernel(2, kMaxPrefillBatchSize, device)(plan_compress_prefill_kernel0, params0);\n",
        [LAUNCH],
    ),
    "two-good-launch-sites": (  # a fork's second entry point, also one block of 1024: fine
        r"( *LaunchKernel\(1, kMaxPrefillBatchSize, device\)\(plan_compress_prefill_kernel0, params0\);\n)",
        r"\1\1",
        [],
    ),
    "no-launch-site": (
        r" *LaunchKernel\(1, kMaxPrefillBatchSize, device\)\(plan_compress_prefill_kernel0, params0\);\n",
        "",
        [LAUNCH],
    ),
    "no-launch-bounds": (
        r"__launch_bounds__\(1024, 1\)(\s*//\s*void\s+plan_compress_prefill_kernel0)",
        r"\1",
        [],
    ),
    "launch-bounds-by-name": (
        r"__launch_bounds__\(1024, 1\)(\s*//\s*void\s+plan_compress_prefill_kernel0)",
        r"__launch_bounds__(kMaxPrefillBatchSize, 1)\1",
        [],
    ),
    "launch-bounds-unknown": (
        r"__launch_bounds__\(1024, 1\)(\s*//\s*void\s+plan_compress_prefill_kernel0)",
        r"__launch_bounds__(kThreads, 1)\1",
        [LAUNCH],
    ),
    "grid-by-name": (
        r"LaunchKernel\(1, kMaxPrefillBatchSize,",
        "LaunchKernel(kMaxPrefillBatchSize / 1024, kMaxPrefillBatchSize,",
        [],
    ),
    "grid-unknown": (
        r"LaunchKernel\(1, kMaxPrefillBatchSize,",
        "LaunchKernel(num_blocks, kMaxPrefillBatchSize,",
        [LAUNCH],
    ),
    "block-unknown": (
        r"LaunchKernel\(1, kMaxPrefillBatchSize,",
        "LaunchKernel(1, params.block_size,",
        [LAUNCH],
    ),
    # _warp_count: value == 32 (shared with _warp0_reads_all's lanes_match), warp id, lane id
    "16-warps": (
        r"constexpr auto kNumWarps = kMaxPrefillBatchSize / kWarpThreads;",
        "constexpr uint32_t kHalfBlock = 512;\n  constexpr auto kNumWarps = kHalfBlock / kWarpThreads;",
        [WARPS, READS],
    ),
    "no-warp-id": (
        r"warp_id = tx / kWarpThreads;",
        "warp_id = tx >> 5;",
        [WARPS, WRITES, BARRIER, READS],
    ),
    "no-lane-id": (r"lane_id = tx % kWarpThreads;", "lane_id = tx & 31;", [WARPS, READS]),
    # _every_warp_writes: two per-warp arrays, both written by warp id, unconditionally
    "one-per-warp-array": (
        r"__shared__ uint32_t warp_min\[kNumWarps\];",
        "__shared__ uint32_t warp_min[64];",
        [WRITES],
    ),
    "min-not-by-warp": (r"warp_min\[warp_id\] =", "warp_min[warp_id + 0] =", [WRITES]),
    "guarded-write": (
        r"( *warp_max\[warp_id\] = [^;]*;\n)",
        r"  if (tx < params.batch_size) {\n\1  }\n",
        [WRITES],
    ),
    # _barrier_before_read: a read exists, an unconditional barrier precedes it
    "no-read": (
        r"\((warp_max|warp_min)\[lane_id\]\)",
        "(0u)",
        [BARRIER, READS],
    ),
    "no-barrier": (r"(warp_min\[warp_id\] = [^;]*;\n) *__syncthreads\(\);\n", r"\1", [BARRIER]),
    "conditional-barrier": (
        r"(warp_min\[warp_id\] = [^;]*;\n) *__syncthreads\(\);\n",
        r"\1  if (tx == 0) { __syncthreads(); }\n",
        [BARRIER],
    ),
    # _warp0_reads_all: guard is warp 0, read by lane, both arrays read (lanes_match: 16-warps)
    "warp-1-reads": (r"if \(warp_id == 0\) \{", "if (warp_id == 1) {", [READS]),
    "unguarded-read": (
        r"if \(warp_id == 0\) \{(\n[^}]*warp_min\[lane_id\][^}]*)\}",
        r"{\1}",
        [READS],
    ),
    "read-at-top-level": (
        r"if \(warp_id == 0\) \{\n([^}]*warp_min\[lane_id\][^}]*)\}",
        r"\1",
        [READS],
    ),
    "reads-slot-0": (r"warp_max\[lane_id\]", "warp_max[0]", [READS]),
    "reads-max-twice": (r"warp_min\[lane_id\]", "warp_max[lane_id]", [READS]),
    # spellings of "warp 0" the check accepts: nothing fails
    "guard-tx-lt-32": (r"if \(warp_id == 0\) \{", "if (tx < 32) {", []),
    "guard-threadidx-lt-kwarpthreads": (
        r"if \(warp_id == 0\) \{",
        "if (threadIdx.x < kWarpThreads) {",
        [],
    ),
}


def _release_no_init(version: str) -> str:
    text = kernel_text(version)
    return text if version in FIXED else rewrite(text, "no-init")


@pytest.mark.parametrize("version", AFFECTED + FIXED)
@pytest.mark.parametrize("edit", sorted(CLAUSE_EDITS))
def test_each_precondition_clause_is_needed(version: str, edit: str) -> None:
    import re

    pattern, replacement, failing = CLAUSE_EDITS[edit]
    base_text = _release_no_init(version)
    assert classify(base_text).safe
    edited, n = re.subn(pattern, replacement, base_text)
    assert n == 1 or (edit == "no-read" and n == 2), (edit, n)
    verdict = classify(edited)
    failed = [p.name for p in verdict.preconditions if not p.ok]
    assert failed == failing, [(p.name, p.detail) for p in verdict.preconditions if not p.ok]
    assert [p.name for p in verdict.preconditions] == ALL
    assert verdict.safe == (not failing)


# --------------------------------------------------------------------------- Kernel0's queries


def test_init_writes_without_per_warp_writes_are_every_other_write() -> None:
    from sglang_dsv4_fix.kernel import parse

    no_writes = (
        base()
        .replace(PER_WARP, "")
        .replace("  warp_min[warp_id] = warp::reduce_min(e_for_min);\n", "")
    )
    k = parse(no_writes)
    assert k.per_warp_writes() == []
    assert [(a.array, a.index) for a in k.init_writes()] == [
        ("warp_max", "tx"),
        ("warp_min", "tx"),
    ]


def test_a_read_before_the_per_warp_writes_is_not_an_init() -> None:
    early = "  const uint32_t early = warp_max[lane_id];\n"
    verdict = classify(_no_init().replace(PER_WARP, early + PER_WARP))
    assert verdict.variant == "no-init"


# What operators read: the exact reason and the failed preconditions' details, on 0.5.16.
NO_INIT_REASON = "no initialisation of the per-warp slots before the per-warp writes"
PER_ARRAY = "expected exactly one per-warp write (array[warp_id] = ...) per array"
MESSAGES_0516: dict[str, tuple[str, str, list[str]]] = {
    "no-launch-site": (
        "no-init",
        NO_INIT_REASON,
        ["found no launch site of plan_compress_prefill_kernel0"],
    ),
    "no-launch-bounds": ("no-init", NO_INIT_REASON, []),
    "launch-bounds-by-name": ("no-init", NO_INIT_REASON, []),
    "launch-bounds-unknown": (
        "no-init",
        NO_INIT_REASON,
        ["launched as grid=1, block=1024, __launch_bounds__(kThreads=?)"],
    ),
    "grid-by-name": ("no-init", NO_INIT_REASON, []),
    "grid-unknown": (
        "no-init",
        NO_INIT_REASON,
        ["launched as grid=num_blocks=?, block=1024, __launch_bounds__(1024)"],
    ),
    "block-unknown": (
        "no-init",
        NO_INIT_REASON,
        ["launched as grid=1, block=params.block_size=?, __launch_bounds__(1024)"],
    ),
    "read-at-top-level": ("no-init", NO_INIT_REASON, ["read warp_max[lane_id] under '(none)'"]),
    "16-warps": (
        "no-init",
        NO_INIT_REASON,
        [
            "kNumWarps = 16, warp id = warp_id, lane id = lane_id",
            "read warp_max[lane_id] under 'if (warp_id == 0)'; kNumWarps != 32 lanes",
        ],
    ),
    "block-512": (
        "no-init",
        NO_INIT_REASON,
        ["launched as grid=1, block=512, __launch_bounds__(1024)"],
    ),
    "conditional-barrier": (
        "no-init",
        NO_INIT_REASON,
        ["no unconditional barrier before the read"],
    ),
    "grid-2": (
        "no-init",
        NO_INIT_REASON,
        ["launched as grid=2, block=1024, __launch_bounds__(1024)"],
    ),
    "guard-threadidx-lt-kwarpthreads": ("no-init", NO_INIT_REASON, []),
    "guard-tx-lt-32": ("no-init", NO_INIT_REASON, []),
    "guarded-write": (
        "no-init",
        NO_INIT_REASON,
        ["warp_max[warp_id] is written only under 'if (tx < params.batch_size)'"],
    ),
    "launch-bounds-512": (
        "no-init",
        NO_INIT_REASON,
        ["launched as grid=1, block=1024, __launch_bounds__(512)"],
    ),
    "min-not-by-warp": (
        "unknown",
        PER_ARRAY,
        ["unconditional writes to warp_max indexed by warp_id"],
    ),
    "no-barrier": ("no-init", NO_INIT_REASON, ["no unconditional barrier before the read"]),
    "no-lane-id": (
        "no-init",
        NO_INIT_REASON,
        [
            "kNumWarps = 32, warp id = warp_id, lane id = None",
            "read warp_max[lane_id] under 'if (warp_id == 0)'",
        ],
    ),
    "no-read": (
        "no-init",
        NO_INIT_REASON,
        [
            "no unconditional barrier before the read",
            "no read of the per-warp slots after the writes",
        ],
    ),
    "no-warp-id": (
        "unknown",
        PER_ARRAY,
        [
            "kNumWarps = 32, warp id = None, lane id = lane_id",
            "unconditional writes to nothing indexed by None",
            "no per-warp writes found",
            "no read of the per-warp slots after the writes",
        ],
    ),
    "one-per-warp-array": (
        "unknown",
        "no pair of per-warp __shared__ scratch arrays (warp_max/warp_min)",
        ["unconditional writes to warp_max indexed by warp_id"],
    ),
    "reads-max-twice": (
        "no-init",
        NO_INIT_REASON,
        ["read warp_max[lane_id] under 'if (warp_id == 0)'"],
    ),
    "reads-slot-0": ("no-init", NO_INIT_REASON, ["read warp_max[0] under 'if (warp_id == 0)'"]),
    "second-launch-site-grid-2": (
        "no-init",
        NO_INIT_REASON,
        ["launch 2 of 2 is grid=2, block=1024, __launch_bounds__(1024)"],
    ),
    "two-good-launch-sites": ("no-init", NO_INIT_REASON, []),
    "unguarded-read": ("no-init", NO_INIT_REASON, ["read warp_max[lane_id] under '{'"]),
    "warp-1-reads": (
        "no-init",
        NO_INIT_REASON,
        ["read warp_max[lane_id] under 'if (warp_id == 1)'"],
    ),
}
RACY_REASON = "init of warp_max, warp_min races the per-warp writes: no unconditional __syncthreads() between them (sgl-project/sglang#32467)"
OK_DETAILS = [
    "launched as grid=1, block=1024, __launch_bounds__(1024)",
    "kNumWarps = 32, warp id = warp_id, lane id = lane_id",
    "unconditional writes to warp_max, warp_min indexed by warp_id",
    "unconditional __syncthreads() before the read",
    "read warp_max[lane_id] under 'if (warp_id == 0)'",
]


@pytest.mark.parametrize("edit", sorted(MESSAGES_0516))
def test_reason_and_details_are_exact(edit: str) -> None:
    import re

    pattern, replacement, _ = CLAUSE_EDITS[edit]
    verdict = classify(re.sub(pattern, replacement, _release_no_init("0.5.16")))
    variant, reason, details = MESSAGES_0516[edit]
    assert (verdict.variant, verdict.reason) == (variant, reason)
    assert [p.detail for p in verdict.preconditions if not p.ok] == details


def test_racy_and_fixed_messages_are_exact() -> None:
    racy, fixed = classify(kernel_text("0.5.16")), classify(_release_no_init("0.5.16"))
    assert (racy.variant, racy.reason) == ("racy-init", RACY_REASON)
    assert (fixed.variant, fixed.reason) == ("no-init", NO_INIT_REASON)
    assert [p.detail for p in racy.preconditions] == OK_DETAILS
    assert [p.detail for p in fixed.preconditions] == OK_DETAILS
    barrier = classify(rewrite(kernel_text("0.5.16"), "barrier"))
    assert barrier.reason == (
        "init of warp_max, warp_min is followed by __syncthreads() before the per-warp writes"
    )


def test_a_second_per_warp_write_is_unknown() -> None:
    twice = _no_init().replace(PER_WARP, PER_WARP + PER_WARP)
    verdict = classify(twice)
    assert (verdict.variant, verdict.reason) == ("unknown", PER_ARRAY)


def test_a_late_write_is_named() -> None:
    late = READ_BARRIER.replace(
        "  __syncthreads();\n", "  warp_max[lane_id] = 0;\n  __syncthreads();\n"
    )
    verdict = classify(_no_init().replace(READ_BARRIER, late))
    assert verdict.reason == "warp_max[lane_id] is written between the per-warp writes and the read"


def test_a_missing_warp_count_is_named_so() -> None:
    # (with `warp_id = tx / kWarpThreads` left in, the parser takes warp_id for the count name)
    text = _no_init().replace(
        "  constexpr auto kNumWarps = kMaxPrefillBatchSize / kWarpThreads;\n", ""
    )
    text = text.replace("warp_id = tx / kWarpThreads;", "warp_id = tx >> 5;")
    (warps,) = [p for p in classify(text).preconditions if p.name == WARPS]
    assert (warps.ok, warps.detail) == (
        False,
        "warp count = None, warp id = None, lane id = lane_id",
    )


# --------------------------------------------------------------------------- rewrite's edges


def test_rewrite_refuses_what_is_not_racy() -> None:
    from sglang_dsv4_fix.errors import Exit, FatalError

    with pytest.raises(FatalError) as e:
        rewrite(_no_init(), "barrier")
    assert (str(e.value), e.value.code) == (
        f"cannot rewrite: kernel0 is no-init ({NO_INIT_REASON})",
        Exit.UNKNOWN,
    )


def test_rewrite_refuses_an_init_interleaved_with_other_statements() -> None:
    from sglang_dsv4_fix.errors import Exit, FatalError

    mixed = "  warp_max[lane_id] = 0;\n  counter_c = 0;\n  warp_min[lane_id] = 0xFFFFFFFFu;\n"
    with pytest.raises(FatalError) as e:
        rewrite(base().replace(INIT, mixed), "no-init")
    assert (str(e.value), e.value.code) == (
        "cannot rewrite: the init writes are interleaved with other statements",
        Exit.UNKNOWN,
    )


def test_an_unguarded_init_is_rewritten_line_by_line() -> None:
    lane = "  warp_max[lane_id] = 0;\n  warp_min[lane_id] = 0xFFFFFFFFu;\n"
    racy = base().replace(INIT, lane)
    assert rewrite(racy, "no-init") == racy.replace(lane + "\n", "")
    assert rewrite(racy, "barrier") == racy.replace(lane, lane + "  __syncthreads();\n")


def test_no_blank_line_after_the_init_only_the_block_goes() -> None:
    tight = base().replace(INIT + "\n", INIT)
    assert rewrite(tight, "no-init") == base().replace(INIT + "\n", "")


@pytest.mark.parametrize(
    "shared",
    [
        pytest.param(
            lambda t: t.replace(INIT, "  counter_w = 0; " + INIT.lstrip()), id="code-before"
        ),
        pytest.param(lambda t: t.replace(INIT, INIT[:-1] + " counter_w = 0;\n"), id="code-after"),
    ],
)
def test_rewrite_refuses_an_init_block_sharing_a_line(shared) -> None:  # type: ignore[no-untyped-def]
    from sglang_dsv4_fix.errors import FatalError

    with pytest.raises(
        FatalError, match=r"^cannot rewrite: the init block shares a line with other code$"
    ):
        rewrite(shared(base()), "no-init")


def test_a_file_starting_with_a_blank_line_is_rewritten_in_place() -> None:
    assert rewrite("\n" + base(), "no-init") == "\n" + base().replace(INIT + "\n", "")
    assert rewrite("\n" + base(), "barrier") == "\n" + base().replace(
        INIT, INIT + "  __syncthreads();\n"
    )


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ('a "xyz" b', 'a "   " b'),
        ("c = 'q';", "c = ' ';"),
        ('"" ""', '"" ""'),
        ('"ab', '" b'),  # unterminated: the line's last character stays
        ('s = "x\\\ny" t', 's = "  \n " t'),  # a backslash-newline inside a literal
        ("x // tail\ny", "x        \ny"),
        ("p /* a\nb */ q", "p     \n     q"),
    ],
)
def test_masking_keeps_length_newlines_and_quotes(text: str, masked: str) -> None:
    assert kernel.mask_comments(text) == masked
    assert len(masked) == len(text)
