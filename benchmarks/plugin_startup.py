"""What the plugin adds to a process's start, under SGLang's real ``load_plugins()``.

Usage: python benchmarks/plugin_startup.py [--release 0.5.16] [--rounds 8]
Each round starts two fresh interpreters of the tests' cached environment (tests/plugin_env.py),
one with this package installed (entry point present) and one without, in alternating order.
Both import ``sglang.srt.plugins`` untimed, then time ``load_plugins()`` followed by SGLang's own
``configure_logger`` (where the plugin's start line is logged). Prints the medians and the
difference; the target is <= 15 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from plugin_env import install_self, release_site, run_python

PROBE = """
import io, logging, time, types
import sglang.srt.plugins as plugins
import sglang.srt.utils as utils
t0 = time.perf_counter()
plugins.load_plugins()
t1 = time.perf_counter()
utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP0")
t2 = time.perf_counter()
print("MS", (t1 - t0) * 1e3, (t2 - t0) * 1e3)
"""


def measure(*path: Path) -> tuple[float, float]:
    done = run_python(PROBE, *path)
    line = next((x for x in done.stdout.splitlines() if x.startswith("MS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    load, total = line.split()[1:]
    return float(load), float(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.5.16")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    site = release_site(args.release)
    with tempfile.TemporaryDirectory() as tmp:
        self_site = install_self(Path(tmp) / "self")
        arms: dict[str, list[tuple[float, float]]] = {"plugin": [], "none": []}
        for i in range(args.rounds):
            order = [("plugin", (self_site, site)), ("none", (site,))]
            for name, path in order if i % 2 == 0 else order[::-1]:
                arms[name].append(measure(*path))
    result = {"release": args.release, "rounds": args.rounds}
    for name, samples in arms.items():
        result[f"{name}_load_plugins_ms"] = round(statistics.median(s[0] for s in samples), 2)
        result[f"{name}_with_configure_logger_ms"] = round(
            statistics.median(s[1] for s in samples), 2
        )
    result["added_ms"] = round(
        result["plugin_with_configure_logger_ms"] - result["none_with_configure_logger_ms"], 2
    )
    print(json.dumps(result, indent=2))
    return 0 if result["added_ms"] <= 15 else 1


if __name__ == "__main__":
    raise SystemExit(main())
