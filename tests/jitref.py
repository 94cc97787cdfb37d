"""Run the releases' OWN naming code, taken from the real wheel files, in a fresh subprocess.

Nothing here re-implements a formula: functions and module-level regexes are lifted by ``ast``
from the extracted release file (decorators such as ``@cache_once`` dropped) and executed with
the stdlib they import. The only things supplied are what needs a GPU/torch at run time: the
detected capability (``get_jit_cuda_arch``) and ``is_hip_runtime`` (False). tvm-ffi's naming is
run from the pinned apache-tvm-ffi wheel's own ``tvm_ffi/cpp/extension.py``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from trees import fetch_wheel


def fetch_tvm_ffi(version: str) -> Path:
    """The apache-tvm-ffi wheel (any platform: we only read its Python source)."""
    return fetch_wheel(version, "apache-tvm-ffi")


def tvm_ffi_extension_source(version: str) -> str:
    with zipfile.ZipFile(fetch_tvm_ffi(version)) as whl:
        return whl.read("tvm_ffi/cpp/extension.py").decode()


def lift(source: str, names: set[str]) -> str:
    """The named top-level functions/classes/assignments of ``source``, decorators dropped
    (``@dataclass`` kept: it is semantics, not caching)."""
    picked: list[ast.stmt] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            node.decorator_list = [
                d for d in node.decorator_list if isinstance(d, ast.Name) and d.id == "dataclass"
            ]
            picked.append(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for t in node.targets
        ):
            picked.append(node)
    return ast.unparse(ast.Module(body=picked, type_ignores=[]))


_RUNNER = r"""
import hashlib, json, logging, os, pathlib, re, sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
spec = json.load(sys.stdin)
ns = dict(globals())
ns["KERNEL_PATH"] = pathlib.Path(spec["kernel_root"]).resolve()
exec(spec["sglang_code"], ns)
out = {}
files = [str((ns["KERNEL_PATH"] / "csrc" / "deepseek_v4/c_plan.cuh").resolve())]
name = "sgl_kernel_jit_" + ns["make_name"]("compress_plan")
if "_local_jit_source_hash" in ns:
    name += "_" + ns["_local_jit_source_hash"](files)
out["module"] = name
if "_jit_build_dir_name" in ns:
    major, minor = spec["capability"]
    suffix = ns["_cuda_arch_suffix"](major, minor) if "_cuda_arch_suffix" in ns else ""
    arch = ns["ArchInfo"](major, minor, suffix)
    ns["get_jit_cuda_arch"] = lambda: arch
    out["dir"] = ns["_jit_build_dir_name"](name)
    out["arch_flag"] = arch.jit_flag
if spec.get("tvm_code"):
    t = dict(globals())
    exec(spec["tvm_code"], t)
    cuda = "\n".join(spec["cuda_sources"])
    # build_inline, CUDA-only, functions=None: both sources decorated with {}, then hashed so.
    h = t["_hash_sources"](t["_decorate_with_tvm_ffi"]("", {}), t["_decorate_with_tvm_ffi"](cuda, {}),
                           None, None, {}, spec["cflags"], spec["cuda_cflags"], [],
                           spec["include_paths"], None)
    out["tvm_dir"] = name + "_" + h
json.dump(out, sys.stdout)
"""

SGLANG_NAMES = {
    "_LOCAL_INCLUDE_RE",
    "_QUOTED_INCLUDE_RE",
    "_ANGLE_INCLUDE_RE",
    "_local_jit_source_hash",
    "_jit_build_dir_name",
    "_tvm_ffi_version",
    "ArchInfo",
    "_cuda_arch_suffix",
    "make_name",
}
TVM_NAMES = {
    "_hash_sources",
    "_decorate_with_tvm_ffi",
    "_CPP_ESCAPE_TABLE",
    "_escape_cpp_string_literal",
}


def release_code(package: Path, loader: Path) -> str:
    """Lifted naming code of one tree: its load_jit module, arch.py (if any), dsv4/utils.py."""
    sources = [loader, loader.parent / "arch.py"]
    sources.append(next(package.glob("**/dsv4/utils.py")))
    return "\n".join(lift(p.read_text(), SGLANG_NAMES) for p in sources if p.is_file())


def release_names(
    package: Path,
    loader: Path,
    kernel_root: Path,
    capability: tuple[int, int],
    tvm_ffi_version: str | None = None,
    call: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Names the release's own code gives: module, dir (0.5.14+), tvm_dir (tvm-ffi default)."""
    spec: dict[str, Any] = {
        "kernel_root": str(kernel_root),
        "sglang_code": release_code(package, loader),
        "capability": list(capability),
    }
    if tvm_ffi_version is not None and call is not None:
        spec["tvm_code"] = lift(tvm_ffi_extension_source(tvm_ffi_version), TVM_NAMES)
        spec.update(call)
    res = subprocess.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps(spec), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))
