"""Build a variant with tvm-ffi's ``build_inline``, exactly as SGLang's loader compiles it.

Flags from the releases' ``load_jit`` (FACTS.md, jitcache.CUDA_FLAGS_TAIL): device
``-DSGL_CUDA_ARCH=<arch> -std=c++20 -O3 --expt-relaxed-constexpr``, include ``<kernel root>/include``,
for the target the release's own loader derives (jitcache.arch_for: ``9.0`` up to 0.5.15.post1,
``9.0a`` from 0.5.16 on an H200); the harness adds its kernel0 timing entry point
(bench_kernel0.cuh). Every build gets its own folder; nothing is shared with tvm-ffi's or SGLang's
caches.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.harness.variants import Variant
from sglang_dsv4_fix.jitcache import CUDA_FLAGS_TAIL, Arch

MODULE = "sglang_dsv4_fix_plan"
_STANDARD_HOMES = (Path("/usr/local"),)


def tag(arch: Arch) -> str:
    """``sm_90`` / ``sm_90a``: the build folder's name for a target."""
    return "sm_" + arch.target.replace(".", "")


def find_nvcc() -> Path:
    """nvcc as tvm-ffi will find it (CUDA_HOME, then PATH); ENVIRONMENT error if there is none."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home) / "bin" / "nvcc"] if home else []
    on_path = shutil.which("nvcc")
    candidates += [Path(on_path)] if on_path else []
    for root in _STANDARD_HOMES:  # where toolkits install themselves (tvm-ffi looks at the first)
        candidates += [
            root / "cuda" / "bin" / "nvcc",
            *sorted(root.glob("cuda-*/bin/nvcc"), reverse=True),
        ]
    for nvcc in candidates:
        if nvcc.is_file():
            return nvcc
    raise FatalError(
        "nvcc not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)", Exit.ENVIRONMENT
    )


def sources(kernel: Path) -> list[str]:
    bench = resources.files("sglang_dsv4_fix.harness").joinpath("bench_kernel0.cuh").read_text()
    return [
        f'#include "{kernel.resolve()}"',
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(plan_prefill, (plan_compress_prefill));",
        bench,
    ]


def cuda_cflags(arch: Arch) -> list[str]:
    return [arch.flag, *CUDA_FLAGS_TAIL]


def build(variant: Variant, arch: Arch, build_dir: Path, object_only: bool = False) -> Path:
    """Compile ``variant`` for ``arch``; the shared library (or, compile-only, the object file)."""
    tvm_ffi_cpp = _tvm_ffi_cpp()
    folder = build_dir / variant.release / variant.name / tag(arch)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        out = tvm_ffi_cpp.build_inline(
            MODULE,
            cuda_sources=sources(variant.kernel),
            extra_cuda_cflags=cuda_cflags(arch),
            extra_include_paths=[str(variant.include)],
            build_directory=str(folder),
            backend="cuda",
            **({"output": f"{MODULE}.o"} if object_only else {}),
        )
    except RuntimeError as e:
        tail = "\n".join(str(e).splitlines()[-12:])
        raise FatalError(
            f"build of {variant.label} for {tag(arch)} failed:\n{tail}", Exit.UNKNOWN
        ) from e
    return Path(out)


def build_all(
    variants: Sequence[Variant],
    archs: Sequence[Arch],
    build_dir: Path,
    object_only: bool = False,
    jobs: int = 0,
) -> list[Path]:
    """Build ``variants[i]`` for ``archs[i]``, in parallel per target (nvcc is single-threaded)."""
    find_nvcc()
    out: dict[int, Path] = {}
    for target in dict.fromkeys(a.target for a in archs):
        todo = [i for i, a in enumerate(archs) if a.target == target]
        workers = jobs or max(1, min(len(todo), os.cpu_count() or 1))
        # tvm-ffi reads the target from the environment (SGLang <= 0.5.17 force-sets it the same
        # way), so one target at a time.
        with scoped_env("TVM_FFI_CUDA_ARCH_LIST", target), ThreadPoolExecutor(workers) as pool:
            built = pool.map(lambda i: build(variants[i], archs[i], build_dir, object_only), todo)
            out.update(zip(todo, built, strict=True))
    return [out[i] for i in range(len(variants))]


@contextmanager
def scoped_env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the block only (tests and callers keep their own)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _tvm_ffi_cpp() -> Any:
    try:
        import tvm_ffi.cpp
    except ImportError as e:
        raise FatalError(
            f"apache-tvm-ffi is not importable ({e}); pip install 'sglang-dsv4-fix[gpu]'",
            Exit.ENVIRONMENT,
        ) from e
    return tvm_ffi.cpp
