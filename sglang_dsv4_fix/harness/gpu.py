"""The heavy side: torch and tvm-ffi, imported only here and only when a command needs a GPU."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.harness.build import scoped_env


def torch() -> Any:
    try:
        import torch as t
    except ImportError as e:
        raise FatalError(
            f"torch is not importable ({e}); the harness needs it", Exit.ENVIRONMENT
        ) from e
    return t


def device_capability() -> tuple[int, int]:
    """The visible GPU's compute capability ((9, 0) on an H200); ENVIRONMENT error without one."""
    t = torch()
    if not t.cuda.is_available():
        raise FatalError(
            "no CUDA GPU visible (torch.cuda.is_available() is False)", Exit.ENVIRONMENT
        )
    major, minor = t.cuda.get_device_capability()
    return int(major), int(minor)


def device_name() -> str:
    return str(torch().cuda.get_device_name())


def isolate_tvm_ffi_cache(build_dir: Path) -> AbstractContextManager[None]:
    """Point tvm-ffi's own cache (its torch DLPack helper) into our build folder, not ~/.cache."""
    return scoped_env("TVM_FFI_CACHE_DIR", str(build_dir / "tvm-ffi-cache"))


def load(so: Path) -> Any:
    try:
        import tvm_ffi
    except ImportError as e:
        raise FatalError(f"apache-tvm-ffi is not importable ({e})", Exit.ENVIRONMENT) from e
    return tvm_ffi.load_module(str(so))
