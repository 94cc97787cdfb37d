"""Real c_plan.cuh texts read straight out of the cached release wheels."""

from __future__ import annotations

import functools
import zipfile

from trees import fetch_wheel

PATHS = (
    "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh",
    "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh",
)


@functools.cache
def kernel_text(version: str) -> str:
    with zipfile.ZipFile(fetch_wheel(version)) as wheel:
        names = set(wheel.namelist())
        path = next(p for p in PATHS if p in names)
        return wheel.read(path).decode("utf-8")
