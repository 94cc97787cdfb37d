"""prewarm compiles the real kernel of a real release with nvcc, where SGLang's loader looks.

Needs nvcc (CUDA_HOME, PATH or /usr/local/cuda*) and apache-tvm-ffi 0.1.11 in this Python; the
0.5.12 case installs the pinned 0.1.9 wheel into the tree's own site-packages. Skipped, with the
reason, only where nvcc is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jitref import fetch_tvm_ffi, lift
from test_jitcache import variant_tree
from trees import TreeFactory

from sglang_dsv4_fix import jitcache
from sglang_dsv4_fix.main import main


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME")
    for cand in [home and f"{home}/bin/nvcc", shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]:
        if cand and Path(cand).is_file():
            return cand
    return None


needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="nvcc not found: cannot compile the kernel")
ROOT = Path(__file__).resolve().parent.parent


def run_cli(
    args: list[str], pythonpath: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*(pythonpath or []), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "sglang_dsv4_fix", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_refuses_a_racy_kernel(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "original")
    assert main(["prewarm", "--tree", str(tree.root), "--arch", "9.0a"]) == 6
    assert "refusing to prewarm anything but a safe fix" in capsys.readouterr().err


def test_fixed_release_is_not_applicable(tree_factory: TreeFactory, tmp_path: Path) -> None:
    tree = variant_tree(tree_factory, "0.5.18", tmp_path / "sp", "original")
    assert main(["prewarm", "--tree", str(tree.root), "--arch", "9.0a"]) == 4


def test_bad_arch_is_usage(tree_factory: TreeFactory, tmp_path: Path) -> None:
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "no-init")
    assert main(["prewarm", "--tree", str(tree.root), "--arch", "hopper"]) == 2


@needs_nvcc
def test_prewarm_0516_then_the_release_loader_loads_it(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi not installed (pip install '.[gpu]')")
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "original")
    root = Path(os.environ["TVM_FFI_CACHE_DIR"])
    assert main(["apply", "--tree", str(tree.root)]) == 0
    res = run_cli(["prewarm", "--tree", str(tree.root), "--arch", "9.0a", "--json"])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    build = Path(out["build_dir"])
    assert build.name == (
        "sgl_kernel_jit_dpsk_v4_compress_plan_3531301c1ac2c5cd__arch_9.0a__tvmffi_0.1.11"
    )
    so = build / f"{out['module']}.so"
    before = (so.stat().st_ino, so.stat().st_mtime_ns, (build / ".ninja_log").read_text())
    # the release's own load_jit (lifted from the wheel's compile.py) takes the prebuilt path
    loaded = _release_load_jit(tree.package_dir, root)
    assert loaded == {"so": str(so), "compiled": False}
    assert (so.stat().st_ino, so.stat().st_mtime_ns, (build / ".ninja_log").read_text()) == before
    assert [b.origin for b in jitcache.inventory(tree, root)] == ["no-init"]
    assert main(["verify", "--tree", str(tree.root)]) == 0
    again = run_cli(["prewarm", "--tree", str(tree.root), "--arch", "9.0a"])
    assert "already warm" in again.stdout


@needs_nvcc
def test_prewarm_0512_names_match_tvm_ffi_and_sidecar_tells(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """0.5.12: tvm-ffi 0.1.9 (the pin, installed beside the tree) names the dir itself; prewarm
    checks it equals our prediction; the sidecar then tells the bytes the name cannot."""
    tree = variant_tree(tree_factory, "0.5.12", tmp_path / "sp", "original")
    site = tree.package_dir.parent
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(fetch_tvm_ffi("0.1.9")),
        ],
        check=True,
    )
    root = Path(os.environ["TVM_FFI_CACHE_DIR"])
    assert main(["apply", "--tree", str(tree.root)]) == 0
    res = run_cli(["prewarm", "--tree", str(tree.root), "--arch", "9.0a", "--json"], [str(site)])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["tvm_ffi"] == "0.1.9" and out["arch"] == "9.0"  # 0.5.12 names Hopper "9.0"
    assert [(b.origin, b.path.name) for b in jitcache.inventory(tree, root)] == [
        ("no-init", Path(out["build_dir"]).name)
    ]
    assert jitcache.racy_builds(tree, root) == []
    assert main(["revert", "--tree", str(tree.root)]) == 0  # same dir, other bytes: cleared
    assert jitcache.inventory(tree, root) == []


_LOAD = r"""
import ast, json, logging, os, pathlib, re, hashlib, sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import List, Tuple
pkg = pathlib.Path(sys.argv[1]); code = sys.stdin.read()
ns = dict(globals()); ns.update(KERNEL_PATH=(pkg / "jit_kernel").resolve(), REGISTERED_DEPENDENCIES={},
    logger=logging.getLogger("x"), DEFAULT_LDFLAGS=[], is_hip_runtime=lambda: False)
exec(code, ns)
ns["DEFAULT_INCLUDE"] = [str(ns["KERNEL_PATH"] / "include")]
arch = ns["ArchInfo"](9, 0, ns["_cuda_arch_suffix"](9, 0))
ns["get_jit_cuda_arch"] = lambda: arch
import tvm_ffi
seen = []
orig = tvm_ffi.load_module
def spy(path, *a, **k):
    seen.append(str(path)); return orig(path, *a, **k)
tvm_ffi.load_module = spy
try:
    ns["_jit_compress_plan_module"]()
    compiled = False
except RuntimeError as e:  # PATH has no ninja/nvcc: only a compile attempt can fail this way
    compiled = str(e)[:200]
print(json.dumps({"so": seen[0] if seen else None, "compiled": compiled}))
"""


def _release_load_jit(package: Path, root: Path) -> dict[str, object]:
    """Run the wheel's own load_jit + _jit_compress_plan_module + helpers (lifted by ast);
    only the GPU probe (arch 9.0 via the release's own ArchInfo/_cuda_arch_suffix) and
    is_hip_runtime are supplied. PATH holds no ninja or nvcc, so any compile attempt fails."""
    utils = package / "jit_kernel" / "utils"
    names = {
        "load_jit",
        "_local_jit_source_hash",
        "_QUOTED_INCLUDE_RE",
        "_ANGLE_INCLUDE_RE",
        "_jit_build_dir_name",
        "_tvm_ffi_version",
        "_make_wrapper",
        "_jit_compile_context",
        "DEFAULT_CFLAGS",
        "ArchInfo",
        "_cuda_arch_suffix",
        "get_default_target_flags",
        "make_name",
        "_jit_compress_plan_module",
    }
    code = "\n".join(
        lift(p.read_text(), names)
        for p in (
            utils / "compile.py",
            utils / "arch.py",
            package / "jit_kernel/dsv4/utils.py",
            package / "jit_kernel/dsv4/compress.py",
        )
    )
    code = code.replace("@contextmanager\n", "")  # lift() drops decorators; re-add below
    code = "from __future__ import annotations\n" + code
    code += "\n_jit_compile_context = contextmanager(_jit_compile_context)\n"
    lib = [str(p) for p in Path("/usr/local").glob("cuda*/lib") if (p / "libcudart.so").exists()]
    env = {
        **os.environ,
        "TVM_FFI_CACHE_DIR": str(root),
        "PATH": "/nonexistent",
        "LD_LIBRARY_PATH": os.pathsep.join([*lib, os.environ.get("LD_LIBRARY_PATH", "")]),
    }
    res = subprocess.run(
        [sys.executable, "-c", _LOAD, str(package)],
        input=code,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))
