"""GPU side of the harness: the real kernel on a real GPU (run on the H200: see docs/evidence.md)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main


def _gpu_missing() -> str | None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("tvm_ffi") is None:
        return "needs torch and apache-tvm-ffi"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found)"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU visible to torch"


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_gpu_missing()), reason=str(_gpu_missing()))]


def test_fixed_variants_pass_and_the_original_races(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.16", tmp_path / "sp")
    argv = ["repro", "--tree", str(site), "--shapes", "4x1023+3,4x255+3", "--ratios", "128"]
    code = main(
        [*argv, "--iters", "2000", "--racecheck", "--json", "--build-dir", str(tmp_path / "b")]
    )
    assert code == Exit.OK
    out = json.loads(capsys.readouterr().out)
    assert out["failures"] == []
    fixed = [r for r in out["plans"] if r["variant"] != "original"]
    assert fixed and all(r["bad"] == 0 and r["max_ragged_id"] == r["rows"] - 1 for r in fixed)
    hazards = {r["variant"]: r["hazards"] for r in out["racecheck"]}
    assert hazards["barrier"] == hazards["no-init"] == 0
    assert hazards["original"] > 0  # deterministic under racecheck (FACTS.md, docs/evidence.md)


def test_bench_times_kernel0_per_variant(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.16", tmp_path / "sp")
    argv = ["repro", "--tree", str(site), "--shapes", "4x96", "--ratios", "128", "--iters", "10"]
    assert main([*argv, "--bench", "--json"]) == Exit.OK
    timings = json.loads(capsys.readouterr().out)["latency"]
    assert {t["variant"] for t in timings} == {"original", "barrier", "no-init"}
    assert all(0 < t["p10_us"] <= t["median_us"] <= t["p90_us"] for t in timings)
