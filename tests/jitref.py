"""Run the releases' OWN loader code, taken from the real wheel files, in a fresh subprocess.

Nothing here re-implements a formula or restates a flag: the release's ``load_jit`` (with its
default flags, include list, wrapper maker, naming and hashing helpers) and the loader module's
own ``_jit_compress_plan_module`` are lifted by ``ast`` from the extracted release files
(decorators such as ``@cache_once`` dropped) and executed with the stdlib they import. The only
things supplied are what needs a GPU/torch at run time: the detected capability
(``get_jit_cuda_arch``), ``is_hip_runtime`` (False) and ``torch.version.hip`` (None), and in place of ``tvm_ffi.cpp.load_inline`` a
recorder of the arguments the release's ``load_jit`` hands it. tvm-ffi's dir hash is then computed
over those recorded arguments by the pinned apache-tvm-ffi wheel's own ``_hash_sources``, the way
its ``build_inline`` does for a call without ``build_directory``.
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
    (``@dataclass`` and ``@contextmanager`` kept: they are semantics, not caching)."""
    picked: list[ast.stmt] = []
    kept = {"dataclass", "contextmanager"}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            node.decorator_list = [
                d for d in node.decorator_list if isinstance(d, ast.Name) and d.id in kept
            ]
            picked.append(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for t in node.targets
        ):
            picked.append(node)
    return ast.unparse(ast.Module(body=picked, type_ignores=[]))


_RUNNER = r"""
import hashlib, json, logging, os, pathlib, re, sys, types
from collections.abc import Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
spec = json.load(sys.stdin)
os.environ["TVM_FFI_CACHE_DIR"] = spec["cache_dir"]
os.environ.pop("TVM_FFI_CUDA_ARCH_LIST", None)
calls = []

def load_inline(name, **kwargs):  # stands in for tvm-ffi's compiler driver: records the call
    calls.append({"name": name, **kwargs, "arch_list": os.environ.get("TVM_FFI_CUDA_ARCH_LIST")})

def load(name, **kwargs):
    raise AssertionError("the compress-plan module is header-only: load() is not expected")

def load_module(path):
    raise AssertionError("no prebuilt module is expected in an empty cache: " + path)

tvm_ffi = types.ModuleType("tvm_ffi")
tvm_ffi.__version__ = spec["tvm_ffi_version"]
tvm_ffi.load_module = load_module
tvm_ffi.cpp = types.ModuleType("tvm_ffi.cpp")
tvm_ffi.cpp.load_inline, tvm_ffi.cpp.load = load_inline, load
sys.modules["tvm_ffi"], sys.modules["tvm_ffi.cpp"] = tvm_ffi, tvm_ffi.cpp

ns = dict(globals())
ns["KERNEL_PATH"] = pathlib.Path(spec["kernel_root"]).resolve()
ns["logger"] = logging.getLogger("release")
ns["is_hip_runtime"] = lambda: False
ns["torch"] = types.SimpleNamespace(version=types.SimpleNamespace(hip=None))  # a CUDA torch
exec(spec["sglang_code"], ns)
major, minor = spec["capability"]
suffix = ns["_cuda_arch_suffix"](major, minor) if "_cuda_arch_suffix" in ns else ""
arch = ns["ArchInfo"](major, minor, suffix)
ns["get_jit_cuda_arch"] = lambda: arch
exec(spec["loader_code"], ns)
ns["_jit_compress_plan_module"]()
assert len(calls) == 1, calls
call = calls[0]
out = {"module": call["name"], "call": call, "arch_flag": arch.jit_flag}
if call.get("build_directory") is not None:
    out["dir"] = pathlib.Path(call["build_directory"]).name
else:
    t = dict(globals())
    exec(spec["tvm_code"], t)
    decorate = t["_decorate_with_tvm_ffi"]
    # build_inline with functions=None: both joined sources decorated with {}, then hashed so.
    h = t["_hash_sources"](decorate("\n".join(call["cpp_sources"]), {}),
                           decorate("\n".join(call["cuda_sources"]), {}), None, None, {},
                           call["extra_cflags"], call["extra_cuda_cflags"], call["extra_ldflags"],
                           call["extra_include_paths"], None)
    out["tvm_dir"] = call["name"] + "_" + h
json.dump(out, sys.stdout)
"""

SGLANG_NAMES = {
    # naming and hashing
    "_LOCAL_INCLUDE_RE",
    "_QUOTED_INCLUDE_RE",
    "_ANGLE_INCLUDE_RE",
    "_local_jit_source_hash",
    "_jit_build_dir_name",
    "_tvm_ffi_version",
    "ArchInfo",
    "_cuda_arch_suffix",
    "make_name",
    # the call itself: load_jit, its defaults, its wrapper maker, its target flags and env scope
    "load_jit",
    "_make_wrapper",
    "DEFAULT_INCLUDE",
    "DEFAULT_CFLAGS",
    "DEFAULT_LDFLAGS",
    "get_default_target_flags",
    "_get_default_target_flags",
    "_jit_compile_context",
}
FUTURE = "from __future__ import annotations"  # the releases' annotations name torch types
LOADER_NAMES = {"_jit_compress_plan_module"}
TVM_NAMES = {
    "_hash_sources",
    "_decorate_with_tvm_ffi",
    "_CPP_ESCAPE_TABLE",
    "_escape_cpp_string_literal",
}


def release_files(package: Path) -> tuple[Path, Path, Path]:
    """(load_jit's module, the compress-plan loader module, the kernel root) of a tree, found by
    what the files define, not by the layout table of the code under test."""
    roots = [package / "jit_kernel", package / "kernels" / "jit"]
    candidates = [p for r in roots if r.is_dir() for p in sorted(r.glob("utils*.py"))]
    candidates += [p for r in roots if r.is_dir() for p in sorted(r.glob("utils/**/*.py"))]
    load_jit = [p for p in candidates if "\ndef load_jit(" in p.read_text()]
    loaders = [
        p
        for p in sorted(package.glob("**/dsv4/compress.py"))
        if "def _jit_compress_plan_module(" in p.read_text()
    ]
    kernels = [k for r in roots for k in r.glob("csrc/deepseek_v4/c_plan.cuh")]
    assert len(load_jit) == 1 and len(loaders) == 1 and len(kernels) == 1, (load_jit, loaders)
    return load_jit[0], loaders[0], kernels[0].parents[2]


def release_code(package: Path, load_jit: Path) -> str:
    """Lifted code of one tree: its load_jit module, arch.py (if any), dsv4/utils.py."""
    sources = [load_jit, load_jit.parent / "arch.py"]
    sources.append(next(package.glob("**/dsv4/utils.py")))
    lifted = [lift(p.read_text(), SGLANG_NAMES) for p in sources if p.is_file()]
    return "\n".join([FUTURE, *lifted])


def release_names(
    package: Path,
    capability: tuple[int, int],
    tvm_ffi_version: str,
    cache_dir: Path,
) -> dict[str, Any]:
    """What the release's own loader does for the compress-plan module in an empty cache:
    ``module``, ``call`` (load_inline's arguments), ``arch_flag``, and ``dir`` (0.5.14+, its
    own build_directory) or ``tvm_dir`` (0.5.12/0.5.13, tvm-ffi's default dir)."""
    load_jit, loader, kernel_root = release_files(package)
    spec: dict[str, Any] = {
        "kernel_root": str(kernel_root),
        "sglang_code": release_code(package, load_jit),
        "loader_code": FUTURE + "\n" + lift(loader.read_text(), LOADER_NAMES),
        "capability": list(capability),
        "tvm_ffi_version": tvm_ffi_version,
        "tvm_code": lift(tvm_ffi_extension_source(tvm_ffi_version), TVM_NAMES),
        "cache_dir": str(cache_dir),
    }
    res = subprocess.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps(spec), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))
