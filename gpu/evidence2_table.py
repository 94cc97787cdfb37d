"""The short table gpu/evidence2.sh prints last: ``python3 gpu/evidence2_table.py DIR``.

Reads the JSON that ``repro --save`` wrote in DIR (step1, original_<r>, fixed_<r>, fork) and the
pytest log; a missing or unreadable file shows as "missing" instead of stopping the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def releases(folder: Path) -> list[str]:
    found = {p.stem.split("_", 1)[1] for p in folder.glob("*_*.json") if "_" in p.stem}
    step1 = load(folder / "step1.json") or {}
    found |= {b["release"] for b in step1.get("builds", [])}
    return sorted(found, key=lambda r: [int(x) for x in r.split(".") if x.isdigit()])


def hazards(step1: dict[str, Any] | None, release: str) -> str:
    if step1 is None:
        return "missing"
    by = {r["variant"]: r["hazards"] for r in step1["racecheck"] if r["release"] == release}
    return "/".join(str(by.get(v, "-")) for v in ("original", "barrier", "no-init"))


def arch(runs: list[dict[str, Any] | None], release: str) -> str:
    targets = {b["arch"] for run in runs if run for b in run["builds"] if b["release"] == release}
    return ",".join(sorted(targets)) or "-"


def plans(run: dict[str, Any] | None, variant: str) -> str:
    if run is None:
        return "missing"
    rows = [r for r in run["plans"] if r["variant"] == variant]
    if not rows:
        return "none"
    bad = sum(r["bad"] for r in rows)
    tainted = sum(r["tainted_calls"] for r in rows)
    counted = sum(r["calls"] - r["tainted_calls"] for r in rows)
    hit = sum(1 for r in rows if r["bad"])
    least = min(r["calls"] for r in rows)
    text = f"{bad}/{counted} ({hit}/{len(rows)} shapes, >={least}/shape)"
    return text + (f" +{tainted} tainted" if tainted else "")


def fork_line(fork: dict[str, Any] | None) -> str:
    if fork is None:
        return "fork: missing"
    same = fork["same_plans"]
    n, ok = sum(r["calls"] for r in same), sum(r["same_plans"] for r in same)
    exact = sum(r["same_bytes"] for r in same)
    rc = ",".join(f"{r['release']} {r['variant']} {r['hazards']}" for r in fork["racecheck"])
    own = plans(fork, "no-init")
    against = same[0]["against"] if same else "-"
    return (
        f"fork vs {against} no-init: same plans {ok}/{n} calls on {len(same)} shapes "
        f"(byte-identical {exact}); own plans {own}; racecheck {rc or '-'}"
    )


def pytest_line(folder: Path) -> str:
    try:
        lines = [x for x in (folder / "pytest.txt").read_text().splitlines() if x.strip()]
    except OSError:
        return "pytest: missing"
    return "pytest -m gpu: " + (lines[-1].strip("= ") if lines else "no output")


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    step1 = load(folder / "step1.json")
    head = ("release", "arch", "racecheck o/b/n", "original bad", "barrier bad", "no-init bad")
    rows = [head]
    for r in releases(folder):
        orig, fixed = load(folder / f"original_{r}.json"), load(folder / f"fixed_{r}.json")
        rows.append(
            (r, arch([step1, orig, fixed], r), hazards(step1, r), plans(orig, "original"),
             plans(fixed, "barrier"), plans(fixed, "no-init"))
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(fork_line(load(folder / "fork.json")))
    print(pytest_line(folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
