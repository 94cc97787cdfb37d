"""Time ``jitcache.racy_builds`` (verify's and the plugin's cache check) with two copies of the code.

    python benchmarks/jitcache_bench.py --before DIR --after DIR [--release 0.5.16] [--runs 50]

DIR is a folder holding a ``sglang_dsv4_fix`` package (e.g. ``git archive`` of a commit). Builds
an installed tree of the release from its real wheel, fixes it (no-init) with the "after" code,
then times one ``racy_builds`` call per fresh process (its lazy imports included), on an empty
cache folder and on one holding the tree's no-init build (as after ``prewarm``).
Arms alternate; prints the median and min of each side by side in milliseconds. Run it from
outside the repository so neither arm imports the checkout by accident.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trees import make_installed_tree

PROBE = """
import json, sys, time
from pathlib import Path
from sglang_dsv4_fix import jitcache
from sglang_dsv4_fix.tree import find_tree
assert Path(jitcache.__file__).is_relative_to(Path(sys.argv[1])), jitcache.__file__
tree = find_tree(sys.argv[2])
start = time.perf_counter()
racy = jitcache.racy_builds(tree, sys.argv[3])
print(json.dumps([(time.perf_counter() - start) * 1000, len(racy)]))
"""


def fixed_tree(release: str, dest: Path, after: Path) -> Path:
    site = make_installed_tree(release, dest)
    subprocess.run(
        [sys.executable, "-m", "sglang_dsv4_fix", "apply", "--tree", str(site), "--no-clear-cache"],
        env={**os.environ, "PYTHONPATH": str(after)},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return site


def lay_fixed_build(site: Path, root: Path, after: Path) -> None:
    """The cache as ``prewarm`` leaves it: the no-init build under the loader's own name."""
    script = (
        "import sys; from pathlib import Path; from sglang_dsv4_fix import jitcache;"
        "from sglang_dsv4_fix.tree import find_tree; t = find_tree(sys.argv[1]);"
        "d = jitcache.load_call(t, t.kernel_path.read_bytes(), jitcache.arch_for(t, 9, 0),"
        " jitcache.runtime_tvm_ffi(t), Path(sys.argv[2])).build_dir; d.mkdir(parents=True);"
        "[(d / f).write_text('') for f in ('lock', 'build.ninja')];"
        "(d / (d.name.split('__arch_')[0] + '.so')).write_bytes(b'so')"
    )
    cmd = [sys.executable, "-c", script, str(site), str(root)]
    subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(after)}, check=True)


def probe(code: Path, site: Path, root: Path) -> tuple[float, int]:
    """One fresh process: imports, find the tree, then the timed call (lazy imports included)."""
    cmd = [sys.executable, "-c", PROBE, str(code), str(site), str(root)]
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True)
    ms, racy = json.loads(out.stdout)
    return float(ms), int(racy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--release", default="0.5.16")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    arms = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory() as tmp:
        site = fixed_tree(args.release, Path(tmp) / "site", arms["after"])
        empty, warm = Path(tmp) / "empty-cache", Path(tmp) / "warm-cache"
        empty.mkdir()
        lay_fixed_build(site, warm, arms["after"])
        roots = {"empty cache": empty, "no-init build cached": warm}
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.runs):
            for arm, code in arms.items():
                for label, root in roots.items():
                    ms, racy = probe(code, site, root)
                    assert racy == 0, (arm, label, racy)
                    samples.setdefault((arm, label), []).append(ms)
    print(f"racy_builds on a fixed {args.release} tree, {args.runs} fresh processes per arm (ms)")
    print(f"{'cache':24} {'before med':>11} {'min':>7} {'after med':>11} {'min':>7}")
    for label in ("empty cache", "no-init build cached"):
        b, a = samples[("before", label)], samples[("after", label)]
        print(
            f"{label:24} {statistics.median(b):11.2f} {min(b):7.2f} "
            f"{statistics.median(a):11.2f} {min(a):7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
