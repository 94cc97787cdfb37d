"""``python -m sglang_dsv4_fix.harness.worker SO SHAPE RATIO CALLS``: the process racecheck wraps.

Loads an already-built variant and calls its real plan_prefill on GPU inputs CALLS times.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sglang_dsv4_fix.harness import gpu, runner, shapes


def main(argv: list[str]) -> int:
    so, spec, ratio, calls = argv
    module = gpu.load(Path(so))
    shape = shapes.parse(spec, int(ratio))
    result = runner.run_shape(module, shape, int(calls), "-", "-")
    print(f"WORKER OK bad={result.bad}/{result.calls}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
