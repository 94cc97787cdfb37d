"""What the plugin adds to a process whose tree names its release only by a git tag.

Usage: python benchmarks/git_tag_tree.py [--rounds 8]
Run from a temporary folder, like benchmarks/plugin_startup.py, whose probe, install and cached
interpreter it reuses. The tree: the real SGLang 0.5.16 (racy, as released) laid out as a source
checkout that was never built or pip-installed (``python/sglang``, no dist-info, no
``sglang/_version.py``) in a fresh git repository, HEAD tagged ``v0.5.16`` (tests/plugin_env.py
``never_built_checkout``). The plugin reads the release with ``git tag --points-at HEAD``, and
keeps it in the start memo on the git paths that decide it (docs/plugin.md). Three arms per round, in rotating order: ``none``,
``plugin`` (its memo folder kept between probes: every probe after the first takes the entry) and
``first`` (an empty memo each probe: judged, git run, the entry stored), as in plugin_startup.
Asserts per probe that ``none`` loads no plugin and the others do; at the end, that the start line
named release 0.5.16 and that the ``plugin`` arm's memo holds the one entry.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_startup import PROBE, RELEASE, SERVER, measure


def main() -> int:
    from plugin_env import install_self, never_built_checkout, run_python, server_site

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        os.chdir(tmp)
        sites = {"none": (), "plugin": (install_self(tmp / "self"),)}
        site, cache = never_built_checkout(RELEASE, tmp / "git", f"v{RELEASE}"), tmp / "empty"
        cache.mkdir()
        samples: dict[str, list[tuple[float, float, float, float, int]]] = {}
        sites["first"] = sites["plugin"]
        arms = tuple(sites)
        for i in range(args.rounds):
            for arm in arms[i % 3 :] + arms[: i % 3]:
                ms = measure(arm, cache, *sites[arm], site, server_site())
                samples.setdefault(arm, []).append(ms)
        env = {"TVM_FFI_CACHE_DIR": str(cache), "XDG_CACHE_HOME": str(tmp / "empty-memo")}
        done = run_python(PROBE.replace("PRELOAD", SERVER), *sites["plugin"], site,
                          server_site(), env=env)  # fmt: skip
        memo = cache.with_name(f"{cache.name}-memo") / "sglang-dsv4-fix" / "start"
        entries = list(memo.glob("*.json")) if memo.is_dir() else []
    assert f"release={RELEASE} " in done.stderr, done.stderr[-2000:]
    assert len(entries) == 1, entries
    print(f"SGLang {RELEASE} as a tagged source checkout, load_plugins() + configure_logger(), "
          f"median of {args.rounds} (ms)")  # fmt: skip
    print(f"{'arm':8} {'window':>7} {'added':>7} {'own':>7} {'logger':>7} {'modules':>8}")
    none = statistics.median(x[0] for x in samples["none"])
    for arm in arms:
        xs = samples[arm]
        window, own, logger = (statistics.median(x[i] for x in xs) for i in (0, 2, 3))
        mods = sorted({x[4] for x in xs})
        print(f"{arm:8} {window:7.2f} {window - none:7.2f} {own:7.2f} {logger:7.2f} "
              f"{mods[0]:>4}-{mods[-1]}")  # fmt: skip
    print("release read from the git tag; plugin: the memo's entry taken after the first probe")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
