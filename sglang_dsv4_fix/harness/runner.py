"""Run the tree's real ``plan_compress_prefill`` on GPU-resident inputs and count bad plans."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from sglang_dsv4_fix.harness import oracle
from sglang_dsv4_fix.harness.gpu import torch
from sglang_dsv4_fix.harness.shapes import RING_SIZE, SWA_PAGE_SIZE, Shape

CHUNK = 500  # calls checked together: one host sync per chunk, not per call
SLACK = 64  # extra columns in req_to_token so a bad plan reads padding, not past the buffer
# A bad plan of the racy kernel also WRITES past its own plan buffers (kernel0 emits up to
# B*s_max entries into a buffer of sum(extend_lens)), which can land on other live allocations.
# So each call's plans are snapshotted at once (same stream, before the next call runs) into
# buffers big enough for the allocator's large pool, and the inputs and the reference are checked
# against pristine host copies after every chunk (and restored): see ShapeResult.corrupted_chunks.
# In a corrupted chunk only the calls up to its first bad one count (re-checked against the
# restored reference): each later call may have run on overwritten inputs (tainted_calls).
LARGE = 4 << 20


@dataclass
class ShapeResult:
    release: str
    variant: str
    shape: str
    ratio: int
    batch: int
    rows: int
    calls: int  # calls run; those that count as evidence: calls - tainted_calls
    bad: int
    out_of_range: int
    signature_hits: int  # bad plans whose max ragged_id is B*s_max-1
    max_ragged_id: int  # over all calls (write plan)
    signature: int
    ids_wrong: int
    compress_plan_differs: int
    write_plan_differs: int
    write_plan_compared: bool  # False where kernel0 and the CPU path legitimately differ
    first_bad_call: int | None
    first_bad_s: float | None  # host seconds from the first call to the submission of that call
    seconds: float
    corrupted_chunks: int = 0  # chunks after which our inputs/reference had been overwritten
    tainted_calls: int = 0  # calls after the first bad one of a corrupted chunk: not counted
    arch: str = ""  # the build target the variant ran as (jitcache.Arch.target)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Inputs:
    """One shape's tensors: GPU-resident for kernel0, CPU copies for the reference path."""

    def __init__(self, shape: Shape) -> None:
        t = torch()
        dev = "cuda"
        b, width = shape.batch, max(shape.seq_lens) + SLACK
        self.shape = shape
        self.rid = t.arange(b, dtype=t.int64, device=dev)
        self.r2t = t.arange(b * width, dtype=t.int32, device=dev).reshape(b, width)
        self.f2s = t.arange(b * width * 2, dtype=t.int64, device=dev)  # oversized on purpose
        self.seq = t.tensor(shape.seq_lens, dtype=t.int64, device=dev)
        self.ext = t.tensor(shape.extend_lens, dtype=t.int64, device=dev)
        self.no_pin = t.empty(0, dtype=t.uint8)
        self.seq_cpu, self.ext_cpu = self.seq.cpu(), self.ext.cpu()
        self.pin = t.empty(shape.rows * 24, dtype=t.uint8, pin_memory=True)
        self.pristine = [x.cpu() for x in self.state()]

    def state(self) -> list[Any]:
        return [self.rid, self.r2t, self.f2s, self.seq, self.ext]

    def intact(self) -> bool:
        """False (and the tensors restored) if a bad plan's stray writes hit our inputs."""
        return _restore(self.state(), self.pristine)

    def args(self, on_gpu: bool) -> tuple[Any, ...]:
        s = self.shape
        seq, ext, pin = (
            (self.seq, self.ext, self.no_pin) if on_gpu else (self.seq_cpu, self.ext_cpu, self.pin)
        )
        # (req_pool_indices, req_to_token, full_to_state, seq_lens, extend_lens, pin_buffer,
        #  num_q_tokens, compress_ratio, swa_page_size, ring_size, use_cuda_graph): the same
        # positional signature in 0.5.12 - 0.5.17 (only the third name changed, full_to_swa).
        return (
            self.rid,
            self.r2t,
            self.f2s,
            seq,
            ext,
            pin,
            s.rows,
            s.ratio,
            SWA_PAGE_SIZE,
            RING_SIZE,
            True,
        )


def plan(module: Any, inputs: Inputs, on_gpu: bool = True) -> tuple[Any, Any]:
    t = torch()
    c, w = module.plan_prefill(*inputs.args(on_gpu))
    return t.from_dlpack(c), t.from_dlpack(w)


def run_shape(
    module: Any, shape: Shape, calls: int, release: str, variant: str, streams: int = 1,
    arch: str = "",
) -> ShapeResult:  # fmt: skip
    """``calls`` calls of the real planner; with ``streams`` > 1 they round-robin over that many
    CUDA streams, so up to that many kernel0 blocks run at once on different SMs."""
    t = torch()
    inputs = Inputs(shape)
    ref = oracle.reference(*plan(module, inputs, on_gpu=False), shape)
    ref_state = [ref.w_keys, ref.c_keys]
    ref_pristine = [x.cpu() for x in ref_state]
    acc = _Accumulator(shape)
    pool = [t.cuda.current_stream()] + [t.cuda.Stream() for _ in range(streams - 1)]
    cbuf, wbuf = _snapshots(shape.rows, 16), _snapshots(shape.rows, 8)
    t.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    while done < calls:
        k = min(CHUNK, calls - done)
        try:
            verdicts, stamps, intact = _chunk(
                module, inputs, ref, (ref_state, ref_pristine), pool, (cbuf, wbuf), k, start
            )
        except Exception as e:  # torch.AcceleratorError, tvm-ffi's errors: not one base class
            if is_device_fault(e):
                raise DeviceFault(shape, done + k, e) from e
            raise
        acc.add(verdicts, done, stamps, intact)
        done += k
    t.cuda.synchronize()
    return acc.result(release, variant, calls, ref.w_comparable, time.perf_counter() - start, arch)


def _chunk(module: Any, inputs: Inputs, ref: oracle.Reference, saved: tuple[list[Any], list[Any]],
           pool: list[Any], bufs: tuple[Any, Any], k: int, start: float,
) -> tuple[oracle.Verdicts, list[float], bool]:  # fmt: skip
    """k calls, each one's plans snapshotted at once, checked; inputs and reference verified."""
    t = torch()
    cbuf, wbuf = bufs
    stamps = []
    for i in range(k):
        stamps.append(time.perf_counter() - start)
        with t.cuda.stream(pool[i % len(pool)]):
            c, w = plan(module, inputs)
            cbuf[i].copy_(c)
            wbuf[i].copy_(w)
    t.cuda.synchronize()  # every stream's plans are complete before the default stream reads them
    verdicts = oracle.check(cbuf[:k], wbuf[:k], ref, inputs.shape)
    # Restoring runs on the same stream, after the check above has read the reference.
    intact = inputs.intact() & _restore(*saved)
    if not intact:  # judge the chunk's own snapshots again, against the restored reference
        verdicts = oracle.check(cbuf[:k], wbuf[:k], ref, inputs.shape)
    return verdicts, stamps, intact


class DeviceFault(Exception):
    """The GPU faulted during a shape (CUDA reports it at the next sync); the context is lost."""

    def __init__(self, shape: Shape, submitted: int, error: BaseException) -> None:
        self.shape = shape.name
        self.submitted = submitted  # calls submitted up to the sync that reported the fault
        self.error = (str(error).splitlines() or [type(error).__name__])[0]
        super().__init__(f"{self.shape}: {self.error} (within the first {submitted} calls)")


def is_device_fault(e: BaseException) -> bool:
    """torch.AcceleratorError and friends: 'CUDA error: an illegal memory access ...'."""
    return "CUDA error" in str(e)


@dataclass
class SameResult:
    """One shape: a variant's plans against another tree's same-named variant, call for call."""

    release: str
    against: str
    variant: str
    shape: str
    calls: int
    same_plans: int  # calls whose plans equal the other's as multisets (slot order is atomicAdd's)
    same_bytes: int  # calls whose plan buffers are byte-identical
    first_difference: int | None
    corrupted_chunks: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_shape(
    module: Any, other: Any, shape: Shape, calls: int, release: str, against: str, variant: str
) -> SameResult:
    """Call ``module`` and ``other`` alternately on the same GPU inputs; compare each pair."""
    t = torch()
    inputs = Inputs(shape)
    bufs = [_snapshots(shape.rows, width) for width in (16, 8, 16, 8)]  # c, w of each module
    same_plans = same_bytes = corrupted = 0
    first: int | None = None
    t.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    while done < calls:
        k = min(CHUNK, calls - done)
        for i in range(k):
            for j, m in enumerate((module, other)):
                c, w = plan(m, inputs)
                bufs[2 * j][i].copy_(c)
                bufs[2 * j + 1][i].copy_(w)
        planned, exact = oracle.same(*(b[:k] for b in bufs))
        same_plans += int(planned.sum())
        same_bytes += int(exact.sum())
        if first is None and not bool(planned.all()):
            first = done + int((~planned).nonzero()[0, 0])
        corrupted += 0 if inputs.intact() else 1
        done += k
    secs = round(time.perf_counter() - start, 3)
    return SameResult(release, against, variant, shape.name, calls, same_plans, same_bytes, first,
                      corrupted, secs)  # fmt: skip


def _snapshots(rows: int, width: int) -> Any:
    """[CHUNK, rows, width] u8, carved from at least LARGE bytes (the allocator's large pool)."""
    t = torch()
    need = CHUNK * rows * width
    return t.empty(max(need, LARGE), dtype=t.uint8, device="cuda")[:need].view(CHUNK, rows, width)


def _restore(live: list[Any], pristine: list[Any]) -> bool:
    """True if every GPU tensor still equals its host copy; any that does not is rewritten."""
    ok = True
    for gpu_tensor, host in zip(live, pristine, strict=True):
        if not bool((gpu_tensor.cpu() == host).all()):
            gpu_tensor.copy_(host)
            ok = False
    return ok


class _Accumulator:
    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.counts = {"bad": 0, "out_of_range": 0, "sig": 0, "ids": 0, "c": 0, "w": 0}
        self.max_id = -1
        self.first: tuple[int, float] | None = None
        self.corrupted = 0
        self.tainted = 0

    def add(self, v: oracle.Verdicts, offset: int, stamps: list[float], intact: bool) -> None:
        k = int(v.bad.shape[0])
        keep = k if intact else _evidence(v)
        self.corrupted += 0 if intact else 1
        self.tainted += k - keep
        sig = v.bad & (v.max_ragged_id == self.shape.signature)
        for key, flags in (
            ("bad", v.bad),
            ("out_of_range", v.out_of_range),
            ("sig", sig),
            ("ids", v.ids_wrong),
            ("c", v.c_differs),
            ("w", v.w_differs),
        ):
            self.counts[key] += int(flags[:keep].sum())
        self.max_id = max(self.max_id, int(v.max_ragged_id[:keep].max()))
        if self.first is None and bool(v.bad[:keep].any()):
            i = int(v.bad[:keep].nonzero()[0, 0])
            self.first = (offset + i, stamps[i])

    def result(
        self, release: str, variant: str, calls: int, compared: bool, secs: float, arch: str
    ) -> ShapeResult:
        s, n = self.shape, self.counts
        return ShapeResult(
            release, variant, s.name, s.ratio, s.batch, s.rows, calls, n["bad"], n["out_of_range"],
            n["sig"], self.max_id, s.signature, n["ids"], n["c"], n["w"], compared,
            self.first[0] if self.first else None, round(self.first[1], 6) if self.first else None,
            round(secs, 3), self.corrupted, self.tainted, arch,
        )  # fmt: skip


def _evidence(v: oracle.Verdicts) -> int:
    """How many leading calls of a corrupted chunk count: up to and with its first bad call.

    The stray writes come from a racy call taking the fast path (a bad plan; the first
    out-of-range call is that one or later), so every call before it ran on intact state.
    """
    bad = v.bad.nonzero()
    return int(bad[0, 0]) + 1 if bad.numel() else int(v.bad.shape[0])
