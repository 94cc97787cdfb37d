"""Kernel0 latency: CUDA-graph replays of many back-to-back launches, per variant, same run."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from sglang_dsv4_fix.harness.gpu import torch
from sglang_dsv4_fix.harness.shapes import SWA_PAGE_SIZE, Shape


@dataclass
class Timing:
    release: str
    variant: str
    shape: str
    round: int
    launches_per_replay: int
    replays: int
    median_us: float
    p10_us: float
    p90_us: float
    min_us: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_kernel0(
    module: Any, shape: Shape, launches: int, replays: int, release: str, variant: str, rnd: int
) -> Timing:
    """Per-launch microseconds of kernel0 alone on ``shape``'s GPU inputs."""
    t = torch()
    n = shape.rows
    plan_c = t.empty((n, 16), dtype=t.uint8, device="cuda")
    plan_w = t.empty((n, 8), dtype=t.uint8, device="cuda")
    seq = t.tensor(shape.seq_lens, dtype=t.int64, device="cuda")
    ext = t.tensor(shape.extend_lens, dtype=t.int64, device="cuda")
    out = t.zeros(replays, dtype=t.float64)
    t.cuda.synchronize()
    module.bench_kernel0(
        plan_c, plan_w, seq, ext, shape.ratio, SWA_PAGE_SIZE, shape.mtp_pad, launches, out
    )
    per_launch = sorted(ms * 1000.0 / launches for ms in out.tolist())
    q = statistics.quantiles(per_launch, n=10)
    return Timing(
        release, variant, shape.name, rnd, launches, replays,
        round(statistics.median(per_launch), 3), round(q[0], 3), round(q[-1], 3), round(per_launch[0], 3),
    )  # fmt: skip
