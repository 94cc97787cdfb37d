"""GPU regression harness for sgl-project/sglang#32467 (``sglang-dsv4-fix repro``).

Builds the tree's own ``c_plan.cuh`` in three variants (original, barrier, no-init) in private build
folders, runs the real prefill planner on GPU-resident inputs and checks every plan. Only the
modules that need them import torch or tvm_ffi, and only when called: ``verify``/``status`` never do.
"""
