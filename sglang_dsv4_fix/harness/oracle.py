"""Checks one batch of prefill plans against the tree's own CPU planning path (torch, on the GPU).

A plan is bad when any of these fails (sgl-project/sglang#32467: a ragged batch taken for uniform
sends ragged_id up to B*s_max-1, past the sum(extend_lens) rows the consumers index):
  1. every valid ragged_id (write and compress plan) is < sum(extend_lens);
  2. where the CPU path writes every token, the write plan's ids are exactly 0..N-1;
  3. the plans equal the CPU path's as multisets (slot order is atomicAdd order): the compress
     plan always, the write plan only where the two paths agree (Shape.cpu_path_equivalent: kernel0
     also writes from seq_len - mtp_pad, the CPU loop does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_dsv4_fix.harness.shapes import Shape

INVALID = 0xFFFFFFFF
MASK32 = 0xFFFFFFFF


@dataclass
class Reference:
    w_keys: Any  # sorted write-plan keys [N]
    c_keys: Any  # compress-plan keys [N, 2], sorted by the first
    all_written: bool
    w_comparable: bool


@dataclass
class Verdicts:
    """Per-call results for one batch of K calls (tensors of shape [K])."""

    bad: Any
    out_of_range: Any
    max_ragged_id: Any
    ids_wrong: Any
    c_differs: Any
    w_differs: Any


def words(plan: Any, per_entry: int) -> Any:
    """u8 [..., N, 4*per_entry] -> int64 [..., N, per_entry] holding the uint32 words."""
    t = plan.contiguous()
    shape = (*t.shape[:-1], per_entry)
    return t.view(dtype=_torch().int32).reshape(shape).to(_torch().int64) & MASK32


def _w_keys(w: Any) -> Any:
    return ((w[..., 0] << 32) | w[..., 1]).sort(dim=-1).values


def _c_keys(c: Any) -> Any:
    k1 = (c[..., 0] << 32) | c[..., 1]
    k2 = (c[..., 2] << 32) | c[..., 3]
    order = k1.argsort(dim=-1)
    return _torch().stack((k1.gather(-1, order), k2.gather(-1, order)), dim=-1)


def reference(cpu_c: Any, cpu_w: Any, shape: Shape) -> Reference:
    w = words(cpu_w, 2)
    written = int((w[:, 0] != INVALID).sum())
    return Reference(
        _w_keys(w), _c_keys(words(cpu_c, 4)), written == shape.rows, shape.cpu_path_equivalent
    )


def check(plan_c: Any, plan_w: Any, ref: Reference, shape: Shape) -> Verdicts:
    """``plan_c`` u8 [K, N, 16], ``plan_w`` u8 [K, N, 8] from K calls."""
    t = _torch()
    n = shape.rows
    w, c = words(plan_w, 2), words(plan_c, 4)
    w_ids = w[..., 0]
    w_max = t.where(w_ids != INVALID, w_ids, -1).amax(dim=-1)
    c_ids = c[..., 1] & 0xFFFF
    c_max = t.where(c[..., 0] != INVALID, c_ids, -1).amax(dim=-1)
    max_id = t.maximum(w_max, c_max)
    out_of_range = max_id >= n
    zeros = t.zeros_like(out_of_range)
    ids_wrong = zeros
    if ref.all_written:
        expected = t.arange(n, device=w.device, dtype=t.int64)
        ids_wrong = (w_ids.sort(dim=-1).values != expected).any(dim=-1)
    c_differs = (_c_keys(c) != ref.c_keys).flatten(start_dim=1).any(dim=-1)
    w_differs = (_w_keys(w) != ref.w_keys).any(dim=-1) if ref.w_comparable else zeros
    bad = out_of_range | ids_wrong | c_differs | w_differs
    return Verdicts(bad, out_of_range, w_max, ids_wrong, c_differs, w_differs)


def same(a_c: Any, a_w: Any, b_c: Any, b_w: Any) -> tuple[Any, Any]:
    """Per call of K: (plans equal as multisets, plan bytes identical), two bool tensors [K]."""
    c_same = (_c_keys(words(a_c, 4)) == _c_keys(words(b_c, 4))).flatten(start_dim=1).all(dim=-1)
    w_same = (_w_keys(words(a_w, 2)) == _w_keys(words(b_w, 2))).all(dim=-1)
    exact = (a_c == b_c).flatten(start_dim=1).all(dim=-1) & (a_w == b_w).flatten(start_dim=1).all(
        dim=-1
    )
    return c_same & w_same, exact


def _torch() -> Any:
    import torch

    return torch
