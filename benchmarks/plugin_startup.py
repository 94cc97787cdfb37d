"""What the plugin adds to an SGLang process's start, under SGLang's real ``load_plugins()``.

Usage: python benchmarks/plugin_startup.py [--rounds 12] [--budget SECONDS] [--baseline REF]
                                           [--arms none,plugin,first,changed,off,...]
Runs from a temporary folder (never the checkout: its *.egg-info would expose the entry point to
the "none" arm too), in the tests' cached interpreter (tests/plugin_env.py) with the real SGLang
0.5.16 and what ``sglang.srt.server_args`` needs. Each probe is a fresh interpreter that imports
torch and ``sglang.srt.server_args`` untimed (every server process has them loaded), then times
``load_plugins()`` + SGLang's own ``configure_logger``. Three trees: racy (as released), fixed with
an empty JIT cache, fixed with its no-init build in the cache (``prewarm --arch 9.0a``, needs
nvcc). Three arms per tree, in rotating order each round:
- ``none``: no plugin installed (asserted: no entry point in the group, our module never imported);
- ``empty``: a plugin whose ``register()`` does nothing, installed the same way: what SGLang's
  framework costs for any plugin (it lists the entry point, reads the distribution's metadata,
  imports the module); asserted: ours absent, it present;
- ``plugin``: this package (asserted: entry point present, module imported), its start memo
  (memo.py) kept between the probes of a tree, as between the processes of a server: every probe
  after a tree's first takes the status the first one stored;
- ``first``: this package with an empty start memo in every probe: the host's first process
  judges the tree, makes the memo's folder and stores the entry;
- ``changed`` (only when ``--arms`` names it): this package, its memo folder holding the tree's
  entry with the last of its inputs changed: the first process after a change on a host that ran
  the plugin before (the entry read, compared path by path to the last, rejected; the tree judged
  and the entry stored again; asserted per probe);
- ``off`` (only when ``--arms`` names it): this package with ``SGLANG_DSV4_FIX_MEMO=off``: every
  process judges and stores nothing, so ``first`` minus ``off`` is what the memo costs a first
  process;
- ``baseline`` (with ``--baseline REF``): this package as committed at git ``REF``, installed the
  same way, asserted as ``plugin``: the code before a change, in the same rounds as the change;
- ``bfirst`` (with ``--baseline REF``, only when ``--arms`` names it): that install with an empty
  start memo in every probe, as ``first``: the first process before a change.
``--arms`` runs only the arms it names (fewer arms, more rounds in the same time); the default is
every arm but ``changed``, ``off`` and ``bfirst``.
Prints medians side by side, of wall-clock time and of the probe thread's CPU time (on a busy
machine the second is the work itself), then the plugins' own part of the window, timed inside it
(each entry point's ``ep.load()`` and call, through a wrapper around ``EntryPoint.load``, and
``configure_logger()`` alone): SGLang's entry-point scan around it varies between processes by more
than the plugin costs. Exit 1 if any tree's ``plugin`` arm adds more than 3 ms wall-clock (not
judged when ``--arms`` leaves it out).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

RELEASE = "0.5.16"
TARGET_MS = 3.0
ARMS = ("none", "empty", "plugin", "first")
# ours: this checkout (the first four), as committed at --baseline (the last two)
OURS = ("plugin", "first", "changed", "off", "baseline", "bfirst")
NAMED_ONLY = ("changed", "off", "bfirst")  # arms run only when --arms names them
FRESH = ("first", "bfirst")  # an empty start memo in every probe
EMPTY = "sglang_plugin_that_does_nothing"
SERVER = "torch, sglang.srt.server_args"  # what every server process has loaded before
PROBE = """
import sys, time, types
import PRELOAD
import importlib.metadata as md
import sglang.srt.plugins as plugins
import sglang.srt.utils as utils
from importlib.metadata import entry_points
own = []  # each plugin's part of load_plugins(): ep.load() (its import), then its call
_load = md.EntryPoint.load
def load(ep):
    t = time.perf_counter()
    fn = _load(ep)
    own.append(time.perf_counter() - t)
    def timed():
        t = time.perf_counter()
        try:
            return fn()
        finally:
            own.append(time.perf_counter() - t)
    return timed
md.EntryPoint.load = load
t0, c0 = time.perf_counter(), time.thread_time()
plugins.load_plugins()
t1 = time.perf_counter()
utils.configure_logger(types.SimpleNamespace(log_level="error"), prefix=" TP0")
t2, c2 = time.perf_counter(), time.thread_time()
names = [ep.name for ep in entry_points(group="sglang.srt.plugins")]
loaded = "sglang_dsv4_fix.plugin" in sys.modules
mods = sum(n == "sglang_dsv4_fix" or n.startswith("sglang_dsv4_fix.") for n in sys.modules)
print("MS", (t2 - t0) * 1e3, (c2 - c0) * 1e3, int(loaded), ",".join(names) or "-",
      sum(own) * 1e3, (t2 - t1) * 1e3, mods)
"""
# A sample: the window's wall-clock and CPU ms, then within it (wall-clock ms) the plugins' own
# part of load_plugins() (ep.load() + the call: 0 with none) and configure_logger() (the start
# line); last, how many of our modules (the package and those under it) the process had imported.
Sample = tuple[float, float, float, float, int]


def measure(
    arm: str, cache: Path, *path: Path, python: str | None = None, preload: str = SERVER
) -> Sample:
    """One probe in a fresh interpreter: the tests' cached one, or ``python`` (gpu/plugin_cost.py
    runs the GPU host's own, and says what it could ``preload``)."""
    # one hash seed for every probe: the arms differ by what they run, not by their dicts' layout;
    # the start memo beside the JIT cache, the same for every probe of a tree but those of the
    # arms that start from an empty one (FRESH) and of "off" (checked to write nothing)
    memo = cache.with_name(f"{cache.name}-memo")
    if arm in FRESH or arm in ("changed", "off"):
        memo = Path(tempfile.mkdtemp(prefix=f"{arm}-memo-", dir=cache.parent))
    env = {"TVM_FFI_CACHE_DIR": str(cache), "PYTHONHASHSEED": "0", "XDG_CACHE_HOME": str(memo)}
    if arm == "off":
        env["SGLANG_DSV4_FIX_MEMO"] = "off"
    code = PROBE.replace("PRELOAD", preload)
    stale = _plant_stale(memo, code, cache, path, python, env) if arm == "changed" else None
    line = _probe(code, path, python, env)
    wall, cpu, loaded, listed, own, logger, mods = line.split()[1:]
    names = listed.split(",")
    if arm in OURS:
        assert loaded == "1" and "sglang_dsv4_fix" in names, line
    else:  # the baselines must really run without this plugin
        assert loaded == "0" and mods == "0" and "sglang_dsv4_fix" not in names, line
        assert (EMPTY in names) == (arm == "empty"), line
    if arm == "off":  # the memo really off: its folder, empty before, is left empty
        assert not any(memo.iterdir()), list(memo.iterdir())
    if stale is not None:  # the stale entry was rejected: the tree judged, the entry stored anew
        assert stale[0].read_bytes() != stale[1], f"the stale entry stayed: {line}"
    return float(wall), float(cpu), float(own), float(logger), int(mods)


def _probe(code: str, path: tuple[Path, ...], python: str | None, env: dict[str, str]) -> str:
    """The probe's ``MS`` line, from the tests' cached interpreter or ``python``."""
    if python is None:
        from plugin_env import run_python

        done = run_python(code, *path, env=env)
    else:
        done = _run(python, code, *path, env=env)
    line = next((x for x in done.stdout.splitlines() if x.startswith("MS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    return line


def _plant_stale(
    memo: Path, code: str, cache: Path, path: tuple[Path, ...], python: str | None,
    env: dict[str, str],
) -> tuple[Path, bytes]:  # fmt: skip
    """The tree's entry, as a first process stores it (one untimed probe per tree and install,
    kept), put into ``memo`` with its last input's mtime moved back 1 ns; returns its path and
    bytes."""
    import json

    seed = cache.with_name(f"{cache.name}-seed-{abs(hash(path)):x}")
    if not seed.exists():
        seed.mkdir()
        _probe(code, path, python, {**env, "XDG_CACHE_HOME": str(seed)})
    (entry,) = (seed / "sglang-dsv4-fix" / "start").glob("*.json")
    data = json.loads(entry.read_bytes())
    for fingerprint in data["inputs"][-1][1]:  # [lstat, stat]: both the same file's here
        fingerprint[4] -= 1
    folder = memo / "sglang-dsv4-fix" / "start"
    folder.mkdir(mode=0o700, parents=True)
    stale = json.dumps(data).encode()
    (folder / entry.name).write_bytes(stale)
    return folder / entry.name, stale


def _run(
    python: str, code: str, *path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    full.update(env, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    return subprocess.run((python, "-c", code), capture_output=True, text=True, env=full,
                          cwd=path[0] if path else None, timeout=300)  # fmt: skip


def install_ref(ref: str, dest: Path) -> Path:
    """This repository's package as committed at ``ref``, pip-installed into ``dest``."""
    from plugin_env import REPO, base_python

    src = dest.with_name(dest.name + "-src")
    src.mkdir()
    archive = subprocess.run(("git", "-C", str(REPO), "archive", "--format=tar", ref),
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(("tar", "-x", "-C", str(src)), input=archive, check=True)
    subprocess.run((str(base_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--no-build-isolation", "--target", str(dest), str(src)),
                   check=True)  # fmt: skip
    return dest


def empty_plugin(dest: Path) -> Path:
    """A distribution whose entry point is a ``register()`` that does nothing (a short METADATA,
    as ours has: SGLang parses each plugin distribution's metadata)."""
    (dest / EMPTY).mkdir(parents=True)
    (dest / EMPTY / "__init__.py").write_text("def register():\n    pass\n")
    info = dest / f"{EMPTY}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {EMPTY}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{EMPTY} = {EMPTY}:register\n")
    return dest


def host_preload(*path: Path) -> str:
    """What a probe with this Python and ``path`` preloads: SERVER, or, where this host cannot
    import ``server_args`` (the GPU host's transformers), ``torch, sglang.srt.utils``, saying so."""
    probe = subprocess.run((sys.executable, "-c", f"import {SERVER}"), capture_output=True,
                           text=True, env={"PYTHONPATH": os.pathsep.join(map(str, path)),
                                           "PATH": "/usr/bin:/bin"})  # fmt: skip
    if probe.returncode == 0:
        return SERVER
    preload = "torch, sglang.srt.utils"
    reason = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "?"
    print(f"cannot import {SERVER} here ({reason}); preloading {preload} instead")
    return preload


def trees(tmp: Path, racy: Path | None = None) -> dict[str, tuple[Path, Path]]:
    """name -> (site, JIT cache folder); ``racy``: an unpacked release (else the tests' cache's)."""
    import shutil

    if racy is None:
        from plugin_env import release_site

        racy = release_site(RELEASE)
    fixed = tmp / "fixed"
    shutil.copytree(racy, fixed, symlinks=True, ignore=shutil.ignore_patterns(".complete"))
    cli = (sys.executable, "-m", "sglang_dsv4_fix")
    subprocess.run(
        (*cli, "apply", "--tree", str(fixed)), check=True, cwd=tmp, stdout=subprocess.DEVNULL
    )
    (tmp / "empty").mkdir()
    warm = tmp / "warm"
    env = {**os.environ, "TVM_FFI_CACHE_DIR": str(warm)}
    subprocess.run((*cli, "prewarm", "--tree", str(fixed), "--arch", "9.0a"), check=True,
                   cwd=tmp, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    return {
        "racy (as released)": (racy, tmp / "empty"),
        "fixed, empty JIT cache": (fixed, tmp / "empty"),
        "fixed, no-init build cached": (fixed, warm),
    }


def run(
    rounds: int, cases: dict[str, tuple[Path, Path]], sites: dict[str, tuple[Path, ...]],
    extra: tuple[Path, ...] = (), python: str | None = None, preload: str = SERVER,
    budget: float | None = None,
) -> dict[tuple[str, str], list[Sample]]:  # fmt: skip
    """Every arm of every tree, ``rounds`` times, the arms' order rotating each round, one probe
    at a time. With ``budget`` (seconds), no round starts that would end past it at the pace of
    the slowest round so far: a run under a time limit ends with the rounds it finished rather
    than with nothing."""
    samples: dict[tuple[str, str], list[Sample]] = {}
    start = last = time.monotonic()
    slowest = 0.0
    for i in range(rounds):
        if i and budget is not None and time.monotonic() - start + slowest > budget:
            print(f"budget of {budget:.0f} s: no room for round {i + 1}", file=sys.stderr)
            break
        arms = tuple(sites)
        order = arms[i % len(arms) :] + arms[: i % len(arms)]
        for tree, (site, cache) in cases.items():
            for arm in order:
                ms = measure(arm, cache, *sites[arm], site, *extra, python=python, preload=preload)
                samples.setdefault((tree, arm), []).append(ms)
        now = time.monotonic()
        slowest, last = max(slowest, now - last), now
        print(f"round {i + 1}/{rounds} ({now - start:.0f} s)", file=sys.stderr)
    return samples


def main() -> int:
    from plugin_env import install_self, server_site

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no round that would end past this at the slowest round's pace; the table "
        "covers the rounds done",
    )
    parser.add_argument("--baseline", metavar="REF",
                        help="also time this package as committed at git REF, in the same rounds")  # fmt: skip
    parser.add_argument("--arms", type=lambda s: s.split(","), metavar="A,B,...",
                        help="only these arms (none, empty, plugin, first, changed, off, baseline, bfirst)")  # fmt: skip
    args = parser.parse_args()
    wanted = args.arms or [a for a in (*ARMS, "baseline") if a not in NAMED_ONLY]
    known, by_ref = {*ARMS, *OURS}, {"baseline", "bfirst"} & set(wanted)
    if "none" not in wanted or not set(wanted) <= known or (by_ref and not args.baseline):
        parser.error(f"--arms: none is needed, and only {', '.join(dict.fromkeys((*ARMS, *OURS)))} (baseline "
                     "and bfirst with --baseline)")  # fmt: skip
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        sites = {"none": (), "empty": (empty_plugin(tmp / "empty-plugin"),),
                 "plugin": (install_self(tmp / "self"),)}  # fmt: skip
        sites["first"] = sites["changed"] = sites["off"] = sites["plugin"]
        if args.baseline:
            sites["baseline"] = sites["bfirst"] = (install_ref(args.baseline, tmp / "baseline"),)
        sites = {arm: site for arm, site in sites.items() if arm in wanted}
        cases = trees(tmp)
        samples = run(args.rounds, cases, sites, (server_site(),), budget=args.budget)
    return table(samples, cases)


def table(samples: dict[tuple[str, str], list[Sample]], cases: dict[str, Any]) -> int:
    """Medians of the wall-clock time (the target) and of the probe thread's CPU time (the same
    work without the time other processes took the CPU away: the figure to trust on a busy host);
    then the parts of the window that are the plugins' own, timed inside it. A ``baseline`` arm
    gets its own columns; the target is judged on ``plugin`` (not at all without it). ``empty``
    may be left out (the GPU host's runs, for rounds): its columns then read "-"."""
    worst, rounds = 0.0, min(len(x) for x in samples.values())
    tree0 = next(iter(cases))  # every tree has the same arms
    ours = [a for a in OURS if (tree0, a) in samples]
    has_empty = (tree0, "empty") in samples

    def over(x: float, empty: float | None) -> str:
        return f"{x - empty:10.2f}" if empty is not None else f"{'-':>10}"

    for clock, i in (("wall-clock", 0), ("CPU time", 1)):
        print(f"SGLang {RELEASE}, load_plugins() + configure_logger(), {clock}, "
              f"median of {rounds} (ms)")  # fmt: skip
        print(f"{'tree':30} {'none':>7} {'empty':>7} "
              + " ".join(f"{a:>8} {a[:4] + ' added':>10} {'over empty':>10}" for a in ours))  # fmt: skip
        for tree in cases:
            arms = ("none", "empty", *ours) if has_empty else ("none", *ours)
            med = {a: statistics.median(x[i] for x in samples[(tree, a)]) for a in arms}
            empty = med.get("empty")
            if i == 0 and "plugin" in med:
                worst = max(worst, med["plugin"] - med["none"])
            print(f"{tree:30} {med['none']:7.2f} "
                  + (f"{empty:7.2f} " if empty is not None else f"{'-':>7} ")
                  + " ".join(f"{med[a]:8.2f} {med[a] - med['none']:10.2f} {over(med[a], empty)}"
                             for a in ours))  # fmt: skip
    print(f"Inside that window, wall-clock, median of {rounds} (ms): each plugin's own part of "
          "load_plugins() (ep.load() + register()), and configure_logger()")  # fmt: skip
    print(f"{'tree':30} {'arm':>8} {'own':>7} {'logger':>7} {'own + logger added':>18} "
          f"{'modules':>8}")  # fmt: skip
    for tree in cases:
        log_n = statistics.median(x[3] for x in samples[(tree, "none")])
        for arm in ("empty", *ours) if has_empty else ours:
            own = statistics.median(x[2] for x in samples[(tree, arm)])
            log = statistics.median(x[3] for x in samples[(tree, arm)])
            mods = sorted({x[4] for x in samples[(tree, arm)]})
            span = f"{mods[0]}" if len(mods) == 1 else f"{mods[0]}-{mods[-1]}"
            print(f"{tree:30} {arm:>8} {own:7.2f} {log:7.2f} {own + log - log_n:18.2f} {span:>8}")
    if "plugin" not in ours:
        print(f"target: <= {TARGET_MS} ms added (wall-clock): not judged (no plugin arm)")
        return 0
    print(
        f"target: <= {TARGET_MS} ms added (wall-clock): {'met' if worst <= TARGET_MS else 'NOT met'}"
    )
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
