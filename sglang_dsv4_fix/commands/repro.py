"""``sglang-dsv4-fix repro``: prove (or disprove) the fix on the real kernel, on this GPU.

Builds the tree's own c_plan.cuh as original, barrier and no-init in a private build folder, for
the target the release's own loader uses (jitcache.arch_for) unless --arch, runs the real prefill
planner on GPU inputs for each shape and checks every plan (harness/oracle.py); ``--racecheck``
re-runs each variant under compute-sanitizer racecheck limited to kernel0; ``--compare-with``
runs each variant against another tree's same-named one on the same inputs, call for call. Exit 8
(REPRO_FAILED) if a fixed variant shows a bad plan, a hazard, a corrupted chunk or plans that
differ; 9 (ENVIRONMENT) without a GPU, nvcc or compute-sanitizer. torch and tvm-ffi are imported
only once this command runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.harness import shapes
from sglang_dsv4_fix.harness.variants import FIXED, NAMES, Name

RACECHECK_SHAPE = ("4x72+3x24", 128)
# uniform and ragged, B=96 and 1024, and a serving batch with a cached prefix; for each --ratios
BENCH_SHAPES = ("4x96", "4x72+3x24", "4x1024", "4x1023+3@1000")
LAUNCHES, REPLAYS = 100, 20  # kernel0 launches per CUDA graph, timed graph replays


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "repro", help="build the tree's kernel variants and hunt the race on this GPU"
    )
    p.add_argument(
        "--tree",
        action="append",
        metavar="PATH",
        help="SGLang tree (repeatable; default: the importable sglang)",
    )
    p.add_argument(
        "--variants",
        default=",".join(NAMES),
        help="comma-separated, from: original,barrier,no-init",
    )
    p.add_argument(
        "--shapes",
        default=",".join(shapes.DEFAULT_SHAPES),
        help="comma-separated batches, e.g. 4x96,4x72+3x24",
    )
    p.add_argument(
        "--ratios", default="4,128", help="compress ratios to run each shape with (4 and/or 128)"
    )
    p.add_argument(
        "--iters",
        type=int,
        default=1000,
        help="calls per shape and variant (default 1000; 0: racecheck/bench only)",
    )
    p.add_argument(
        "--streams",
        type=int,
        default=1,
        help="round-robin the calls over this many CUDA streams (default 1)",
    )
    p.add_argument(
        "--racecheck",
        action="store_true",
        help="also run each variant under compute-sanitizer racecheck",
    )
    p.add_argument(
        "--racecheck-calls", type=int, default=2, help="calls per racecheck run (default 2)"
    )
    p.add_argument(
        "--bench",
        action="store_true",
        help="also time kernel0 alone per variant (CUDA-graph replays)",
    )
    p.add_argument(
        "--arch",
        help="CUDA target for every tree, e.g. 9.0 or 9.0a (default: each release's own, as its "
        "JIT loader derives it for this GPU: 9.0 up to 0.5.15.post1, 9.0a from 0.5.16 on an H200)",
    )
    p.add_argument(
        "--compare-with",
        metavar="PATH",
        help="also run each variant against this tree's same-named variant on the same inputs "
        "and require the same plans, call for call (e.g. a fork's fix against its release's)",
    )
    p.add_argument(
        "--build-dir",
        metavar="DIR",
        help="keep the builds here (default: a temporary folder, removed)",
    )
    p.add_argument(
        "--jobs", type=int, default=0, help="parallel builds / racecheck runs (default: CPU count)"
    )
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of tables"
    )
    p.add_argument("--save", metavar="FILE", help="also write the JSON results to FILE")
    p.set_defaults(parser=p)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    names = _variants(args.variants)
    grid = shapes.grid(_split(args.shapes), tuple(_ints(args.ratios)))
    if min(args.racecheck_calls, args.streams) < 1 or args.iters < 0:
        raise FatalError("--iters must be >= 0, --streams and --racecheck-calls >= 1", Exit.USAGE)
    from sglang_dsv4_fix.harness import build, gpu, racecheck  # heavy only from here on
    from sglang_dsv4_fix.tree import find_tree

    trees = [find_tree(p) for p in (args.tree or [None])]
    against = find_tree(args.compare_with) if args.compare_with else None
    capability = gpu.device_capability()
    build.find_nvcc()
    sanitizer = racecheck.find_sanitizer() if args.racecheck else None
    build_dir = (
        Path(args.build_dir)
        if args.build_dir
        else Path(tempfile.mkdtemp(prefix="sglang-dsv4-fix-"))
    )
    try:
        with gpu.isolate_tvm_ffi_cache(build_dir):
            plan = _Plan(args, names, grid, trees, against, capability, build_dir, sanitizer)
            results = _run(plan)
    finally:
        if not args.build_dir:
            shutil.rmtree(build_dir, ignore_errors=True)
    return _finish(args, results)


@dataclass
class _Plan:
    args: argparse.Namespace
    names: tuple[Name, ...]
    grid: list[shapes.Shape]
    trees: list[Any]
    against: Any  # the --compare-with tree, or None
    capability: tuple[int, int]
    build_dir: Path
    sanitizer: Path | None


def _run(p: _Plan) -> dict[str, Any]:
    from sglang_dsv4_fix.harness import build, gpu, racecheck, runner

    built, archs, trees = _prepare(p)
    sos = build.build_all(built, archs, p.build_dir, jobs=p.args.jobs)
    out: dict[str, Any] = {
        "device": gpu.device_name(),
        "capability": ".".join(map(str, p.capability)),
        "builds": [_build_row(v, a, t) for v, a, t in zip(built, archs, trees, strict=True)],
        "plans": [],
        "racecheck": [],
        "latency": [],
        "same_plans": [],
    }
    mine = [i for i, t in enumerate(trees) if t is not p.against]  # the reference only compares
    if p.sanitizer is not None:
        spec, ratio = RACECHECK_SHAPE
        with ThreadPoolExecutor(max_workers=p.args.jobs or 4) as pool:
            jobs = [pool.submit(racecheck.run, p.sanitizer, sos[i], built[i].release, built[i].name,
                                spec, ratio, p.args.racecheck_calls, archs[i].target)
                    for i in mine]  # fmt: skip
            out["racecheck"] = [j.result() for j in jobs]
    modules = [gpu.load(so) for so in sos]
    try:
        _plans(p, built, archs, modules, mine, out)
    except runner.DeviceFault as fault:  # the CUDA context is lost: report it, run nothing more
        out["fault"] = _fault(fault, out, p, built, mine)
        print(f"  {out['fault']['release']} {out['fault']['variant']} {fault}", file=sys.stderr)
        return out
    out["same_plans"] = _compare(p, built, trees, modules)
    if p.args.bench:
        ratios = sorted({s.ratio for s in p.grid})
        out["latency"] = _bench([built[i] for i in mine], [modules[i] for i in mine], ratios)
    return out


def _plans(p: _Plan, built: list[Any], archs: list[Any], modules: list[Any], mine: list[int],
           out: dict[str, Any]) -> None:  # fmt: skip
    from sglang_dsv4_fix.harness import runner

    for i in mine if p.args.iters else []:
        out["running"] = built[i]
        for shape in p.grid:
            out["plans"].append(runner.run_shape(modules[i], shape, p.args.iters, built[i].release,
                                                 built[i].name, p.args.streams, archs[i].target))  # fmt: skip
            _progress(out["plans"][-1])
    out.pop("running", None)


def _fault(
    fault: Any, out: dict[str, Any], p: _Plan, built: list[Any], mine: list[int]
) -> dict[str, Any]:
    """What faulted, and which variants' runs it left undone (plans, comparisons, latency)."""
    v = out.pop("running")
    done = {(r.release, r.variant) for r in out["plans"]}
    undone = [
        built[i].label
        for i in mine
        if (built[i].release, built[i].name) not in done or built[i] is v
    ]
    return {"release": v.release, "variant": v.name, "shape": fault.shape, "error": fault.error,
            "submitted_calls": fault.submitted, "not_run": undone}  # fmt: skip


def _prepare(p: _Plan) -> tuple[list[Any], list[Any], list[Any]]:
    """Every variant of every tree (and of --compare-with), each with its tree's own target."""
    from sglang_dsv4_fix import jitcache
    from sglang_dsv4_fix.harness import variants

    built, archs, owners = [], [], []
    taken: set[str] = set()
    for tree in [*p.trees, *([p.against] if p.against is not None else [])]:
        label = _unique(variants.label(tree), taken)
        arch = (
            _arch(p.args.arch, p.capability)
            if p.args.arch
            else jitcache.arch_for(tree, *p.capability)
        )
        for v in variants.prepare(tree, p.names, p.build_dir, label):
            built.append(v)
            archs.append(arch)
            owners.append(tree)
    return built, archs, owners


def _unique(label: str, taken: set[str]) -> str:
    """Two trees of one release get ``0.5.16`` and ``0.5.16#2`` (labels name build folders)."""
    n, out = 1, label
    while out in taken:
        n += 1
        out = f"{label}#{n}"
    taken.add(out)
    return out


def _build_row(v: Any, arch: Any, tree: Any) -> dict[str, Any]:
    from sglang_dsv4_fix.fsops import sha256_file

    return {
        "release": v.release,
        "variant": v.name,
        "arch": arch.target,
        "flag": arch.flag,
        "tree": str(tree.root),
        "kernel_sha256": sha256_file(v.kernel),
    }


def _compare(p: _Plan, built: list[Any], trees: list[Any], modules: list[Any]) -> list[Any]:
    """--compare-with: each variant against the reference tree's same-named one, call for call."""
    from sglang_dsv4_fix.harness import runner

    if p.against is None:
        return []
    ref = {v.name: i for i, (v, t) in enumerate(zip(built, trees, strict=True)) if t is p.against}
    out = []
    for i, (v, tree) in enumerate(zip(built, trees, strict=True)):
        if tree is p.against:
            continue
        j = ref[v.name]
        for shape in p.grid:
            out.append(runner.compare_shape(modules[i], modules[j], shape, p.args.iters or 1,
                                            v.release, built[j].release, v.name))  # fmt: skip
            r = out[-1]
            print(f"  {r.release} vs {r.against} {r.variant} {r.shape}: same plans "
                  f"{r.same_plans}/{r.calls}", file=sys.stderr, flush=True)  # fmt: skip
    return out


def _bench(built: list[Any], modules: list[Any], ratios: list[int]) -> list[Any]:
    from sglang_dsv4_fix.harness import bench

    timings = []
    for ratio in ratios:
        for spec in BENCH_SHAPES:
            shape = shapes.parse(spec, ratio)
            for rnd in (1, 2):  # the same variant twice: a difference under that spread is noise
                for v, module in zip(built, modules, strict=True):
                    timings.append(
                        bench.time_kernel0(module, shape, LAUNCHES, REPLAYS, v.release, v.name, rnd)
                    )
    return timings


def _progress(r: Any) -> None:
    print(
        f"  {r.release} {r.variant} {r.shape}: {r.bad}/{r.calls} bad ({r.seconds:.1f} s)",
        file=sys.stderr,
        flush=True,
    )


def _finish(args: argparse.Namespace, results: dict[str, Any]) -> int:
    from sglang_dsv4_fix.harness import report

    plain = {k: [_plain(r) for r in v] if isinstance(v, list) else v for k, v in results.items()}
    if args.save:
        Path(args.save).write_text(json.dumps(plain, indent=1) + "\n")
    failed = _failures(results)
    if args.json:
        print(json.dumps({**plain, "failures": failed}, indent=1))
    else:
        for part, fmt in (
            ("latency", report.timings),
            ("racecheck", report.racechecks),
            ("plans", report.plans),
            ("same_plans", report.same_plans),
        ):
            if results[part]:
                print(fmt(results[part]) + "\n")
        print("\n".join(report.summary(results)))
        if results.get("fault"):
            print(report.fault(results["fault"]))
    for line in failed:
        print(f"sglang-dsv4-fix: FAILED: {line}", file=sys.stderr)
    return int(Exit.REPRO_FAILED) if failed else int(Exit.OK)


def _plain(r: Any) -> Any:
    return r.as_dict() if hasattr(r, "as_dict") else r


def _failures(results: dict[str, Any]) -> list[str]:
    fault = results.get("fault")
    bad = [f"{fault['release']}/{fault['variant']} {fault['shape']}: the GPU faulted ({fault['error']})"] if fault and fault["variant"] in FIXED else []  # fmt: skip
    bad += [f"not run after the fault: {label}" for label in (fault or {}).get("not_run", [])
            if label.rsplit("/", 1)[1] in FIXED]  # fmt: skip
    bad += [f"{r.release}/{r.variant} {r.shape}: {r.bad}/{r.calls} bad plans"
           for r in results["plans"] if r.variant in FIXED and r.bad]  # fmt: skip
    bad += [f"{r.release}/{r.variant} {r.shape}: its stray writes corrupted {r.corrupted_chunks} chunks"
            for r in results["plans"] if r.variant in FIXED and r.corrupted_chunks]  # fmt: skip
    bad += [f"{r.release}/{r.variant}: {r.hazards} racecheck hazards"
            for r in results["racecheck"] if r.variant in FIXED and r.hazards]  # fmt: skip
    bad += [f"{r.release}/{r.variant} {r.shape}: plans differ from {r.against}'s in "
            f"{r.calls - r.same_plans} of {r.calls} calls (first #{r.first_difference})"
            for r in results["same_plans"] if r.variant in FIXED and r.same_plans != r.calls]  # fmt: skip
    bad += [f"{r.release}/{r.variant} {r.shape}: stray writes corrupted {r.corrupted_chunks} chunks "
            f"while compared with {r.against}"
            for r in results["same_plans"] if r.variant in FIXED and r.corrupted_chunks]  # fmt: skip
    return bad


def _arch(text: str, capability: tuple[int, int]) -> Any:
    """--arch: an explicit target (``9.0`` builds sm_90, ``9.0a`` sm_90a) for this GPU only."""
    from sglang_dsv4_fix.jitcache import Arch, parse_capability

    try:
        major, minor = parse_capability(text)
    except ValueError as e:
        raise FatalError(f"--arch: {e}", Exit.USAGE) from None
    if (major, minor) != capability:
        device = ".".join(map(str, capability))
        raise FatalError(
            f"--arch {text} does not run on this GPU (capability {device})", Exit.USAGE
        )
    suffix = text.strip().lower()[-1] if text.strip().lower()[-1] in "af" else ""
    return Arch(major, minor, f"{major}.{minor}{suffix}")


def _variants(text: str) -> tuple[Name, ...]:
    names = _split(text)
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise FatalError(
            f"--variants: unknown {', '.join(unknown) or '(none)'}; choose from {','.join(NAMES)}",
            Exit.USAGE,
        )
    return cast("tuple[Name, ...]", tuple(dict.fromkeys(names)))


def _split(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _ints(text: str) -> list[int]:
    try:
        return [int(s) for s in _split(text)]
    except ValueError:
        raise FatalError(
            f"--ratios: {text!r} is not a comma-separated list of numbers", Exit.USAGE
        ) from None
