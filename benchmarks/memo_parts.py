"""What the first process after a change pays for the start memo, part by part.

Usage: python benchmarks/memo_parts.py [--rounds 9]
Run from a temporary folder, like benchmarks/plugin_startup.py, whose trees, install and cached
interpreter it reuses. Each probe is a fresh interpreter with an empty memo folder that imports
torch and ``sglang.srt.server_args`` untimed, then ``sglang_dsv4_fix.plugin`` and ``.memo``
(timed: ``import``), wraps the memo's steps in timers and runs ``load_plugins()`` +
``configure_logger()`` (``window``). Parts, in ms:
- ``lookup``: the memo's lookup, which finds nothing;
- ``judge``: the judgement, its imports and ``verdict.inputs`` (as without the memo, plus the list);
- ``store``: the store, and inside it ``own files`` (our loaded modules), ``fingerprints`` (one
  per input), ``quiet``, ``json.dumps``, ``write`` (fsops.replace_at, the atomic write) and
  ``makedirs`` (the memo's folder, which the probe's empty cache folder lacks: a host's first).
``gc``: the garbage collector's time inside the window (already in the parts it interrupted).
The timers' own calls are in ``window`` too: read it as an upper bound.
Asserts per probe that the lookup missed, the tree was judged, the store wrote through
``replace_at`` without importing the CLI's writing module (``fswrite``), and it left exactly one
entry: the process measured is a first process.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_startup import SERVER, trees

PROBE = """
import PRELOAD
import json, os, sys, time, types
import sglang.srt.plugins as plugins
import sglang.srt.utils as utils
T, seen, inside = {}, {}, set()
def timed(owner, name, key):  # a call inside another of the same key (makedirs') counts once
    fn = getattr(owner, name)
    def run(*a, **k):
        if key in inside:
            return fn(*a, **k)
        inside.add(key)
        t = time.perf_counter()
        try:
            out = fn(*a, **k)
            seen.setdefault(key, out)
            return out
        finally:
            inside.discard(key)
            T[key] = T.get(key, 0.0) + (time.perf_counter() - t) * 1e3
    setattr(owner, name, run)
t = time.perf_counter()
from sglang_dsv4_fix import memo, plugin
T["import"] = (time.perf_counter() - t) * 1e3
timed(memo, "lookup", "lookup")
timed(plugin, "_judge", "judge")
timed(memo, "store", "store")
timed(memo, "_own_files", "own files")
timed(memo, "_fingerprint", "fingerprints")
timed(memo, "_quiet", "quiet")
timed(json, "dumps", "json.dumps")
timed(memo, "replace_at", "write")
timed(os, "makedirs", "makedirs")
import gc
gc_start, T["gc"] = [0.0], 0.0
def watch(phase, info):  # the garbage collector's own time inside the window
    if phase == "start":
        gc_start[0] = time.perf_counter()
    else:
        T["gc"] += (time.perf_counter() - gc_start[0]) * 1e3
t = time.perf_counter()
gc.callbacks.append(watch)
plugins.load_plugins()
utils.configure_logger(types.SimpleNamespace(log_level="error"), prefix=" TP0")
gc.callbacks.remove(watch)
T["window"] = (time.perf_counter() - t) * 1e3
ok = {"missed": seen.get("lookup", 0) is None, "judged": "sglang_dsv4_fix.verdict" in sys.modules,
      "wrote": "write" in T, "no fswrite": "sglang_dsv4_fix.fswrite" not in sys.modules}
print("PARTS", repr(T))
print("OK", repr(ok))
"""
ORDER = ("import", "lookup", "judge", "store", "own files", "fingerprints",
         "quiet", "json.dumps", "write", "makedirs", "gc", "window")  # fmt: skip


def probe(self_site: Path, site: Path, cache: Path, memo: Path) -> dict[str, float]:
    from plugin_env import run_python, server_site

    env = {"TVM_FFI_CACHE_DIR": str(cache), "PYTHONHASHSEED": "0", "XDG_CACHE_HOME": str(memo)}
    done = run_python(PROBE.replace("PRELOAD", SERVER), self_site, site, server_site(), env=env)
    lines = dict(x.split(" ", 1) for x in done.stdout.splitlines() if x.startswith(("PARTS", "OK")))
    if done.returncode != 0 or len(lines) != 2:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    parts, ok = ast.literal_eval(lines["PARTS"]), ast.literal_eval(lines["OK"])
    stored = list((memo / "sglang-dsv4-fix" / "start").glob("*.json"))
    assert all(ok.values()) and len(stored) == 1, (ok, stored)
    return dict(parts)


def main() -> int:
    from plugin_env import install_self

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        self_site = install_self(tmp / "self")
        cases = trees(tmp)
        rows: dict[str, dict[str, list[float]]] = {}
        for i in range(args.rounds):
            for tree, (site, cache) in cases.items():
                memo = Path(tempfile.mkdtemp(prefix="memo-", dir=tmp))
                for key, ms in probe(self_site, site, cache, memo).items():
                    rows.setdefault(tree, {}).setdefault(key, []).append(ms)
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
    print(f"The first process's memo work, median of {args.rounds} fresh processes (ms)")
    print(f"{'part':16} " + " ".join(f"{t[:22]:>22}" for t in rows))
    for key in ORDER:
        print(f"{key:16} " + " ".join(f"{statistics.median(r[key]):22.3f}" for r in rows.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
