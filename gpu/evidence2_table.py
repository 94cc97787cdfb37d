"""The short table gpu/evidence2.sh prints last: ``python3 gpu/evidence2_table.py DIR``.

``--markdown`` prints docs/evidence.md's tables from the same files instead.

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


def md(rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])


def markdown(folder: Path) -> None:
    step1 = load(folder / "step1.json") or {"racecheck": [], "latency": [], "builds": []}
    rels = releases(folder)
    head = ("release", "arch", "original", "barrier", "no-init")
    rows = [head]
    for r in rels:
        cells = []
        for v in ("original", "barrier", "no-init"):
            x = [c for c in step1["racecheck"] if (c["release"], c["variant"]) == (r, v)]
            kinds = "; ".join(f"{n}x {k}" for k, n in x[0]["kinds"].items()) if x else ""
            cells.append(
                f"{x[0]['hazards']} hazards" + (f" ({kinds})" if kinds else "") if x else "-"
            )
        rows.append((r, arch([step1], r), *cells))
    print("### Racecheck\n\n" + md(rows) + "\n")
    rows = [
        (
            "release",
            "arch",
            "variant",
            "shapes",
            "calls per shape",
            "calls",
            "bad",
            "max id = rows-1",
            "corrupted chunks",
        )
    ]
    for r in rels:
        run = load(folder / f"fixed_{r}.json")
        for v in ("barrier", "no-init"):
            x = [p for p in (run or {"plans": []})["plans"] if p["variant"] == v]
            if not x:
                rows.append((r, "-", v, "missing", "", "", "", "", ""))
                continue
            per = sorted({p["calls"] for p in x})
            rows.append((r, x[0]["arch"], v, str(len(x)), "/".join(f"{c:,}" for c in per),
                         f"{sum(p['calls'] for p in x):,}", str(sum(p["bad"] for p in x)),
                         "yes" if all(p["max_ragged_id"] == p["rows"] - 1 for p in x) else "NO",
                         str(sum(p["corrupted_chunks"] for p in x))))  # fmt: skip
    print("### Fixed variants\n\n" + md(rows) + "\n")
    runs = {r: load(folder / f"original_{r}.json") for r in rels}
    names: list[str] = []
    for run in runs.values():
        names += [p["shape"] for p in (run or {"plans": []})["plans"] if p["shape"] not in names]
    rows = [("shape", "rows", "B*s_max-1", *rels)]
    clean = []
    for n in names:
        cells, any_bad, rowsn, sig = [], False, "", ""
        for r in rels:
            x = [p for p in (runs[r] or {"plans": []})["plans"] if p["shape"] == n]
            if not x:
                cells.append("-")
                continue
            p = x[0]
            rowsn, sig = str(p["rows"]), str(p["signature"])
            counted = p["calls"] - p["tainted_calls"]
            if p["bad"] or p["tainted_calls"]:
                any_bad = True
                t = f", {p['tainted_calls']} tainted" if p["tainted_calls"] else ""
                cells.append(
                    f"{p['bad']}/{counted} / {p['out_of_range']} / {p['signature_hits']} (first #{p['first_bad_call']}{t})"
                )
            else:
                cells.append(f"0/{counted}")
        if any_bad:
            rows.append((n, rowsn, sig, *cells))
        else:
            clean.append(n)
    print("### Originals\n\n" + md(rows) + "\n\n0 bad on every release: " + ", ".join(clean) + "\n")
    fork = load(folder / "fork.json")
    if fork:
        rows = [("shape", "same plans", "same bytes", "own bad")]
        own = {p["shape"]: p for p in fork["plans"]}
        for x in fork["same_plans"]:
            o = own.get(x["shape"])
            rows.append((x["shape"], f"{x['same_plans']}/{x['calls']}", f"{x['same_bytes']}/{x['calls']}",
                         f"{o['bad']}/{o['calls']}" if o else "-"))  # fmt: skip
        print("### Fork\n\n" + md(rows) + "\n")
    lat = step1["latency"]
    rows = [
        (
            "release",
            "shape",
            "original r1 / r2",
            "barrier r1 / r2",
            "no-init r1 / r2",
            "no-init - original",
        )
    ]
    keys = list(dict.fromkeys((t["release"], t["shape"]) for t in lat))
    for rel, shape in keys:
        med = {
            (t["variant"], t["round"]): t["median_us"]
            for t in lat
            if (t["release"], t["shape"]) == (rel, shape)
        }
        cell = [
            f"{med.get((v, 1), 0):.3f} / {med.get((v, 2), 0):.3f}"
            for v in ("original", "barrier", "no-init")
        ]
        o = (med.get(("original", 1), 0) + med.get(("original", 2), 0)) / 2
        n = (med.get(("no-init", 1), 0) + med.get(("no-init", 2), 0)) / 2
        rows.append((rel, shape, *cell, f"{n - o:+.3f} ({(n - o) / o * 100 if o else 0:+.1f}%)"))
    print("### Latency (median µs per kernel0 launch)\n\n" + md(rows))


def after_fault(path: Path, specs: str) -> str:
    """The specs after the one that faulted (none if the run did not fault or left no JSON)."""
    fault = (load(path) or {}).get("fault")
    todo = specs.split(",")
    spec = fault["shape"].split("[", 1)[1].rstrip("]") if fault else None
    return ",".join(todo[todo.index(spec) + 1 :]) if spec in todo else ""


def main(argv: list[str]) -> int:
    if argv[:1] == ["--after-fault"]:
        print(after_fault(Path(argv[1]), argv[2]))
        return 0
    if argv[:1] == ["--markdown"]:
        markdown(Path(argv[1]))
        return 0
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
