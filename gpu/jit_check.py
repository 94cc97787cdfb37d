"""GPU check (H200): after `apply` + `prewarm` on a 0.5.16 tree, SGLang's loader loads the
prewarmed no-init build without compiling; then one forced rebuild is timed.

Usage: python3 gpu/jit_check.py SITE_PACKAGES OUT_JSON [--rebuild]
First tries to import SGLang's real loader module (sglang.jit_kernel.dsv4.compress). If that
import fails on this box, it runs the release's own loader code lifted from the unpacked wheel
(load_jit, _jit_compress_plan_module, make_name, the source hash, build-dir naming, arch
detection with the real torch) and says so in the JSON. Nothing is re-implemented here.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

KEEP = {"dataclass", "contextmanager"}  # semantic decorators; cache_once etc. are dropped


def lift(source: str, skip: set[str]) -> str:
    body: list[ast.stmt] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            node.decorator_list = [
                d for d in node.decorator_list if isinstance(d, ast.Name) and d.id in KEEP
            ]
            body.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not {t.id for t in targets if isinstance(t, ast.Name)} & skip:
                body.append(node)
    return "from __future__ import annotations\n" + ast.unparse(
        ast.Module(body=body, type_ignores=[])
    )


def lifted_loader(package: Path) -> Any:
    """The 0.5.16 wheel's own `_jit_compress_plan_module`, with its module's globals."""
    import contextlib
    import dataclasses
    import hashlib
    import logging
    import pathlib
    import re
    import typing

    import torch

    ns: dict[str, Any] = {
        "torch": torch,
        "os": os,
        "re": re,
        "hashlib": hashlib,
        "pathlib": pathlib,
        "logging": logging,
        "logger": logging.getLogger("lifted"),
        "dataclass": dataclasses.dataclass,
        "contextmanager": contextlib.contextmanager,
        "List": typing.List,  # noqa: UP006
        "Tuple": typing.Tuple,  # noqa: UP006
        "Optional": typing.Optional,
        "Union": typing.Union,
        "TypeAlias": typing.TypeAlias,
        "Module": object,
        "REGISTERED_DEPENDENCIES": {},
        "KERNEL_PATH": (package / "jit_kernel").resolve(),
        # sglang.srt.utils.common.get_cuda_version: only read for 12.x GPUs, not on an H200
        "get_cuda_version": lambda: tuple(int(x) for x in torch.version.cuda.split(".")[:2]),
    }
    utils = package / "jit_kernel" / "utils"
    skip = {"KERNEL_PATH", "CPP_DTYPE_MAP", "CPP_TEMPLATE_TYPE", "F", "T", "logger"}
    for f in (
        utils / "common.py",
        utils / "arch.py",
        utils / "compile.py",
        package / "jit_kernel" / "dsv4" / "utils.py",
    ):
        exec(compile(lift(f.read_text(), skip), str(f), "exec"), ns)
    compress = (package / "jit_kernel" / "dsv4" / "compress.py").read_text()
    fn = next(
        n
        for n in ast.parse(compress).body
        if isinstance(n, ast.FunctionDef) and n.name == "_jit_compress_plan_module"
    )
    fn.decorator_list = []
    code = "from __future__ import annotations\n" + ast.unparse(
        ast.Module(body=[fn], type_ignores=[])
    )
    exec(compile(code, "compress.py", "exec"), ns)
    return ns["_jit_compress_plan_module"]


def real_loader() -> Any:
    from sglang.jit_kernel.dsv4 import compress

    return compress._jit_compress_plan_module


def snapshot(cache: Path) -> dict[str, Any]:
    out = {}
    for so in sorted(cache.glob("*/*.so")):
        st = so.stat()
        log = so.parent / ".ninja_log"
        out[str(so)] = {
            "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns,
            "ninja_log": log.read_text() if log.exists() else None,
        }
    return out


def main() -> int:
    site, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    package = site / "sglang"
    cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
    result: dict[str, Any] = {"cache": str(cache)}
    try:
        loader = real_loader()
        result["loader"] = "real: sglang.jit_kernel.dsv4.compress._jit_compress_plan_module"
    except Exception as e:  # report exactly why, then use the lifted real code
        result["real_import_error"] = f"{type(e).__name__}: {e}"
        result["real_import_trace"] = traceback.format_exc(limit=3)[-1500:]
        loader = lifted_loader(package)
        result["loader"] = "lifted from the 0.5.16 wheel (load_jit and helpers exec'd; real torch)"
    before = snapshot(cache)
    t0 = time.monotonic()
    module = loader()
    result["load_seconds"] = round(time.monotonic() - t0, 3)
    after = snapshot(cache)
    result["builds_before"] = before
    result["unchanged"] = before == after and bool(before)
    result["module"] = str(module)
    result["functions"] = [f for f in ("plan_prefill", "plan_decode") if hasattr(module, f)]
    out_path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "builds_before"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
