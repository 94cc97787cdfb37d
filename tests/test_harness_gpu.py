"""GPU side of the harness: the real kernel on a real GPU (run on the H200: see docs/evidence.md).

``python -m pytest -m gpu`` on a machine with an NVIDIA GPU, torch, apache-tvm-ffi, nvcc and
compute-sanitizer; the release wheels come from the wheel cache (tests/trees.py). Skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import find_tree


def _gpu_missing() -> str | None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("tvm_ffi") is None:
        return "needs torch and apache-tvm-ffi"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found)"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU visible to torch"


MISSING = _gpu_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]


def _repro(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["repro", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_fixed_variants_pass_and_the_original_races(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.16", tmp_path / "sp")
    argv = ["--tree", str(site), "--shapes", "4x1023+3,4x255+3", "--ratios", "128"]
    code, out = _repro([*argv, "--iters", "2000", "--racecheck"], capsys)
    assert code == Exit.OK
    assert out["failures"] == []
    assert {(b["variant"], b["arch"]) for b in out["builds"]} == {
        ("original", "9.0a"),
        ("barrier", "9.0a"),
        ("no-init", "9.0a"),
    }
    fixed = [r for r in out["plans"] if r["variant"] != "original"]
    assert len(fixed) == 4
    assert all(r["bad"] == 0 and r["max_ragged_id"] == r["rows"] - 1 for r in fixed)
    assert all(r["corrupted_chunks"] == r["tainted_calls"] == 0 for r in fixed)
    hazards = {r["variant"]: r["hazards"] for r in out["racecheck"]}
    assert hazards["barrier"] == hazards["no-init"] == 0
    assert hazards["original"] > 0  # deterministic under racecheck (FACTS.md, docs/evidence.md)


def test_a_pre_016_release_runs_as_its_loader_builds_it(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.12", tmp_path / "sp")
    argv = ["--tree", str(site), "--variants", "no-init", "--shapes", "4x1023+3,4x72+3x24@1000"]
    code, out = _repro([*argv, "--iters", "300"], capsys)
    assert code == Exit.OK
    assert [(b["arch"], b["flag"]) for b in out["builds"]] == [("9.0", "-DSGL_CUDA_ARCH=900")]
    assert {r["arch"] for r in out["plans"]} == {"9.0"} and len(out["plans"]) == 4
    assert all(r["bad"] == 0 and r["calls"] == 300 for r in out["plans"])


def test_a_forks_fix_plans_like_its_releases_fix(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown-base rewrite (0.5.16 with local edits) against what apply writes on 0.5.16."""
    fork, release = (tree_factory.installed("0.5.16", tmp_path / n) for n in ("fork", "rel"))
    kernel = find_tree(fork).kernel_path
    assert kernel is not None
    kernel.write_text("// local fork\n" + kernel.read_text().replace("\n\n", "\n\n\n", 1))
    assert main(["apply", "--tree", str(fork)]) == 0
    assert main(["apply", "--tree", str(release)]) == 0
    assert "base is unknown" in capsys.readouterr().out
    shapes = "4x1023+3,1x256+2x256+3x256+4x256@64"
    argv = ["--tree", str(fork), "--variants", "no-init", "--compare-with", str(release)]
    code, out = _repro([*argv, "--shapes", shapes, "--iters", "300"], capsys)
    assert code == Exit.OK and out["failures"] == []
    assert [b["release"] for b in out["builds"]] == ["0.5.16+unknown-base", "0.5.16"]
    assert out["builds"][0]["kernel_sha256"] != out["builds"][1]["kernel_sha256"]
    same = out["same_plans"]
    assert len(same) == 4 and all(r["against"] == "0.5.16" for r in same)
    assert all(r["same_plans"] == r["calls"] == 300 and r["first_difference"] is None for r in same)
    assert all(r["bad"] == 0 for r in out["plans"])


class _OtherRatio:
    """The same real module, called with the other compress ratio: its plans must differ."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def plan_prefill(self, *args: Any) -> Any:
        changed = list(args)
        changed[7] = 4 if changed[7] == 128 else 128  # compress_ratio (runner.Inputs.args)
        return self.module.plan_prefill(*changed)


def test_compare_tells_different_plans_apart(tree_factory, tmp_path: Path) -> None:
    from sglang_dsv4_fix import jitcache
    from sglang_dsv4_fix.harness import build, gpu, runner, shapes, variants

    tree = find_tree(tree_factory.installed("0.5.16", tmp_path / "sp"))
    (v,) = variants.prepare(tree, ("no-init",), tmp_path / "b")
    with gpu.isolate_tvm_ffi_cache(tmp_path / "b"):
        (so,) = build.build_all(
            [v], [jitcache.arch_for(tree, *gpu.device_capability())], tmp_path / "b"
        )
        module = gpu.load(so)
        shape = shapes.parse("4x72+3x24@64", 128)
        same = runner.compare_shape(module, module, shape, 20, "a", "b", "no-init")
        other = runner.compare_shape(module, _OtherRatio(module), shape, 20, "a", "b", "no-init")
    assert (same.same_plans, same.first_difference, same.corrupted_chunks) == (20, None, 0)
    assert (other.same_plans, other.same_bytes, other.first_difference) == (0, 0, 0)


def test_bench_times_kernel0_per_variant(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.16", tmp_path / "sp")
    argv = ["--tree", str(site), "--shapes", "4x96", "--ratios", "4,128", "--iters", "10"]
    code, out = _repro([*argv, "--bench"], capsys)
    assert code == Exit.OK
    timings = out["latency"]
    assert {t["variant"] for t in timings} == {"original", "barrier", "no-init"}
    assert {t["shape"].split()[0] for t in timings} == {"c4", "c128"}
    assert all(0 < t["p10_us"] <= t["median_us"] <= t["p90_us"] for t in timings)


def test_same_tells_equal_plans_from_reordered_and_different_ones() -> None:
    import torch

    from sglang_dsv4_fix.harness import oracle

    c = torch.arange(2 * 3 * 16, dtype=torch.uint8).reshape(2, 3, 16)
    w = torch.arange(2 * 3 * 8, dtype=torch.uint8).reshape(2, 3, 8)
    swapped_w = w.clone()
    swapped_w[1] = w[1][[1, 0, 2]]  # call 1: the same entries in another slot order
    changed_c = c.clone()
    changed_c[0, 2, 5] += 1  # call 0: one compress-plan byte differs
    planned, exact = oracle.same(c, w, changed_c, swapped_w)
    assert planned.tolist() == [False, True]
    assert exact.tolist() == [False, False]
    planned, exact = oracle.same(c, w, c.clone(), w.clone())
    assert planned.tolist() == exact.tolist() == [True, True]


def test_a_corrupted_chunk_counts_up_to_its_first_bad_call() -> None:
    import torch

    from sglang_dsv4_fix.harness import oracle, runner, shapes

    shape = shapes.parse("4x1023+3", 128)

    def verdicts(bad_at: list[int]) -> oracle.Verdicts:
        bad = torch.zeros(6, dtype=torch.bool)
        bad[bad_at] = True
        ids = torch.where(bad, shape.signature, shape.rows - 1)
        return oracle.Verdicts(bad, bad.clone(), ids, bad.clone(), ~bad & False, bad.clone())

    acc = runner._Accumulator(shape)
    acc.add(verdicts([4]), 0, [0.0] * 6, intact=True)  # an intact chunk: every call counts
    acc.add(verdicts([2, 3, 5]), 6, [0.0] * 6, intact=False)  # calls 9..11 ran on overwritten state
    acc.add(verdicts([]), 12, [0.0] * 6, intact=False)  # corrupted, no bad call: all six count
    r = acc.result("0.5.16", "original", 18, True, 1.0, "9.0a")
    assert (r.bad, r.out_of_range, r.signature_hits) == (2, 2, 2)
    assert (r.tainted_calls, r.corrupted_chunks, r.first_bad_call) == (3, 2, 4)
    assert (r.calls, r.max_ragged_id, r.arch) == (18, shape.signature, "9.0a")
