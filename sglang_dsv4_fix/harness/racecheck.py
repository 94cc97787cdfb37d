"""Re-run a variant under ``compute-sanitizer --tool racecheck``, limited to kernel0.

The init/per-warp-write race of sgl-project/sglang#32467 is a shared-memory WAW hazard, which
racecheck reports deterministically (FACTS.md: hazards on the original after 2 calls, 0 on both
fixes), whether or not a bad plan happens to show on this GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sglang_dsv4_fix
from sglang_dsv4_fix.errors import Exit, FatalError

KERNEL_FILTER = "kns=plan_compress_prefill_kernel0"
_SUMMARY = re.compile(
    r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"
)
# compute-sanitizer 2025: "Race reported between Write access at <pc>\n=== and Write access at <pc>";
# older ones: "Potential WAW hazard detected at __shared__ ...". Kinds keep the access pair only.
_RACE = re.compile(r"Race reported between (\w+) access at [^\n]*\n?[=\s]*and (\w+) access")
_LEGACY = re.compile(r"Potential (\w+) hazard detected at (__\w+__)")


@dataclass
class RacecheckResult:
    release: str
    variant: str
    shape: str
    calls: int
    hazards: int
    errors: int
    warnings: int
    kinds: dict[str, int]  # hazard line (without addresses) -> count
    command: str
    excerpt: list[str]  # the first hazard report lines, as racecheck printed them
    arch: str = ""  # the build target (jitcache.Arch.target)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_sanitizer() -> Path:
    found = shutil.which("compute-sanitizer")
    candidates = [Path(found)] if found else []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates.append(Path(home) / "bin" / "compute-sanitizer")
    for path in candidates:
        if path.is_file():
            return path
    raise FatalError(
        "compute-sanitizer not found (it ships with the CUDA toolkit: put its bin/ on PATH)",
        Exit.ENVIRONMENT,
    )


def parse(output: str) -> tuple[int, int, int, dict[str, int]]:
    """(hazards, errors, warnings, kinds) from racecheck's output; ValueError without a summary."""
    m = _SUMMARY.search(output)
    if not m:
        raise ValueError("no RACECHECK SUMMARY line")
    kinds: dict[str, int] = {}
    found = [f"{a}/{b} race" for a, b in _RACE.findall(output)]
    found += [f"{kind} hazard at {space}" for kind, space in _LEGACY.findall(output)]
    for kind in found:
        kinds[kind] = kinds.get(kind, 0) + 1
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), kinds


def command(sanitizer: Path, so: Path, spec: str, ratio: int, calls: int) -> list[str]:
    worker = [
        sys.executable,
        "-m",
        "sglang_dsv4_fix.harness.worker",
        str(so),
        spec,
        str(ratio),
        str(calls),
    ]
    return [str(sanitizer), "--tool", "racecheck", "--kernel-name", KERNEL_FILTER, *worker]


def run(
    sanitizer: Path, so: Path, release: str, variant: str, spec: str, ratio: int, calls: int,
    arch: str = "",
) -> RacecheckResult:  # fmt: skip
    cmd = command(sanitizer, so, spec, ratio, calls)
    env = dict(os.environ)
    package_parent = str(Path(sglang_dsv4_fix.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    output = proc.stdout + proc.stderr
    try:
        hazards, errors, warnings, kinds = parse(output)
    except ValueError:
        tail = "\n".join(output.splitlines()[-15:])
        raise FatalError(
            f"racecheck of {release}/{variant} gave no summary:\n{tail}", Exit.ENVIRONMENT
        ) from None
    if proc.returncode != 0 and "WORKER OK" not in output:
        tail = "\n".join(output.splitlines()[-15:])
        raise FatalError(f"racecheck worker for {release}/{variant} failed:\n{tail}", Exit.INTERNAL)
    shown = " ".join(c if " " not in c else repr(c) for c in cmd)
    excerpt = [line for line in output.splitlines() if "=====" in line][:12]
    return RacecheckResult(
        release,
        variant,
        f"c{ratio} [{spec}]",
        calls,
        hazards,
        errors,
        warnings,
        kinds,
        shown,
        excerpt,
        arch,
    )
