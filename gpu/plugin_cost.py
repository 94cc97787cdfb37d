"""The plugin's start cost on the GPU host (benchmarks/plugin_startup.py's probe and arms, run
with this host's own Python instead of the tests' cached interpreter).

Usage: python3 gpu/plugin_cost.py SELF_SITE RELEASE_TREE EXTRA_SITE [ROUNDS [BUDGET_S]]
SELF_SITE: this package pip-installed with its entry point; RELEASE_TREE: an unpacked SGLang
0.5.16 wheel (with its dist-info); EXTRA_SITE: what the release needs beyond this host's site
(apache-tvm-ffi, small packages). Preloads ``torch, sglang.srt.server_args`` as every server
process has them, or, if the host cannot import ``server_args``, ``torch, sglang.srt.utils`` and
says so. BUDGET_S: start no round that would end past that many seconds at the pace of the
slowest round so far (the table covers the rounds done).
With ``COST_BASELINE=SITE`` in the environment, a ``baseline`` arm times the package installed
there in the same rounds (benchmarks/plugin_startup.py's ``--baseline``, asserted the same way).
``COST_ARMS=none,plugin,...`` runs only those arms; ``changed`` (a stale entry), ``off`` (the memo
off) and ``bfirst`` (the baseline's first process) run only when named (a probe imports torch: ~7 s
a probe on the H200 host, 12 probes a round with four arms: fewer arms, more rounds in one call's
time).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from plugin_startup import NAMED_ONLY, empty_plugin, host_preload, run, table, trees


def main(self_site: str, release: str, extra: str, rounds: str = "8", budget: str = "") -> int:
    preload = host_preload(Path(release), Path(extra))
    print(f"preload: {preload}")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sites = {"none": (), "empty": (empty_plugin(tmp / "empty-plugin"),),
                 "plugin": (Path(self_site),)}  # fmt: skip
        sites["first"] = sites["changed"] = sites["off"] = sites["plugin"]  # the same install
        if os.environ.get("COST_BASELINE"):  # bfirst: the same, its start memo empty each probe
            sites["baseline"] = sites["bfirst"] = (Path(os.environ["COST_BASELINE"]),)
        named = os.environ.get("COST_ARMS")
        arms = named.split(",") if named else [a for a in sites if a not in NAMED_ONLY]
        sites = {arm: sites[arm] for arm in arms}
        cases = trees(tmp, Path(release))
        samples = run(int(rounds), cases, sites, (Path(extra),), sys.executable, preload,
                      float(budget) if budget else None)  # fmt: skip
    return table(samples, cases)


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:6]))
