"""What the plugin writes down: one JSON-lines record per event (start, jit-load, refused).

Imported only by a process that writes one (``SGLANG_DSV4_FIX_REPORT`` set, a refusal, a JIT
load): the start path every SGLang process pays stays without it (docs/plugin.md, "Cost").
``sglang-dsv4-fix report`` reads these records (docs/plugin.md, "The report file").
"""

from __future__ import annotations

import json
import os
import stat
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang_dsv4_fix.plugin import Status, _Process

REPORT_ENV = "SGLANG_DSV4_FIX_REPORT"
SCHEMA = 1


def action(s: Status) -> str:
    """What this process did about its tree, in the report record and on /metrics."""
    return "healed" if s.healed else "warned" if s.problem else "ok"


def start_record(p: _Process) -> dict[str, Any]:
    s = p.status
    return {
        "schema": SCHEMA,
        "event": "start",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(p.started)),
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "process": p.role,
        "rank": p.rank,
        "gpu": p.gpu,
        "mode": p.mode,
        "action": action(s),
        "healed": s.healed is not None,
        "tree": s.package_dir,
        "release": s.release,
        "layout": s.layout,
        "kernel": s.kernel,
        "variant": s.variant,
        "sha256": s.sha256,
        "preconditions": s.preconditions,
        "patched_by": s.patched_by,
        "state": s.state,
        "headline": s.headline,
        "exit": s.exit_code,
        "problem": s.problem,
        "fix": s.fix,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def write_report(record: dict[str, Any]) -> None:
    """One JSON line, one ``write`` on an O_APPEND descriptor: records from many processes
    never interleave (a single append write is atomic for regular files on local filesystems).

    Only a regular file is written: the open never blocks (O_NONBLOCK: a FIFO without a reader
    fails at once, one with a reader is refused, as is a device). A short write is cut back off,
    so the file holds whole records or nothing of this one (sgl-project/sglang issue 13 here)."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file (a FIFO or a device?); nothing written")
        _append_whole(fd, path, data)
    finally:
        os.close(fd)


def _append_whole(fd: int, path: str, data: bytes) -> None:
    written = os.write(fd, data)
    if written != len(data):  # disk full: drop the torn tail we just appended
        end = os.lseek(fd, 0, os.SEEK_CUR)
        os.ftruncate(fd, end - written)
        raise OSError(f"short write to {path} ({written} of {len(data)} bytes); record dropped")
