"""Mutation testing of the safety-critical modules with mutmut, in bounded time on a small machine.

Run from anywhere, with the project's virtual environment (mutmut installed in it):

    .venv/bin/pip install mutmut==3.8.1
    .venv/bin/python tools/mutate.py [MODULE ...] [--jobs 2] [--budget 1500] [--out DIR]

For each module it exports the committed tree (``git archive HEAD``) into a scratch folder
outside the repository, lays the patches where an installed wheel has them
(``sglang_dsv4_fix/patches``), writes a ``[mutmut]`` section naming that one module and the fast
test files that cover it, and runs ``mutmut run`` there. mutmut runs, per mutant, only the tests
that called the mutated function. Tests that reach the code through a subprocess (``python -m
sglang_dsv4_fix``, the plugin under SGLang's loader) see the unmutated install, so the selection
below lists in-process tests. Prints one line per module and writes ``DIR/<module>.json`` with
every mutant's status and ``DIR/<module>.diffs`` with each survivor's diff.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Three kernels stand for all thirteen releases here: 0.5.12 (its own warp helpers), 0.5.16
# (warp::reduce_*, pre-refactor) and 0.5.18 (namespace sglang, upstream no-init); the full suite
# runs every release.
RELEASES_K = "not test_each_precondition_clause_is_needed or 0.5.12 or 0.5.16 or 0.5.18"


@dataclass(frozen=True)
class Target:
    tests: tuple[str, ...]  # fast, in-process test files that exercise the module
    select: str = ""  # pytest -k expression, "" for all
    markers: str = ""  # pytest -m expression, "" for all
    functions: tuple[str, ...] = ("*",)  # mutmut name patterns (module.x_function*)


FILE_TESTS = (
    "tests/test_fsops.py",
    "tests/test_transaction.py",
    "tests/test_provenance.py",
    "tests/test_durability.py",
    "tests/test_bad_input.py",
    "tests/test_hostile_files.py",
)
MODULES: dict[str, Target] = {
    # the safety verdict: the five preconditions, the variant decision and what they read
    "kernel": Target(
        ("tests/test_kernel.py",),
        RELEASES_K,
        functions=tuple(
            f"sglang_dsv4_fix.kernel.{f}__mutmut_*"
            for f in (
                "x__single_block_launch",
                "x__warp_count",
                "x__every_warp_writes",
                "x__barrier_before_read",
                "x__warp0_reads_all",
                "x__is_warp0_guard",
                "x_preconditions",
                "x__launches",
                "x__variant",
                "x__first_read",
                "x_classify",
                "xǁKernel0ǁ*",
            )
        ),
    ),
    "rewrite": Target(("tests/test_kernel.py",), RELEASES_K),
    # the one judgement of a tree, as verify / status / apply --check render it: every field of
    # it for each tree state (test_cli.py and the fork property test reach it too, at ~30 s a
    # mutant on this machine: too slow to include)
    "verdict": Target(("tests/test_verdict.py",)),
    # the hostile-file reads (fsops: FIFOs, links, oversized files) and the durable write
    # primitives (fswrite), through the in-process tests that drive them hardest: the
    # transaction's and the record's (real failed writes, hostile files), durability, bad input
    "fsops": Target(FILE_TESTS),
    "fswrite": Target(FILE_TESTS),
    # the record's validation, in-process (test_provenance.py), and its durable writes; the CLI
    # tests of hostile records run in a subprocess, out of mutmut's reach
    "provenance": Target(("tests/test_provenance.py", "tests/test_durability.py")),
    # apply/revert's transaction in-process: each step's outcome on disk, recovery, the refusals
    # and real failed writes (test_transaction.py, ~7 s), and through main() (durability, bad
    # input: ~12 s); the CLI, kill and folder-swap tests run it in subprocesses, out of reach
    "transaction": Target(
        ("tests/test_transaction.py", "tests/test_durability.py", "tests/test_bad_input.py")
    ),
    # the plugin's judging (its status is the verdict; the start line and record say it); the
    # hooks and I/O run only under SGLang's loader (subprocess tests: test_plugin.py,
    # test_plugin_jit.py), out of mutmut's reach
    "plugin": Target(
        ("tests/test_plugin_judging.py",),
        functions=tuple(
            f"sglang_dsv4_fix.plugin.{f}__mutmut_*"
            for f in (
                "x_inspect_tree",
                "x__preconditions",
                "x__patched_by",
                "x_start_line",
                "x__where",
                "x_refuse_line",
            )
        ),
    ),
    # the report record of a start (action, fields); the file write runs in subprocess tests
    "events": Target(
        ("tests/test_plugin_judging.py",),
        functions=tuple(
            f"sglang_dsv4_fix.events.{f}__mutmut_*" for f in ("x_action", "x_start_record")
        ),
    ),
    # the judging of a loaded build (what it was built from, in the verdict's words); the
    # /proc/self/maps read runs only in a process that loads the planner (test_plugin_jit.py)
    "jitload": Target(
        ("tests/test_plugin_judging.py",),
        functions=tuple(
            f"sglang_dsv4_fix.jitload.{f}__mutmut_*"
            for f in (
                "x_built_from",
                "x__from_note",
                "x__from_cache_model",
                "x_origin_variant",
                "x_build_verdict",
            )
        ),
    ),
    # the cache's names and each release's source hash; the value types under every verdict
    "jitnames": Target(
        ("tests/test_jitcache.py", "tests/test_clear_cache.py", "tests/test_verdict.py"),
        markers="not slow",
    ),
    "value": Target(
        (
            "tests/test_value.py",
            "tests/test_jitcache.py",
            "tests/test_clear_cache.py",
            "tests/test_verdict.py",
        ),
        markers="not slow",
    ),
}


def export(dest: Path) -> None:
    """The committed tree at HEAD, as files under ``dest`` (nothing of the working tree)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    shutil.copytree(dest / "patches", dest / "sglang_dsv4_fix" / "patches")


def configure(dest: Path, module: str, target: Target) -> None:
    lines = [
        "[mutmut]",
        "source_paths = sglang_dsv4_fix",
        f"only_mutate = sglang_dsv4_fix/{module}.py",
        "pytest_add_cli_args_test_selection =",
        *(f"    {t}" for t in target.tests),
        *(["    -k", f"    {target.select}"] if target.select else []),
        *(["    -m", f"    {target.markers}"] if target.markers else []),
        "pytest_add_cli_args =",
        "    -p",
        "    no:cacheprovider",
        "    -q",
        "    -x",  # a mutant is killed by its first failing test: stop there
        "use_git_change_detection = false",
        "",
    ]
    (dest / "setup.cfg").write_text("\n".join(lines))


def mutmut(dest: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=dest,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def statuses(dest: Path) -> dict[str, str]:
    """mutant name -> status, from ``mutmut results --all true`` ("name: status" lines)."""
    out = mutmut(dest, "results", "--all", "true", timeout=600).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            found[name] = status
    return found


def run_module(
    module: str, scratch: Path, out: Path, jobs: int, budget: float, only: list[str]
) -> dict[str, int]:
    dest = scratch / module
    export(dest)
    target = MODULES[module]
    configure(dest, module, target)
    start = time.monotonic()
    try:
        names = only or ([] if target.functions == ("*",) else list(target.functions))
        run = mutmut(dest, "run", "--max-children", str(jobs), *names, timeout=budget)
        tail = run.stdout[-2000:] + run.stderr[-2000:]
    except subprocess.TimeoutExpired:
        tail = f"stopped after the {budget:.0f} s budget"
    seconds = time.monotonic() - start
    found = {n: st for n, st in statuses(dest).items() if st != "not checked"}
    counts: dict[str, int] = {}
    for status in found.values():
        counts[status] = counts.get(status, 0) + 1
    survivors = sorted(n for n, s in found.items() if s != "killed")
    diffs = [mutmut(dest, "show", n, timeout=120).stdout for n in survivors]
    (out / f"{module}.json").write_text(
        json.dumps(
            {
                "module": module,
                "tests": target.tests,
                "select": target.select,
                "markers": target.markers,
                "functions": target.functions,
                "seconds": round(seconds),
                "counts": counts,
                "mutants": found,
                "log_tail": tail,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    (out / f"{module}.diffs").write_text("\n".join(diffs))
    return {**counts, "seconds": round(seconds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", default=list(MODULES), choices=list(MODULES))
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--budget", type=float, default=1500, help="seconds per module at most")
    parser.add_argument("--out", type=Path, default=Path("mutation-results"))
    parser.add_argument(
        "--only", nargs="+", default=[], metavar="NAME", help="re-run just these mutants (patterns)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sglang-dsv4-fix-mutate-") as scratch:
        for module in args.modules:
            counts = run_module(module, Path(scratch), args.out, args.jobs, args.budget, args.only)
            print(module, json.dumps(counts, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
