"""prewarm: compile the tree's fixed planner into the JIT cache under the name its loader uses."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglang_dsv4_fix import __version__, cacheclean, jitcache, jitnames, jitroot
from sglang_dsv4_fix.commands._common import (
    add_tree,
    command,
    emit,
    options,
    progress,
    tree_dict,
    tree_of,
)
from sglang_dsv4_fix.commands.clear_cache import add_cache_dir
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import sha256_bytes, sha256_file
from sglang_dsv4_fix.tree import Tree

HELP = """\
Builds exactly what the release's own load_jit would build on first use (same sources, flags,
include path and build folder), so the first server start after the fix loads it instead of
compiling. Needs nvcc and apache-tvm-ffi (the version the tree's runtime uses). Without a GPU
(image builds) name the target: --arch 9.0a (H100/H200). Refuses a racy kernel."""


def add_parser(sub: Any) -> None:
    p = command(sub, "prewarm", __doc__, HELP)
    add_tree(p)
    add_cache_dir(p)
    p.add_argument(
        "--arch", metavar="ARCH", help="CUDA arch to build for, e.g. 9.0a (default: this GPU's)"
    )


def run(args: argparse.Namespace) -> int:
    tree = tree_of(args)
    data = _fixed_kernel(tree, args)
    if jitnames.scheme_of(tree) == "sglang-ninja":
        raise FatalError(
            f"{tree.package_dir}: 0.5.18+ ships the fix and builds into SGLang's own cache; "
            "nothing to prewarm",
            Exit.NOT_APPLICABLE,
        )
    cuda_home = _cuda_home()
    arch = jitcache.arch_for(tree, *_capability(args.arch), nvcc=_nvcc_version(cuda_home))
    version = _tvm_ffi_version(tree)
    root = jitroot.cache_root(args.cache_dir)
    call = jitcache.load_call(tree, data, arch, version, root)
    warm = _already_warm(tree, call)
    seconds = 0.0 if warm else _build(tree, call, root, cuda_home, data)
    verb = "already warm" if warm else f"built in {seconds:.1f} s"
    payload = {
        **tree_dict(tree),
        "build_dir": str(call.build_dir),
        "module": call.name,
        "arch": arch.target,
        "tvm_ffi": version,
        "built": not warm,
        "seconds": round(seconds, 2),
    }
    emit(args, payload, [f"{call.build_dir}: {verb} (arch {arch.target}, tvm-ffi {version})"])
    return int(Exit.OK)


def _fixed_kernel(tree: Tree, args: argparse.Namespace) -> bytes:
    """The kernel's bytes, if the verdict (as ``verify`` gives it, cache aside) is a safe fix."""
    from sglang_dsv4_fix import state, verdict

    if tree.kernel_path is None:
        raise FatalError(f"{tree.package_dir}: no DeepSeek-V4 planner", Exit.NOT_APPLICABLE)
    current = state.inspect(tree)
    v = verdict.assess(tree, options(args)._replace(check_cache=False), current)
    if not current.safe:
        raise FatalError(
            f"{tree.kernel_path}: {v.headline}; refusing to prewarm anything but a safe fix",
            Exit.REFUSED,
        )
    return current.data


def _capability(arch: str | None) -> tuple[int, int]:
    if arch is not None:
        try:
            return jitcache.parse_capability(arch)
        except ValueError as e:
            raise FatalError(str(e), Exit.USAGE) from e
    found = _gpu_capability()
    if found is None:
        raise FatalError(
            "no GPU found (nvidia-smi); name the target with --arch, e.g. 9.0a", Exit.ENVIRONMENT
        )
    return found


def _gpu_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability from nvidia-smi (never imports torch)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            (smi, "--query-gpu=compute_cap", "--format=csv,noheader"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    with contextlib.suppress(ValueError):
        return jitcache.parse_capability(first)
    return None


def _cuda_home() -> Path:
    """The CUDA toolkit the way tvm-ffi finds it: CUDA_HOME/CUDA_PATH, nvcc on PATH, /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        home = str(Path(nvcc).parent.parent) if nvcc else "/usr/local/cuda"
    if not (Path(home) / "bin" / "nvcc").is_file():
        raise FatalError(f"nvcc not found (looked in {home}/bin; set CUDA_HOME)", Exit.ENVIRONMENT)
    return Path(home)


def _nvcc_version(cuda_home: Path) -> tuple[int, int]:
    out = subprocess.run(
        (str(cuda_home / "bin" / "nvcc"), "--version"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if m is None:
        raise FatalError(f"cannot read the CUDA version of {cuda_home}/bin/nvcc", Exit.ENVIRONMENT)
    return int(m.group(1)), int(m.group(2))


def _tvm_ffi_version(tree: Tree) -> str:
    try:
        import tvm_ffi
    except ImportError as e:
        raise FatalError(
            f"apache-tvm-ffi is not installed here ({e}); install the version the tree's SGLang "
            f"pins ({jitcache.tvm_ffi_pin(tree.release) or 'see its METADATA'})",
            Exit.ENVIRONMENT,
        ) from e
    have = str(tvm_ffi.__version__)
    runtime = jitcache.runtime_tvm_ffi(tree)
    if runtime is not None and runtime != have:
        raise FatalError(
            f"the tree's SGLang runs tvm-ffi {runtime} but this Python has {have}: a build made "
            f"here would be named and linked for {have}; install apache-tvm-ffi=={runtime}",
            Exit.REFUSED,
        )
    return have


def _already_warm(tree: Tree, call: jitcache.LoadCall) -> bool:
    so = call.build_dir / f"{call.name}.so"
    if not so.is_file() or so.is_symlink():
        return False
    if call.build_directory is not None or call.name != jitroot.MODULE:
        return True  # the name hashes the bytes: a .so there was built from them
    note = jitcache.read_sidecar(call.build_dir, so.name)  # 0.5.12: only our note can tell
    assert tree.kernel_path is not None
    return note is not None and note.get("kernel_sha256") == sha256_file(tree.kernel_path)


def _build(tree: Tree, call: jitcache.LoadCall, root: Path, cuda_home: Path, data: bytes) -> float:
    import tvm_ffi.cpp

    if os.path.lexists(call.build_dir):  # 0.5.12: same dir as the racy build; start clean
        checked = cacheclean.checked_root(root)
        assert checked is not None
        cacheclean.remove_entries(checked, [checked / call.build_dir.name])
    start = time.monotonic()
    with _compile_env(call, root, cuda_home), _compile_errors(), progress(f"compiling {call.name}"):
        so = Path(
            tvm_ffi.cpp.build_inline(
                call.name,
                cpp_sources=[],
                cuda_sources=list(call.cuda_sources),
                extra_cflags=list(call.extra_cflags),
                extra_cuda_cflags=list(call.extra_cuda_cflags),
                extra_ldflags=[],
                extra_include_paths=list(call.extra_include_paths),
                build_directory=None if call.build_directory is None else str(call.build_directory),
            )
        )
    seconds = time.monotonic() - start
    if so.parent.resolve() != call.build_dir.resolve():
        raise FatalError(
            f"tvm-ffi built into {so.parent}, not {call.build_dir} as the loader would look: "
            "the naming model is wrong for this tree; please report it",
            Exit.INTERNAL,
        )
    jitcache.write_sidecar(call.build_dir, so, _note(tree, call, data))
    return seconds


@contextlib.contextmanager
def _compile_env(call: jitcache.LoadCall, root: Path, cuda_home: Path) -> Iterator[None]:
    """As load_jit's _jit_compile_context: TVM_FFI_CUDA_ARCH_LIST is the target while compiling.
    LIBRARY_PATH (not an ldflag, which would change a 0.5.12/0.5.13 dir hash) lets the linker find
    libcudart where tvm-ffi's ``-L<cuda home>/lib64`` misses it (a wrapper nvcc, a lib/ toolkit)."""
    old_library = os.environ.get("LIBRARY_PATH")
    new = {
        "TVM_FFI_CUDA_ARCH_LIST": call.arch.target,
        "TVM_FFI_CACHE_DIR": str(root),
        "LIBRARY_PATH": os.pathsep.join([*_cudart_dirs(cuda_home), *filter(None, [old_library])]),
    }
    saved = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _compile_errors() -> Iterator[None]:
    try:
        yield
    except RuntimeError as e:  # tvm-ffi raises RuntimeError with ninja's output
        tail = " | ".join(str(e).strip().splitlines()[-4:])
        raise FatalError(f"compiling the planner failed: {tail}", Exit.ENVIRONMENT) from e


def _cudart_dirs(cuda_home: Path) -> list[str]:
    homes = [cuda_home, Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))]
    dirs = [h / d for h in homes for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    return list(dict.fromkeys(str(d) for d in dirs if (d / "libcudart.so").exists()))


def _note(tree: Tree, call: jitcache.LoadCall, data: bytes) -> dict[str, Any]:
    from sglang_dsv4_fix.kernel import classify

    return {
        "tool": "sglang-dsv4-fix",
        "tool_version": __version__,
        "release": tree.release,
        "kernel": str(tree.kernel_path),
        "kernel_sha256": sha256_bytes(data),
        "variant": classify(data.decode("utf-8")).variant,
        "arch": call.arch.target,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
