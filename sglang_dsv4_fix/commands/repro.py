"""``sglang-dsv4-fix repro``: prove (or disprove) the fix on the real kernel, on this GPU.

Builds the tree's own c_plan.cuh as original, barrier and no-init in a private build folder, runs
the real prefill planner on GPU inputs for each shape and checks every plan (harness/oracle.py);
``--racecheck`` re-runs each variant under compute-sanitizer racecheck limited to kernel0. Exit 8
(REPRO_FAILED) if a fixed variant shows a bad plan or a hazard; 9 (ENVIRONMENT) without a GPU,
nvcc or compute-sanitizer. torch and tvm-ffi are imported only once this command runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.harness import shapes
from sglang_dsv4_fix.harness.variants import FIXED, NAMES, Name

RACECHECK_SHAPE = ("4x72+3x24", 128)
BENCH_SHAPES = ("4x96", "4x72+3x24", "4x1024", "4x512+3x512")  # uniform and ragged, B=96 and 1024
LAUNCHES, REPLAYS = 100, 30  # kernel0 launches per CUDA graph, timed graph replays


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
        "--iters", type=int, default=1000, help="calls per shape and variant (default 1000)"
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
        "--arch", help="CUDA target, e.g. 9.0a or 9.0 (default: the GPU's, with 'a' from sm_90 on)"
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
    if min(args.iters, args.racecheck_calls, args.streams) < 1:
        raise FatalError("--iters, --streams and --racecheck-calls must be >= 1", Exit.USAGE)
    from sglang_dsv4_fix.harness import build, gpu, racecheck  # heavy only from here on
    from sglang_dsv4_fix.tree import find_tree

    trees = [find_tree(p) for p in (args.tree or [None])]
    arch = gpu.device_arch() if args.arch is None else _arch(args.arch, gpu.device_arch())
    build.find_nvcc()
    sanitizer = racecheck.find_sanitizer() if args.racecheck else None
    build_dir = (
        Path(args.build_dir)
        if args.build_dir
        else Path(tempfile.mkdtemp(prefix="sglang-dsv4-fix-"))
    )
    try:
        with gpu.isolate_tvm_ffi_cache(build_dir):
            results = _run(args, names, grid, trees, arch, build_dir, sanitizer)
    finally:
        if not args.build_dir:
            shutil.rmtree(build_dir, ignore_errors=True)
    return _finish(args, results)


def _run(args: argparse.Namespace, names: tuple[Name, ...], grid: list[shapes.Shape], trees: list[Any],
         arch: Any, build_dir: Path, sanitizer: Path | None) -> dict[str, Any]:  # fmt: skip
    from sglang_dsv4_fix.harness import build, gpu, racecheck, runner, variants

    built = [v for t in trees for v in variants.prepare(t, names, build_dir)]
    sos = build.build_all(built, arch, build_dir, jobs=args.jobs)
    out: dict[str, Any] = {
        "device": gpu.device_name(),
        "arch": arch.name,
        "plans": [],
        "racecheck": [],
        "latency": [],
    }
    if sanitizer is not None:
        spec, ratio = RACECHECK_SHAPE
        with ThreadPoolExecutor(max_workers=args.jobs or 4) as pool:
            jobs = [pool.submit(racecheck.run, sanitizer, so, v.release, v.name, spec, ratio, args.racecheck_calls)
                    for v, so in zip(built, sos, strict=True)]  # fmt: skip
            out["racecheck"] = [j.result() for j in jobs]
    modules = [gpu.load(so) for so in sos]
    for v, module in zip(built, modules, strict=True):
        for shape in grid:
            out["plans"].append(
                runner.run_shape(module, shape, args.iters, v.release, v.name, args.streams)
            )
            _progress(out["plans"][-1])
    if args.bench:
        out["latency"] = _bench(built, modules)
    return out


def _bench(built: list[Any], modules: list[Any]) -> list[Any]:
    from sglang_dsv4_fix.harness import bench

    timings = []
    for spec in BENCH_SHAPES:
        shape = shapes.parse(spec, 128)
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

    plain = {k: [r.as_dict() for r in v] if isinstance(v, list) else v for k, v in results.items()}
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
        ):
            if results[part]:
                print(fmt(results[part]) + "\n")
        print("\n".join(report.summary(results["plans"], results["racecheck"])))
    for line in failed:
        print(f"sglang-dsv4-fix: FAILED: {line}", file=sys.stderr)
    return int(Exit.REPRO_FAILED) if failed else int(Exit.OK)


def _failures(results: dict[str, Any]) -> list[str]:
    bad = [f"{r.release}/{r.variant} {r.shape}: {r.bad}/{r.calls} bad plans"
           for r in results["plans"] if r.variant in FIXED and r.bad]  # fmt: skip
    bad += [f"{r.release}/{r.variant}: {r.hazards} racecheck hazards"
            for r in results["racecheck"] if r.variant in FIXED and r.hazards]  # fmt: skip
    return bad


def _arch(text: str, device: Any) -> Any:
    from sglang_dsv4_fix.harness.build import Arch

    # SGLang up to 0.5.15.post1 builds for "9.0" (sm_90), from 0.5.16 for "9.0a" (FACTS.md).
    if text.rstrip("a") != device.name.rstrip("a"):
        raise FatalError(f"--arch {text} does not run on this GPU ({device.name})", Exit.USAGE)
    return Arch(text)


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
