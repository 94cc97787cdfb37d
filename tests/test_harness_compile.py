"""Compile-only check (CPU, CI): all three variants of every distinct affected kernel build with nvcc.

The same translation unit the GPU harness loads (the tree's own c_plan.cuh, SGLang's flags, the
harness's kernel0 timing entry point), through tvm-ffi's build_inline, stopped at the object file
so no CUDA runtime or GPU is needed. 0.5.14 and 0.5.15.post1 share their kernel with 0.5.13 and
0.5.15, and 0.5.17 with 0.5.16 (FACTS.md), so four releases cover every affected kernel.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from sglang_dsv4_fix import jitcache
from sglang_dsv4_fix.errors import FatalError
from sglang_dsv4_fix.harness import build, variants
from sglang_dsv4_fix.jitcache import Arch
from sglang_dsv4_fix.tree import find_tree

DISTINCT_AFFECTED = ("0.5.12", "0.5.13", "0.5.15", "0.5.16")


def _nvcc_or_skip() -> Path:
    try:
        return build.find_nvcc()
    except FatalError as e:
        pytest.skip(f"compile-only check needs nvcc: {e}")


def _prepare_all(tree_factory, tmp_path: Path) -> list[variants.Variant]:
    out = []
    for release in DISTINCT_AFFECTED:
        tree = find_tree(tree_factory.installed(release, tmp_path / release))
        out += variants.prepare(tree, variants.NAMES, tmp_path / "build")
    return out


def _check_objects(built: list[variants.Variant], arch: Arch, tmp_path: Path) -> None:
    start = time.monotonic()
    objects = build.build_all(built, [arch] * len(built), tmp_path / "build", object_only=True)
    assert [o.name for o in objects] == [f"{build.MODULE}.o"] * len(built)
    assert all(o.stat().st_size > 0 for o in objects)
    print(f"{len(objects)} builds for {build.tag(arch)} in {time.monotonic() - start:.0f} s")


@pytest.mark.slow
def test_every_affected_kernel_compiles_for_sm90a(tree_factory, tmp_path: Path) -> None:
    _nvcc_or_skip()
    built = _prepare_all(tree_factory, tmp_path)
    assert len(built) == 12
    _check_objects(built, Arch(9, 0, "9.0a"), tmp_path)


@pytest.mark.slow
def test_every_affected_kernel_compiles_for_sm100a(tree_factory, tmp_path: Path) -> None:
    nvcc = _nvcc_or_skip()

    listed = subprocess.run([str(nvcc), "--list-gpu-code"], capture_output=True, text=True)
    # The list names base targets only; sm_100a is sm_100 plus the arch-specific instructions.
    if "sm_100" not in listed.stdout.split():
        pytest.skip(f"{nvcc} has no sm_100 target")
    _check_objects(_prepare_all(tree_factory, tmp_path), Arch(10, 0, "10.0a"), tmp_path)


@pytest.mark.slow
def test_each_release_builds_for_its_own_loaders_target(tree_factory, tmp_path: Path) -> None:
    """0.5.12 - 0.5.15.post1 build sm_90 on an H200, 0.5.16+ sm_90a (read off each loader)."""
    _nvcc_or_skip()
    built, archs = [], []
    for release in ("0.5.12", "0.5.16"):
        tree = find_tree(tree_factory.installed(release, tmp_path / release))
        built += variants.prepare(tree, ("no-init",), tmp_path / "build")
        archs.append(jitcache.arch_for(tree, 9, 0))
    assert [a.target for a in archs] == ["9.0", "9.0a"]
    objects = build.build_all(built, archs, tmp_path / "build", object_only=True)
    ninja = [(o.parent / "build.ninja").read_text() for o in objects]
    assert [o.parent.name for o in objects] == ["sm_90", "sm_90a"]
    assert "code=sm_90 " in ninja[0] + " " and "sm_90a" not in ninja[0]
    assert "code=sm_90a" in ninja[1]
    assert all("-DSGL_CUDA_ARCH=900" in n for n in ninja)


def test_arch_flags_follow_sglang() -> None:
    assert build.tag(Arch(9, 0, "9.0a")) == "sm_90a"
    assert build.tag(Arch(9, 0, "9.0")) == "sm_90"
    assert build.cuda_cflags(Arch(10, 0, "10.0a"))[0] == "-DSGL_CUDA_ARCH=1000"
    assert build.cuda_cflags(Arch(9, 0, "9.0a")) == [
        "-DSGL_CUDA_ARCH=900",
        "-std=c++20",
        "-O3",
        "--expt-relaxed-constexpr",
    ]
