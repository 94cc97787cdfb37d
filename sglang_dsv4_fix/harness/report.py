"""Plain-text tables for ``repro`` (the last thing printed: operators read the end of a log)."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_dsv4_fix.harness.bench import Timing
from sglang_dsv4_fix.harness.racecheck import RacecheckResult
from sglang_dsv4_fix.harness.runner import ShapeResult


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
        "bad/calls",
        "id>=rows",
        "max id/rows",
        "B*s_max-1",
        "first bad",
    )
    rows = [head] + [
        (
            r.release,
            r.variant,
            r.shape,
            f"{r.bad}/{r.calls}",
            str(r.out_of_range),
            f"{r.max_ragged_id}/{r.rows}",
            f"{r.signature_hits}x{r.signature}" if r.bad else "-",
            f"#{r.first_bad_call} @{r.first_bad_s:.3f}s" if r.first_bad_call is not None else "-",
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


def summary(results: Sequence[ShapeResult], races: Sequence[RacecheckResult]) -> list[str]:
    """One line per (release, variant): the verdict an operator acts on."""
    pairs = [(r.release, r.variant) for r in results] + [(r.release, r.variant) for r in races]
    keys = list(dict.fromkeys(pairs))
    lines = []
    for release, variant in keys:
        mine = [r for r in results if (r.release, r.variant) == (release, variant)]
        hz = [r.hazards for r in races if (r.release, r.variant) == (release, variant)]
        bad, calls = sum(r.bad for r in mine), sum(r.calls for r in mine)
        race = f", racecheck hazards {sum(hz)}" if hz else ""
        lines.append(f"{release} {variant}: {bad} bad plans in {calls} calls{race}")
    return lines
