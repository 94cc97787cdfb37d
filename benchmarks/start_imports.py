"""What the plugin's ``register()`` imports of this package in a server process, and its import time.

Usage: python benchmarks/start_imports.py --baseline REF [--rounds 9]
Run from a temporary folder, like benchmarks/plugin_startup.py, whose trees, installs and cached
interpreter it reuses. Each probe is a fresh interpreter under ``python -X importtime`` that
imports torch and ``sglang.srt.server_args``, then runs SGLang's real ``load_plugins()``; the
figure is the sum of the self-times Python reports for this package's modules. It leaves out the
package and ``sglang_dsv4_fix.plugin`` (SGLang imports those through ``importlib.import_module``,
which ``-X importtime`` does not time) and counts the timer's own overhead, so it is not the start
cost (plugin_startup.py measures that); it is the part of it that the number and size of the
modules decide, which varies far less between processes than the whole window does here.
Two arms, alternating in each round: ``plugin`` (this checkout) and ``baseline`` (this package as
committed at REF); each probe asserts that every module it counts came from its own install.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_startup import SERVER, install_ref, trees

ARMS = ("plugin", "baseline")

PROBE = f"""
import {SERVER}
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
print("FROM", sorted({{m.__file__.rsplit("/sglang_dsv4_fix/", 1)[0] for n, m in sys.modules.items()
                      if n.startswith("sglang_dsv4_fix")}}))
"""


def probe(site: Path, *path: Path, cache: Path) -> tuple[float, list[str]]:
    """(sum of the package's modules' self-times in ms, their names) in one fresh process."""
    from plugin_env import base_python

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    # the judgement itself: the start memo (memo.py) off
    env.update(TVM_FFI_CACHE_DIR=str(cache), PYTHONHASHSEED="0", SGLANG_DSV4_FIX_MEMO="off",
               PYTHONPATH=os.pathsep.join(map(str, (site, *path))))  # fmt: skip
    done = subprocess.run((str(base_python()), "-X", "importtime", "-c", PROBE), cwd=site,
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"probe failed:\n{done.stderr[-2000:]}")
    origin = next(x for x in done.stdout.splitlines() if x.startswith("FROM "))
    assert origin == f"FROM {[str(site)]}", (origin, site)  # ours, and only from this arm's install
    rows = [x.split("|") for x in done.stderr.splitlines() if x.startswith("import time:")]
    ours = [(int(r[0].split(":")[1]), r[2].strip()) for r in rows if "sglang_dsv4_fix" in r[2]]
    assert ours, done.stderr[-2000:]
    return sum(us for us, _ in ours) / 1e3, [name for _, name in ours]


def main(argv: list[str] | None = None) -> int:
    from plugin_env import install_self, server_site

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REF", required=True)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        sites = {"plugin": install_self(tmp / "self"),
                 "baseline": install_ref(args.baseline, tmp / "baseline")}  # fmt: skip
        cases = trees(tmp)
        ms: dict[tuple[str, str], list[float]] = {}
        names: dict[tuple[str, str], list[str]] = {}
        for i in range(args.rounds):
            for tree, (site, cache) in cases.items():
                for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                    total, names[(tree, arm)] = probe(sites[arm], site, server_site(), cache=cache)
                    ms.setdefault((tree, arm), []).append(total)
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
    print(f"-X importtime self-time of this package's modules (ms), median of {args.rounds}")
    print(f"{'tree':30} {'baseline':>8} {'plugin':>8}  modules (baseline -> plugin)")
    for tree in cases:
        base, ours = (statistics.median(ms[(tree, arm)]) for arm in ("baseline", "plugin"))
        print(f"{tree:30} {base:8.2f} {ours:8.2f}  "
              f"{len(names[(tree, 'baseline')])} -> {len(names[(tree, 'plugin')])}")  # fmt: skip
    for tree in cases:
        for arm in ARMS:
            short = [n.removeprefix("sglang_dsv4_fix.") for n in names[(tree, arm)]]
            print(f"{tree} / {arm}: {' '.join(short)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
