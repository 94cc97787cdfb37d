"""The plugin's JIT-load and stale-build checks on real builds, under SGLang's real load_plugins().

0.5.16, on a machine with nvcc and no GPU: the release's own ``_jit_compress_plan_module`` (the
real loader function, imported from the real wheel and hooked by the plugin through SGLang's
registry) compiles the racy kernel with tvm-ffi and nvcc, exactly as a first server start does;
``sglang-dsv4-fix prewarm`` compiles the fixed one. The only thing supplied is the GPU probe:
SGLang's own ``override_jit_cuda_arch(9, 0, "a")`` (an H200) stands in for the missing device.
Asserted: what operators and the fleet report see (log lines' key fields, report records, exit
codes), in warn and enforce mode, never the plugin's private functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plugin_env import copy_site, install_self, release_site, run_python

from sglang_dsv4_fix.main import main

pytestmark = pytest.mark.slow

CUDA = next(
    (
        p
        for p in (Path("/usr/local/cuda-13.0"), Path("/usr/local/cuda"))
        if (p / "bin/nvcc").is_file()
    ),
    None,
)
MODULE = "sgl_kernel_jit_dpsk_v4_compress_plan"
RACY_DIR = f"{MODULE}_d2fa2dab1d672b7c__arch_9.0a__tvmffi_0.1.11"  # FACTS.md: 0.5.16 on an H200
NO_INIT_DIR = f"{MODULE}_3531301c1ac2c5cd__arch_9.0a__tvmffi_0.1.11"

LOAD = """
import sys, types
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.utils as utils
utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP3")
print("SERVING", flush=True)
try:
    import sglang.jit_kernel.dsv4.compress
except ImportError as e:  # the package goes on to import modules needing transformers
    print("PACKAGE", e)
compress = sys.modules["sglang.jit_kernel.dsv4.compress"]
from sglang.jit_kernel.utils.arch import override_jit_cuda_arch
BEFORE_LOAD
try:
    with override_jit_cuda_arch(9, 0, "a"):
        module = compress._jit_compress_plan_module()
    print("LOADED", type(module).__name__, flush=True)
except RuntimeError as e:
    print("REFUSED", str(e).splitlines()[0], flush=True)
"""
START = re.compile(r"^\[[^\]]* TP3\] sglang-dsv4-fix: c_plan\.cuh .*$", re.MULTILINE)
JIT = re.compile(r"^\[[^\]]* TP3\] sglang-dsv4-fix: JIT planner loaded .*$", re.MULTILINE)
RACY_SO = "the loaded planner .so was built from the racy kernel (sgl-project/sglang#32467)"


def _ninja_dir() -> str | None:
    found = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    return str(Path(found).parent) if found else None


needs_toolchain = pytest.mark.skipif(
    CUDA is None or _ninja_dir() is None, reason="compiling the planner needs nvcc and ninja"
)


@pytest.fixture(scope="module")
def self_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_self(tmp_path_factory.mktemp("self") / "site")


def serve_and_load(
    site: Path, self_site: Path, cache: Path, report: Path, before_load: str = "", **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str], list[str], list[dict[str, Any]]]:
    assert CUDA is not None
    lib = [str(d) for d in (CUDA / "lib64", CUDA / "lib") if (d / "libcudart.so").exists()]
    full = {
        "PATH": os.pathsep.join([str(CUDA / "bin"), str(_ninja_dir()), "/usr/bin", "/bin"]),
        "CUDA_HOME": str(CUDA),
        "LIBRARY_PATH": os.pathsep.join(lib),
        "LD_LIBRARY_PATH": os.pathsep.join(lib),
        "TVM_FFI_CACHE_DIR": str(cache),
        "SGLANG_DSV4_FIX_REPORT": str(report),
        **env,
    }
    code = LOAD.replace("BEFORE_LOAD", before_load)
    done = run_python(code, self_site, site, env=full, timeout=900)
    records = [json.loads(r) for r in report.read_text().splitlines()] if report.exists() else []
    report.unlink(missing_ok=True)
    return done, START.findall(done.stderr), JIT.findall(done.stderr), records


def cli(*argv: str) -> int:
    return main(list(argv))


@needs_toolchain
def test_racy_and_fixed_builds_at_jit_load_and_start(self_site: Path, tmp_path: Path) -> None:
    site = copy_site(release_site("0.5.16"), tmp_path / "site")
    kernel = site / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    cache = tmp_path / "tvm-ffi"
    report = tmp_path / "fleet.jsonl"

    # 1. warn, unpatched: the release's loader compiles the racy kernel; the load is reported
    done, starts, jits, records = serve_and_load(site, self_site, cache, report)
    assert "LOADED" in done.stdout, done.stderr
    racy_so = cache / RACY_DIR / f"{RACY_DIR.split('__')[0]}.so"
    assert racy_so.is_file()
    (jit,) = jits
    assert f"so={racy_so} (compiled now) built-from variant=racy-init sha256=6fa3a2a0cef7 " in jit
    assert jit.endswith(f"-- RACY: {RACY_SO}")
    assert [r["event"] for r in records] == ["start", "jit-load"]
    assert (records[1]["so"], records[1]["built_variant"], records[1]["action"]) == (
        str(racy_so),
        "racy-init",
        "warned",
    )
    assert records[1]["problem"] == RACY_SO

    # 2. apply and prewarm: the racy build is now stale; the fixed one loads from the cache
    assert cli("apply", "--tree", str(site), "--no-clear-cache") == 0
    env = {**os.environ, "TVM_FFI_CACHE_DIR": str(cache), "CUDA_HOME": str(CUDA)}
    warm = subprocess.run(
        [sys.executable, "-m", "sglang_dsv4_fix", "prewarm", "--tree", str(site), "--arch", "9.0a"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert warm.returncode == 0, warm.stderr
    fixed_so = cache / NO_INIT_DIR / f"{NO_INIT_DIR.split('__')[0]}.so"
    assert fixed_so.is_file()
    done, starts, jits, records = serve_and_load(site, self_site, cache, report)
    assert "LOADED" in done.stdout, done.stderr
    (start,) = starts
    assert "variant=no-init" in start and "mode=warn" in start
    # key fields: the stale build named, the fix command, serving goes on
    assert RACY_DIR in start
    assert f"sglang-dsv4-fix clear-cache --tree {site}" in start
    assert start.endswith("serving continues")
    (jit,) = jits
    assert f"so={fixed_so} (from cache) built-from variant=no-init " in jit
    assert " -- " not in jit  # no problem appended
    assert [(r["event"], r["action"]) for r in records] == [("start", "warned"), ("jit-load", "ok")]

    # 3. enforce with the stale racy build still there: the process stops at start, exit 5
    done, starts, jits, records = serve_and_load(
        site, self_site, cache, report, SGLANG_DSV4_FIX_MODE="enforce"
    )
    assert done.returncode == 5, done.stderr
    assert "SERVING" not in done.stdout and jits == []
    refusal = done.stderr.splitlines()[-1]
    assert refusal.startswith("sglang-dsv4-fix: refusing to start: ") and RACY_DIR in refusal
    assert [(r["event"], r["action"]) for r in records] == [("start", "refused")]

    # 4. enforce, cache cleared: starts; then the kernel goes back to the original and the racy
    # build reappears (another node on a shared cache volume) before the first load: refused
    aside = tmp_path / "aside"
    shutil.copytree(cache / RACY_DIR, aside)
    assert cli("clear-cache", "--tree", str(site), "--cache-dir", str(cache)) == 0
    assert not (cache / RACY_DIR).exists() and fixed_so.is_file()
    revert = (
        "import shutil, subprocess\n"
        f"subprocess.run([{sys.executable!r}, '-m', 'sglang_dsv4_fix', 'revert', '--tree', "
        f"{str(site)!r}, '--no-clear-cache'], check=True)\n"
        f"shutil.copytree({str(aside)!r}, {str(cache / RACY_DIR)!r})\n"
    )
    done, starts, jits, records = serve_and_load(
        site, self_site, cache, report, revert, SGLANG_DSV4_FIX_MODE="enforce"
    )
    assert "SERVING" in done.stdout, done.stderr
    assert "variant=no-init" in starts[0] and " -- " not in starts[0]
    assert f"REFUSED sglang-dsv4-fix: refusing the planner build: {RACY_SO}" in done.stdout
    (jit,) = jits
    assert f"so={racy_so} (from cache) built-from variant=racy-init " in jit
    assert [r["event"] for r in records] == ["start", "jit-load"]
    assert records[0]["action"] == "ok" and records[1]["problem"] == RACY_SO
    assert records[1]["action"] == "refused" and records[1]["state"] == "stale-build"
    assert b"if (tx < kNumWarps) {" in kernel.read_bytes()  # reverted: the racy original

    # 5. the racy build's folder put under the fixed build's name (a restored or copied cache):
    # the loader finds no .so of the fixed module there and compiles one from the fixed kernel.
    # The folder's old note speaks for the racy .so beside it, not for the one loaded, so the
    # JIT-load line agrees with verify: fixed, nothing stale (enforce serves)
    assert cli("apply", "--tree", str(site), "--no-clear-cache") == 0
    shutil.rmtree(cache / RACY_DIR)
    shutil.rmtree(cache / NO_INIT_DIR)
    shutil.copytree(aside, cache / NO_INIT_DIR)
    assert (cache / NO_INIT_DIR / racy_so.name).is_file() and not fixed_so.exists()
    assert cli("verify", "--tree", str(site), "--cache-dir", str(cache)) == 0
    done, starts, jits, records = serve_and_load(
        site, self_site, cache, report, SGLANG_DSV4_FIX_MODE="enforce"
    )
    assert "LOADED" in done.stdout, done.stderr
    (jit,) = jits
    assert f"so={fixed_so} (compiled now) built-from variant=no-init " in jit
    assert " -- " not in jit
    assert [(r["event"], r["action"]) for r in records] == [("start", "ok"), ("jit-load", "ok")]
