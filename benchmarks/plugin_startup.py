"""What the plugin adds to an SGLang process's start, under SGLang's real ``load_plugins()``.

Usage: python benchmarks/plugin_startup.py [--rounds 8]
Runs from a temporary folder (never the checkout: its *.egg-info would expose the entry point to
the "none" arm too), in the tests' cached interpreter (tests/plugin_env.py) with the real SGLang
0.5.16 and what ``sglang.srt.server_args`` needs. Each probe is a fresh interpreter that imports
torch and ``sglang.srt.server_args`` untimed (every server process has them loaded), then times
``load_plugins()`` + SGLang's own ``configure_logger``. Three trees: racy (as released), fixed with
an empty JIT cache, fixed with its no-init build in the cache (``prewarm --arch 9.0a``, needs
nvcc). Each round runs both arms of every tree, alternating the order; the "none" arm asserts that
the plugin's entry point is absent and its module was never imported. Prints medians side by side;
exit 1 if any tree adds more than 3 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from plugin_env import copy_site, install_self, release_site, run_python, server_site

RELEASE = "0.5.16"
TARGET_MS = 3.0
PROBE = """
import sys, time, types
import torch, sglang.srt.server_args
import sglang.srt.plugins as plugins
import sglang.srt.utils as utils
from importlib.metadata import entry_points
t0 = time.perf_counter()
plugins.load_plugins()
utils.configure_logger(types.SimpleNamespace(log_level="error"), prefix=" TP0")
t1 = time.perf_counter()
names = [ep.name for ep in entry_points(group="sglang.srt.plugins")]
loaded = "sglang_dsv4_fix.plugin" in sys.modules
print("MS", (t1 - t0) * 1e3, int(loaded), ",".join(names) or "-")
"""


def measure(arm: str, cache: Path, *path: Path) -> float:
    done = run_python(PROBE, *path, env={"TVM_FFI_CACHE_DIR": str(cache)})
    line = next((x for x in done.stdout.splitlines() if x.startswith("MS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    ms, loaded, names = line.split()[1:]
    if arm == "none":  # the baseline must really run without the plugin
        assert loaded == "0" and "sglang_dsv4_fix" not in names.split(","), line
    else:
        assert loaded == "1" and "sglang_dsv4_fix" in names.split(","), line
    return float(ms)


def trees(tmp: Path) -> dict[str, tuple[Path, Path]]:
    """name -> (site, JIT cache folder)."""
    racy = release_site(RELEASE)
    fixed = copy_site(racy, tmp / "fixed")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        server = server_site()
        self_site = install_self(tmp / "self")
        samples: dict[tuple[str, str], list[float]] = {}
        cases = trees(tmp)
        for i in range(args.rounds):
            for tree, (site, cache) in cases.items():
                arms = [("plugin", (self_site, site, server)), ("none", (site, server))]
                for arm, path in arms if i % 2 == 0 else arms[::-1]:
                    samples.setdefault((tree, arm), []).append(measure(arm, cache, *path))
    print(f"SGLang {RELEASE}, load_plugins() + configure_logger(), median of {args.rounds} (ms)")
    print(f"{'tree':32} {'none':>8} {'plugin':>8} {'added':>8}")
    worst = 0.0
    for tree in cases:
        none = statistics.median(samples[(tree, "none")])
        plugin = statistics.median(samples[(tree, "plugin")])
        worst = max(worst, plugin - none)
        print(f"{tree:32} {none:8.2f} {plugin:8.2f} {plugin - none:8.2f}")
    print(f"target: <= {TARGET_MS} ms added: {'met' if worst <= TARGET_MS else 'NOT met'}")
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
