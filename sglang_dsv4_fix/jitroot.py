"""Where the planner's JIT builds live, and whether the cache holds any (names only).

The one cache check every SGLang process on a fixed tree runs (verdict.stale_builds): with no
planner entry, the usual case, it is all of it. What the entries are is jitnames.py's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

MODULE = "sgl_kernel_jit_dpsk_v4_compress_plan"  # the start of every release's planner build name
ENV = ("TVM_FFI_CACHE_DIR", "HOME")  # all that cache_root reads of the environment (memo.py)


def cache_root(cache_dir: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``--cache-dir``, else ``$TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi`` (as both SGLang
    0.5.14+ and tvm-ffi compute it: the variable is taken as given, then ``~`` expanded).

    Set but empty, it is ``.``: tvm-ffi 0.1.9/0.1.11 (``os.environ.get("TVM_FFI_CACHE_DIR",
    default)`` in ``tvm_ffi/cpp/extension.py``) and SGLang's ``load_jit`` do not treat an empty
    value as unset, they build into each process's current folder. Readers look there too;
    ``cacheclean.clear_root`` refuses to clear it unless named by ``--cache-dir``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ if env is None else env
    return Path(env.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser()


def has_planner_entry(root: Path) -> bool:
    """Whether any top-level name in ``root`` starts like a planner build (names only)."""
    try:
        with os.scandir(root) as it:
            return any(e.name.startswith(MODULE) for e in it)
    except OSError:  # no cache (the usual case), or not a folder: nothing cached
        return False
