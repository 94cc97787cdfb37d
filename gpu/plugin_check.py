"""GPU check (H200): SGLang's real prefill planner, called through SGLang, triggers the plugin's
JIT-load report naming the build it loaded and the variant it was built from.

Usage (PYTHONPATH holds this package installed with its entry point, an unpacked SGLang 0.5.16
or 0.5.17 and apache-tvm-ffi): python3 gpu/plugin_check.py OUT_JSON [LOADER_MODULE]
Runs SGLang's own load_plugins() and configure_logger(), imports SGLang's loader module
(default sglang.jit_kernel.dsv4.compress, pre-refactor; 0.5.17:
sglang.kernels.ops.attention.dsv4.compress; if the package's further imports fail on this box,
the loader module Python already executed is used and the JSON says why), then calls
CompressorPrefillPlan.generate on GPU tensors, which calls _jit_compress_plan_module().
With PLUGIN_CHECK_BEFORE_LOAD=SCRIPT, ``bash SCRIPT`` runs after the start line and before the
planner call (what changes between a process's start and its first planner load).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import types
from typing import Any


def main(out: str, loader: str = "sglang.jit_kernel.dsv4.compress") -> int:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import sglang.srt.utils as utils

    utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP0")
    result: dict[str, Any] = {}
    try:
        importlib.import_module(loader)
        result["loader_import"] = f"real import of {loader}: ok"
    except Exception as e:
        result["loader_import"] = f"package import failed: {type(e).__name__}: {e}"
    compress = sys.modules[loader]
    result["hooked"] = getattr(compress._jit_compress_plan_module, "__wrapped__", None) is not None
    before = os.environ.get("PLUGIN_CHECK_BEFORE_LOAD")
    if before:
        subprocess.run(("bash", before), check=True)
    try:
        result.update(plan(compress))
    except Exception as e:  # enforce refusing the build lands here
        result["plan_error"] = f"{type(e).__name__}: {e}"
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0


def plan(compress: Any) -> dict[str, Any]:
    import torch

    ext = [4] * 31 + [3]  # a ragged batch in one warp, as in FACTS.md's shapes
    b, t = len(ext), 64
    cuda = torch.device("cuda")
    i64 = dict(dtype=torch.int64, device=cuda)
    lens = torch.tensor(ext, **i64)
    start = time.monotonic()
    out = compress.CompressorPrefillPlan.generate(
        128,
        torch.arange(b, **i64),
        lens,
        lens.clone(),
        torch.arange(b * t, dtype=torch.int32, device=cuda).reshape(b, t),
        torch.arange(b * t * 4, **i64),
        256,
        128,
        sum(ext),
    )
    torch.cuda.synchronize()
    return {"generate_s": round(time.monotonic() - start, 2), "plan": type(out).__name__}


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
