"""Plain-text tables for ``repro`` (the last thing printed: operators read the end of a log)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_dsv4_fix.harness.bench import Timing
from sglang_dsv4_fix.harness.racecheck import RacecheckResult
from sglang_dsv4_fix.harness.runner import SameResult, ShapeResult


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plans(results: Sequence[ShapeResult]) -> str:
    head = (
        "release",
        "variant",
        "shape",
        "arch",
        "bad/calls",
        "id>=rows",
        "max id/rows",
        "B*s_max-1",
        "first bad",
        "tainted",
    )
    rows = [head] + [
        (
            r.release,
            r.variant,
            r.shape,
            r.arch,
            f"{r.bad}/{r.calls - r.tainted_calls}",
            str(r.out_of_range),
            f"{r.max_ragged_id}/{r.rows}",
            f"{r.signature_hits}x{r.signature}" if r.bad else "-",
            f"#{r.first_bad_call} @{r.first_bad_s:.3f}s" if r.first_bad_call is not None else "-",
            f"{r.tainted_calls} ({r.corrupted_chunks} chunks)" if r.corrupted_chunks else "-",
        )
        for r in results
    ]
    return table(rows)


def same_plans(results: Sequence[SameResult]) -> str:
    head = ("release", "against", "variant", "shape", "same plans", "same bytes", "first diff")
    rows = [head] + [
        (
            r.release,
            r.against,
            r.variant,
            r.shape,
            f"{r.same_plans}/{r.calls}",
            f"{r.same_bytes}/{r.calls}",
            f"#{r.first_difference}" if r.first_difference is not None else "-",
        )
        for r in results
    ]
    return table(rows)


def racechecks(results: Sequence[RacecheckResult]) -> str:
    head = ("release", "variant", "racecheck (kernel0)", "hazards", "errors", "warnings")
    rows = [head] + [
        (
            r.release,
            r.variant,
            f"{r.shape} x{r.calls}",
            str(r.hazards),
            str(r.errors),
            str(r.warnings),
        )
        for r in results
    ]
    return table(rows)


def timings(results: Sequence[Timing]) -> str:
    head = ("release", "shape", "variant", "round", "median us", "p10-p90 us")
    rows = [head] + [
        (
            t.release,
            t.shape,
            t.variant,
            str(t.round),
            f"{t.median_us:.3f}",
            f"{t.p10_us:.3f}-{t.p90_us:.3f}",
        )
        for t in results
    ]
    return table(rows)


def summary(results: Mapping[str, Any]) -> list[str]:
    """One line per (release, variant): the verdict an operator acts on."""
    plans: Sequence[ShapeResult] = results["plans"]
    races: Sequence[RacecheckResult] = results["racecheck"]
    same: Sequence[SameResult] = results.get("same_plans", [])
    pairs = [(r.release, r.variant) for r in plans] + [(r.release, r.variant) for r in races]
    keys = list(dict.fromkeys(pairs + [(r.release, r.variant) for r in same]))
    return [_summary_line(k, plans, races, same) for k in keys]


def _summary_line(
    key: tuple[str, str],
    plans: Sequence[ShapeResult],
    races: Sequence[RacecheckResult],
    same: Sequence[SameResult],
) -> str:
    mine = [r for r in plans if (r.release, r.variant) == key]
    hz = [r.hazards for r in races if (r.release, r.variant) == key]
    eq = [r for r in same if (r.release, r.variant) == key]
    bad, calls = sum(r.bad for r in mine), sum(r.calls - r.tainted_calls for r in mine)
    tainted = sum(r.tainted_calls for r in mine)
    parts = [f"{bad} bad plans in {calls} calls"] if mine else []
    parts += [f"{tainted} more ran on overwritten state, not counted"] if tainted else []
    parts += [f"racecheck hazards {sum(hz)}"] if hz else []
    if eq:
        n, ok = sum(r.calls for r in eq), sum(r.same_plans for r in eq)
        parts.append(f"same plans as {eq[0].against} in {ok}/{n} calls")
    return f"{key[0]} {key[1]}: " + ", ".join(parts)


def fault(f: Mapping[str, Any]) -> str:
    """The line for a run the GPU stopped (the racy original's illegal memory access)."""
    undone = ", ".join(f["not_run"]) or "nothing"
    return (
        f"{f['release']} {f['variant']} {f['shape']}: the GPU faulted within the first "
        f"{f['submitted_calls']} calls ({f['error']}); the CUDA context is lost, not run: {undone}"
    )
