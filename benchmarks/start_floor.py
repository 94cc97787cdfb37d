"""The floor under the plugin's start cost: its start modules as one file, against as installed.

Usage: python benchmarks/start_floor.py [--rounds 12]
       python3 benchmarks/start_floor.py --host SELF_SITE RELEASE_TREE EXTRA_SITE [--rounds N]
Run from a temporary folder, like benchmarks/plugin_startup.py, whose trees, install and cached
interpreter it reuses; with ``--host`` (the GPU host, gpu/issue10.sh floor) it runs this Python
with the given sites instead, as gpu/plugin_cost.py does. Each probe is a fresh interpreter that
imports torch and ``sglang.srt.server_args`` (or what gpu/plugin_cost.py finds importable) untimed,
then times ``import sglang_dsv4_fix.plugin`` + ``register()``:
- ``files``: the package as pip installed it (one import, one .pyc, per module);
- ``one file``: the same compiled code objects (read from those .pyc files beforehand), written as
  one marshal file and executed straight into their modules, in the order the import completes
  them. No finder, no loader, no per-file read: what ANY merge of the start modules into fewer
  files could reach at best. Its time is split into loading that file and ``register()`` (the
  tree work itself, every module already loaded).
Asserts per probe that both arms give the same start line (pid aside), that the ``one file``
arm imported none of our modules through the import system and the ``files`` arm all of them,
and that every one of ours came from the install under test. Exit 1 if ``one file`` is above 3 ms
for any tree (the issue's target is out of reach of merging the start modules).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_startup import SERVER, TARGET_MS, _run, host_preload, trees

ORDER = """
import importlib, marshal, sys
import sglang_dsv4_fix.plugin as plugin
plugin.register()
done = [m for m in sys.modules if m.startswith("sglang_dsv4_fix")]
spec = {m: importlib.util.find_spec(m) for m in done}
codes = [(m, spec[m].origin, spec[m].loader.get_code(m)) for m in COMPLETED if m in spec]
assert len(codes) == len(done), (COMPLETED, done)
with open(BLOB, "wb") as f:
    marshal.dump(codes, f)
print("MODULES", len(codes))
"""
PROBE = """
import logging, sys, time, types
ARM = None
t0 = time.perf_counter()
if ARM == "one file":
    import marshal
    with open(BLOB, "rb") as f:  # one read (marshal.load on a file reads it piecemeal)
        codes = marshal.loads(f.read())
    for name, origin, code in codes:
        module = types.ModuleType(name)
        module.__file__, module.__loader__ = origin, "one-file"
        if name == "sglang_dsv4_fix":
            module.__path__, module.__package__ = [origin.rsplit("/", 1)[0]], name
        else:
            module.__package__ = "sglang_dsv4_fix"
            setattr(sys.modules["sglang_dsv4_fix"], name.rsplit(".", 1)[1], module)
        sys.modules[name] = module
        exec(code, module.__dict__)
t1 = time.perf_counter()
import sglang_dsv4_fix.plugin as plugin
plugin.register()
t2 = time.perf_counter()
ours = [m for m in sys.modules if m.startswith("sglang_dsv4_fix")]
via_import = [m for m in ours if getattr(sys.modules[m], "__loader__", None) != "one-file"]
logging.basicConfig()
line = plugin.start_line(plugin._process)
print("MS", (t2 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, len(ours), len(via_import))
print("LINE", line)
print("FROM", sorted({sys.modules[m].__file__.rsplit("/sglang_dsv4_fix", 1)[0] for m in ours}))
"""
ARMS = ("files", "one file")


class Host:
    """Where the probes run: the tests' cached interpreter (``python`` None) or this one, with
    our install first on the path, then a tree's site, then ``extra``."""

    def __init__(self, self_site: Path, extra: Path, python: str | None, preload: str) -> None:
        self.self_site, self.extra, self.python, self.preload = self_site, extra, python, preload

    def run(self, code: str, site: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        code = f"import {self.preload}\n{code}"
        path = (self.self_site, site, self.extra)
        if self.python is None:
            from plugin_env import run_python

            return run_python(code, *path, env=env)
        return _run(self.python, code, *path, env=env)


def completion_order(host: Host, site: Path, cache: Path) -> list[str]:
    """Our modules in the order ``python -X importtime`` reports them done (a module after
    everything it imports), from one plain start."""
    code = "import sglang_dsv4_fix.plugin as p\np.register()\n"
    done = host.run(
        code,
        site,
        {
            "TVM_FFI_CACHE_DIR": str(cache),
            "SGLANG_DSV4_FIX_MEMO": "off",
            "PYTHONPROFILEIMPORTTIME": "1",
        },
    )
    if done.returncode != 0:
        raise SystemExit(f"order probe failed:\n{done.stderr[-2000:]}")
    names = re.findall(r"^import time:.*\|\s*(sglang_dsv4_fix\S*)$", done.stderr, re.MULTILINE)
    return list(dict.fromkeys(names))


def write_blob(host: Host, blob: Path, order: list[str], site: Path, cache: Path) -> None:
    code = ORDER.replace("COMPLETED", repr(order)).replace("BLOB", repr(str(blob)))
    done = host.run(code, site, {"TVM_FFI_CACHE_DIR": str(cache), "SGLANG_DSV4_FIX_MEMO": "off"})
    if done.returncode != 0 or "MODULES" not in done.stdout:
        raise SystemExit(f"blob probe failed:\n{done.stderr[-2000:]}")


def probe(
    host: Host, arm: str, blob: Path, site: Path, cache: Path
) -> tuple[float, float, float, str]:
    code = PROBE.replace("ARM = None", f"ARM = {arm!r}").replace("BLOB", repr(str(blob)))
    done = host.run(
        code,
        site,
        {"TVM_FFI_CACHE_DIR": str(cache), "SGLANG_DSV4_FIX_MEMO": "off", "PYTHONHASHSEED": "0"},
    )
    ms = next((x for x in done.stdout.splitlines() if x.startswith("MS ")), None)
    line = next((x for x in done.stdout.splitlines() if x.startswith("LINE ")), None)
    if done.returncode != 0 or ms is None or line is None:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    total, load, work, ours, via_import = ms.split()[1:]
    # one file: none of ours came through the import system; files: all of them did, from our install
    assert via_import == ("0" if arm == "one file" else ours), ms
    assert f"FROM {[str(host.self_site)]}" in done.stdout, done.stdout
    return float(total), float(load), float(work), re.sub(r"pid=\d+", "pid=?", line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--host", nargs=3, metavar=("SELF_SITE", "RELEASE_TREE", "EXTRA_SITE"),
                        help="run this Python with these sites (the GPU host)")  # fmt: skip
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        host, racy = _host(args.host, tmp)
        cases = trees(tmp, racy)
        blobs = {tree: tmp / f"start-{i}.marshal" for i, tree in enumerate(cases)}
        for tree, (site, cache) in cases.items():
            write_blob(host, blobs[tree], completion_order(host, site, cache), site, cache)
        samples: dict[tuple[str, str], list[tuple[float, ...]]] = {}
        for i in range(args.rounds):
            for tree, (site, cache) in cases.items():
                lines = set()
                for arm in ARMS[i % 2 :] + ARMS[: i % 2]:
                    *ms, line = probe(host, arm, blobs[tree], site, cache)
                    samples.setdefault((tree, arm), []).append(tuple(ms))
                    lines.add(line)
                assert len(lines) == 1, lines  # both arms rendered the same verdict
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
    print(f"preload: {host.preload}")
    return table(samples, list(cases))


def _host(given: list[str] | None, tmp: Path) -> tuple[Host, Path | None]:
    """The probes' host, and the racy tree to copy (None: the tests' cached release)."""
    if given is None:
        from plugin_env import install_self, server_site

        return Host(install_self(tmp / "self"), server_site(), None, SERVER), None
    self_site, release, extra = map(Path, given)
    return Host(self_site, extra, sys.executable, host_preload(release, extra)), release


def table(samples: dict[tuple[str, str], list[tuple[float, ...]]], cases: list[str]) -> int:
    rounds = min(len(x) for x in samples.values())
    print(f"import sglang_dsv4_fix.plugin + register(), wall-clock, median of {rounds} (ms)")
    print(f"{'tree':30} {'files':>7} {'one file':>9} {'= load':>7} {'+ register':>10}")
    worst = 0.0
    for tree in cases:
        files = statistics.median(x[0] for x in samples[(tree, "files")])
        one, load, work = (statistics.median(x[k] for x in samples[(tree, "one file")])
                           for k in range(3))  # fmt: skip
        worst = max(worst, one)
        print(f"{tree:30} {files:7.2f} {one:9.2f} {load:7.2f} {work:10.2f}")
    verdict = "within" if worst <= TARGET_MS else "above"
    print(f"one file, the floor of any merge: {verdict} the {TARGET_MS} ms target")
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
