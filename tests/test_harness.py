"""CPU side of the GPU harness: shapes, variants from real wheels, racecheck parsing, CLI errors."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.harness import racecheck, shapes, variants
from sglang_dsv4_fix.kernel import classify
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import find_tree

# As compute-sanitizer 2025.x printed it on the H200 for 0.5.16's original kernel0 (abridged).
RACECHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at plan_compress_prefill_kernel0(host::compress::Prefill0Params)+0x250
=========     and Write access at plan_compress_prefill_kernel0(host::compress::Prefill0Params)+0x3a0 [124 hazards]
=========
WORKER OK bad=0/2
========= RACECHECK SUMMARY: 4 hazards displayed (4 errors, 0 warnings)
"""


def test_shape_parse_counts_rows_and_signature() -> None:
    s = shapes.parse("4x72+3x24", 128)
    assert (s.batch, s.rows, s.signature, s.uniform) == (96, 360, 383, False)
    assert s.name == "c128 [4x72+3x24]"
    assert shapes.parse("4x1023+3", 4).signature == 4095  # FACTS.md: max ragged_id 4095 on 0.5.16


def test_shape_parse_takes_a_cached_prefix() -> None:
    s = shapes.parse("4x72+3x24@63", 4)
    assert (s.spec, s.prefix, s.text, s.name) == (
        "4x72+3x24",
        63,
        "4x72+3x24@63",
        "c4 [4x72+3x24@63]",
    )
    assert s.seq_lens[:1] + s.seq_lens[-1:] == (67, 66) and s.rows == 360
    assert shapes.parse(s.text, 4) == s
    with pytest.raises(
        FatalError, match=r"bad shape '4x2@x': write it like 4x72\+3x24 or 4x72\+3x24@63"
    ):
        shapes.parse("4x2@x", 4)


def test_shape_parse_rejects_what_kernel0_cannot_take() -> None:
    with pytest.raises(FatalError, match=r"bad shape '4x1025': batch 1025 > 1024") as e:
        shapes.parse("4x1025", 128)
    assert e.value.code == Exit.USAGE
    with pytest.raises(FatalError, match=r"write it like 4x72\+3x24"):
        shapes.parse("4*72", 128)
    with pytest.raises(FatalError, match="bad compress ratio 8: 4 or 128"):
        shapes.parse("4x2", 8)


def test_default_grid_is_the_issue_list_for_c4_and_c128() -> None:
    grid = shapes.grid(shapes.DEFAULT_SHAPES, shapes.DEFAULT_RATIOS)
    assert len(grid) == 2 * len(shapes.DEFAULT_SHAPES) == 2 * (16 + 14)
    specs = {s.spec for s in grid}
    assert {"4x96", "4x72+3x24", "3x104+2x24", "4x1023+3", "4x31+3", "4x65+3"} <= specs
    # serving-like: the largest batch (uniform, and 1-4 tokens a row), cached prefixes, c4 and c128
    assert {s.batch for s in grid if s.spec in ("4x1024", "1x256+2x256+3x256+4x256")} == {1024}
    prefixed = {(s.ratio, s.prefix, s.spec) for s in grid if s.prefix}
    assert {p for _, p, _ in prefixed} == {1, 63, 64, 1000}
    assert len(prefixed) == 2 * 4 * 3 and (4, 1000, "1x256+2x256+3x256+4x256") in prefixed
    # With ring 128 the write plans of kernel0 and the CPU loop coincide, so the oracle compares them.
    assert all(s.cpu_path_equivalent for s in grid)
    assert (shapes.parse("4x2", 4).mtp_pad, shapes.parse("4x2", 128).mtp_pad) == (4, 0)


@pytest.mark.parametrize("release", ["0.5.12", "0.5.16"])
def test_prepare_writes_three_variants_and_leaves_the_tree_alone(
    release: str, tree_factory, tmp_path: Path
) -> None:
    tree = find_tree(tree_factory.installed(release, tmp_path / "sp"))
    assert tree.kernel_path is not None
    before = hashlib.sha256(tree.kernel_path.read_bytes()).hexdigest()
    built = variants.prepare(tree, variants.NAMES, tmp_path / "build")
    assert [classify(v.kernel.read_text()).variant for v in built] == [
        "racy-init",
        "barrier",
        "no-init",
    ]
    assert [v.label for v in built] == [
        f"{release}/original",
        f"{release}/barrier",
        f"{release}/no-init",
    ]
    assert all(v.kernel.is_relative_to(tmp_path / "build") for v in built)
    assert all(v.include == tree.kernel_root / "include" for v in built)
    assert hashlib.sha256(tree.kernel_path.read_bytes()).hexdigest() == before


def test_a_fork_after_apply_is_labelled_and_builds_what_apply_wrote(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.16", tmp_path / "sp")
    tree = find_tree(site)
    assert tree.kernel_path is not None
    text = tree.kernel_path.read_text()
    tree.kernel_path.write_text("// local fork\n" + text.replace("\n\n", "\n\n\n", 1))
    assert main(["apply", "--tree", str(site)]) == 0
    assert "base is unknown" in capsys.readouterr().out
    assert variants.label(tree) == "0.5.16+unknown-base"
    built = variants.prepare(tree, variants.NAMES, tmp_path / "build")
    assert [v.label for v in built][2] == "0.5.16+unknown-base/no-init"
    assert built[2].kernel.read_bytes() == tree.kernel_path.read_bytes()  # the file apply wrote
    assert built[0].kernel.read_text().startswith("// local fork\n")  # from apply's backup
    assert variants.label(find_tree(tree_factory.installed("0.5.16", tmp_path / "r"))) == "0.5.16"


def test_prepare_on_a_fixed_release_builds_only_what_it_has(tree_factory, tmp_path: Path) -> None:
    tree = find_tree(tree_factory.installed("0.5.18", tmp_path / "sp"))
    with pytest.raises(FatalError) as e:
        variants.prepare(tree, variants.NAMES, tmp_path / "build")
    assert e.value.code == Exit.NOT_APPLICABLE
    assert "the kernel is no-init and no racy original is at hand" in str(e.value)
    assert "ask for --variants no-init" in str(e.value)
    (only,) = variants.prepare(tree, ("no-init",), tmp_path / "build")
    assert only.kernel.read_bytes() == tree.kernel_path.read_bytes()


def test_racecheck_parse_counts_hazards_and_kinds() -> None:
    assert racecheck.parse(RACECHECK_OUTPUT) == (4, 4, 0, {"Write/Write race": 1})
    clean = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert racecheck.parse(clean) == (0, 0, 0, {})
    legacy = "Potential WAW hazard detected at __shared__ 0x8 in block (0,0,0)\nRACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    assert racecheck.parse(legacy) == (1, 1, 0, {"WAW hazard at __shared__": 1})
    with pytest.raises(ValueError, match="no RACECHECK SUMMARY"):
        racecheck.parse("========= Error: No attachable process found\n")


def test_racecheck_command_is_limited_to_kernel0(tmp_path: Path) -> None:
    cmd = racecheck.command(
        Path("/cuda/bin/compute-sanitizer"), tmp_path / "m.so", "4x72+3x24", 128, 2
    )
    assert cmd[:5] == ["/cuda/bin/compute-sanitizer", "--tool", "racecheck", "--kernel-name",
                       "kns=plan_compress_prefill_kernel0"]  # fmt: skip
    assert cmd[5:8] == [sys.executable, "-m", "sglang_dsv4_fix.harness.worker"]


def test_repro_rejects_unknown_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--variants", "original,fast"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert (
        err
        == "sglang-dsv4-fix: error: --variants: unknown fast; choose from original,barrier,no-init\n"
    )


def test_repro_rejects_negative_iters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--iters", "-1"]) == Exit.USAGE
    assert capsys.readouterr().err == (
        "sglang-dsv4-fix: error: --iters must be >= 0, --streams and --racecheck-calls >= 1\n"
    )


def test_repro_arch_is_an_explicit_target_for_this_gpu_only() -> None:
    from sglang_dsv4_fix.commands import repro

    assert repro._arch("9.0", (9, 0)).target == "9.0"
    assert repro._arch("sm_90a", (9, 0)) == repro._arch("9.0a", (9, 0))
    assert repro._arch("9.0a", (9, 0)).flag == "-DSGL_CUDA_ARCH=900"
    with pytest.raises(
        FatalError, match=r"^--arch 10\.0a does not run on this GPU \(capability 9\.0\)$"
    ):
        repro._arch("10.0a", (9, 0))
    with pytest.raises(FatalError, match=r"^--arch: not a CUDA architecture: 'hopper'"):
        repro._arch("hopper", (9, 0))
    assert repro._unique("0.5.16", taken := {"0.5.16"}) == "0.5.16#2" and "0.5.16#2" in taken


def test_repro_rejects_bad_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--shapes", "4x96,oops"]) == Exit.USAGE
    assert "bad shape 'oops'" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_repro_without_torch_is_an_environment_error(
    tree_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["repro", "--tree", str(site)]) == Exit.ENVIRONMENT
    err = capsys.readouterr().err
    assert err == (
        "sglang-dsv4-fix: error: torch is not importable (No module named 'torch'); the harness needs it\n"
    )


def test_repro_without_nvcc_is_an_environment_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sglang_dsv4_fix.harness import build

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setattr(build, "_STANDARD_HOMES", (tmp_path / "none",))
    with pytest.raises(FatalError, match=r"^nvcc not found \(set CUDA_HOME") as e:
        build.find_nvcc()
    assert e.value.code == Exit.ENVIRONMENT


def test_command_modules_import_no_torch_or_tvm_ffi() -> None:
    """verify/status/repro --help must stay light: the heavy imports wait for a GPU run."""
    code = (
        "import sys, sglang_dsv4_fix.main as m, sglang_dsv4_fix.commands.repro, sglang_dsv4_fix.harness.variants;"
        "m.build_parser('repro');"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'tvm_ffi', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_gpu_fault_is_reported_and_fails_only_for_a_fixed_variant() -> None:
    from sglang_dsv4_fix.commands import repro
    from sglang_dsv4_fix.harness import report

    fault = {"release": "0.5.12", "variant": "original", "shape": "c4 [1x256+2x256+3x256+4x256]",
             "error": "CUDA error: an illegal memory access was encountered",
             "submitted_calls": 500, "not_run": ["0.5.12/original"]}  # fmt: skip
    results = {"plans": [], "racecheck": [], "same_plans": [], "fault": fault}
    assert repro._failures(results) == []
    assert report.fault(fault) == (
        "0.5.12 original c4 [1x256+2x256+3x256+4x256]: the GPU faulted within the first 500 calls "
        "(CUDA error: an illegal memory access was encountered); the CUDA context is lost, "
        "not run: 0.5.12/original"
    )
    fault = {**fault, "variant": "no-init", "not_run": ["0.5.12/no-init", "0.5.13/barrier"]}
    assert repro._failures({**results, "fault": fault}) == [
        "0.5.12/no-init c4 [1x256+2x256+3x256+4x256]: the GPU faulted "
        "(CUDA error: an illegal memory access was encountered)",
        "not run after the fault: 0.5.12/no-init",
        "not run after the fault: 0.5.13/barrier",
    ]
