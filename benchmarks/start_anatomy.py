"""Where the plugin's start cost goes: finding, loading and running its modules, then its work.

Usage: python benchmarks/start_anatomy.py [--rounds 9]
Run from a temporary folder, like benchmarks/plugin_startup.py, whose trees, install and cached
interpreter it reuses. A first process per tree learns the start modules in the order their
imports complete (``-X importtime``) under the real ``import sglang_dsv4_fix.plugin`` +
``register()``. Each probe is then a fresh interpreter that imports torch and
``sglang.srt.server_args`` untimed and takes those modules through the import system's own steps
one at a time, dependencies first, timing each step:
- ``find``: ``importlib.util.find_spec`` and ``module_from_spec`` (the finder and the module);
- ``load``: the loader's ``get_code`` (the ``.pyc`` read, checked and unmarshalled);
- ``exec``: the module's body (its imports of ours are done already: only its own definitions);
then ``register()``, every module loaded (``work``: the tree found, read and judged, the hooks set).
``gc`` is the time spent in the garbage collector inside those steps (``gc.callbacks``), already
counted in them. Asserts per probe that the modules are exactly those the real import loaded, each
from the install under test, and that ``register()`` imported nothing more.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_startup import SERVER, trees

ORDER = """
import PRELOAD
import sys
sys.stderr.write("MARK\\n")
import sglang_dsv4_fix.plugin as plugin
plugin.register()
"""
PROBE = """
import PRELOAD
import gc, importlib.util, os, sys, time
T = time.perf_counter
in_gc, started = [0.0], [0.0]
def watch(phase, info):
    if phase == "start":
        started[0] = T()
    else:
        in_gc[0] += T() - started[0]
gc.callbacks.append(watch)
rows = []
for name in NAMES:
    g, t0 = in_gc[0], T()
    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    t1 = T()
    code = spec.loader.get_code(name)
    t2 = T()
    exec(code, module.__dict__)
    t3 = T()
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    rows.append((name, os.path.getsize(module.__cached__), t1 - t0, t2 - t1, t3 - t2, in_gc[0] - g))
g, t0 = in_gc[0], T()
sys.modules["sglang_dsv4_fix.plugin"].register()
work, work_gc = T() - t0, in_gc[0] - g
after = sorted(m for m in sys.modules if m.split(".")[0] == "sglang_dsv4_fix")
print("AFTER", after)
print("FILES", sorted({os.path.dirname(os.path.dirname(sys.modules[n].__file__)) for n in NAMES}))
print("ROWS", [(n, size, f * 1e3, ld * 1e3, ex * 1e3, gt * 1e3) for n, size, f, ld, ex, gt in rows])
print("WORK", work * 1e3, work_gc * 1e3)
"""
COLUMNS = ("find", "load", "exec", "gc")
KEYS = ("AFTER ", "FILES ", "ROWS ", "WORK ")  # what the probe prints
# one module: name, .pyc bytes, then ms: find, load, exec, of which in the collector
Row = tuple[str, int, float, float, float, float]
Probe = tuple[list[Row], float, float]  # the rows, register() (ms), of which in the collector


def _env(site: Path, *path: Path, cache: Path) -> dict[str, str]:
    from plugin_env import server_site

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    # the judgement itself: the start memo (memo.py) off
    env.update(TVM_FFI_CACHE_DIR=str(cache), PYTHONHASHSEED="0", SGLANG_DSV4_FIX_MEMO="off",
               PYTHONPATH=os.pathsep.join(map(str, (site, *path, server_site()))))  # fmt: skip
    return env


def _python(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    from plugin_env import base_python

    done = subprocess.run((str(base_python()), *args), capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    return done


def start_modules(site: Path, *path: Path, cache: Path) -> list[str]:
    """Our modules in the order their import completes under the real import + register()."""
    done = _python("-X", "importtime", "-c", ORDER.replace("PRELOAD", SERVER),
                   env=_env(site, *path, cache=cache), cwd=site)  # fmt: skip
    rows = done.stderr.split("MARK\n", 1)[1].splitlines()
    names = [r.split("|")[2].strip() for r in rows if r.startswith("import time:")]
    return [n for n in names if n.split(".")[0] == "sglang_dsv4_fix"]


def probe(site: Path, *path: Path, cache: Path, names: list[str]) -> Probe:
    """One fresh process: ``names`` loaded step by step from ``site`` (first on the path), then
    ``register()``."""
    code = PROBE.replace("PRELOAD", SERVER).replace("NAMES", repr(names))
    done = _python("-c", code, env=_env(site, *path, cache=cache), cwd=site)
    out = dict(x.split(" ", 1) for x in done.stdout.splitlines() if x.startswith(KEYS))
    assert ast.literal_eval(out["AFTER"]) == sorted(names), (out["AFTER"], names)
    assert ast.literal_eval(out["FILES"]) == [str(site)], out["FILES"]
    work, work_gc = map(float, out["WORK"].split())
    rows: list[Row] = ast.literal_eval(out["ROWS"])
    return rows, work, work_gc


def main(argv: list[str] | None = None) -> int:
    from plugin_env import install_self

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        site = install_self(tmp / "self")
        cases = trees(tmp)
        order = {tree: start_modules(site, t, cache=c) for tree, (t, c) in cases.items()}
        samples: dict[str, list[Probe]] = {tree: [] for tree in cases}
        for i in range(args.rounds):
            for tree, (t, cache) in cases.items():
                samples[tree].append(probe(site, t, cache=cache, names=order[tree]))
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
    report(samples, order, args.rounds)
    return 0


def _ms(row: Row) -> tuple[float, float, float, float]:
    return row[2], row[3], row[4], row[5]


def report(samples: dict[str, list[Probe]], order: dict[str, list[str]], rounds: int) -> None:
    print(f"import sglang_dsv4_fix.plugin + register(), step by step, median of {rounds} (ms)")
    head = " ".join(f"{c:>6}" for c in COLUMNS)
    print(f"{'tree':30} {'mods':>4} {'KB':>5} {head} {'work':>6} {'w.gc':>6} {'total':>6}")
    for tree, runs in samples.items():
        sums = [[sum(col) for col in zip(*map(_ms, rows), strict=True)] for rows, _, _ in runs]
        med = [statistics.median(s[k] for s in sums) for k in range(len(COLUMNS))]
        work = statistics.median(w for _, w, _ in runs)
        work_gc = statistics.median(g for _, _, g in runs)
        total = statistics.median(sum(s[:3]) + w for s, (_, w, _) in zip(sums, runs, strict=True))
        kb = sum(row[1] for row in runs[0][0]) / 1024
        cells = " ".join(f"{m:6.2f}" for m in med)
        print(f"{tree:30} {len(order[tree]):4} {kb:5.0f} {cells} "
              f"{work:6.2f} {work_gc:6.2f} {total:6.2f}")  # fmt: skip
    tree = list(samples)[-1]
    print(f"per module ({tree}): KB, then ms: find, load, exec")
    for i, name in enumerate(order[tree]):
        rows = [_ms(run[0][i]) for run in samples[tree]]
        cells = " ".join(f"{statistics.median(r[k] for r in rows):6.3f}" for k in range(3))
        print(f"  {name:30} {samples[tree][0][0][i][1] / 1024:5.1f} {cells}")


if __name__ == "__main__":
    raise SystemExit(main())
