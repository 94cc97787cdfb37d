"""The provenance record and the original's backup, kept beside the kernel so they travel with it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import atomic_write, remove

TAG = "sglang-dsv4-fix"


@dataclass(frozen=True)
class Provenance:
    state: str  # "pending" while the kernel is being replaced, then "applied"
    variant: str
    method: str  # "manifest-patch" (known release) or "structural" (unknown base)
    base_release: str | None
    base_sha256: str
    result_sha256: str
    tool_version: str
    time: str  # UTC, ISO 8601
    kernel: str  # the kernel's file name
    backup: str  # the backup's file name, beside the kernel


def record_path(kernel: Path) -> Path:
    return kernel.with_name(f".{kernel.name}.{TAG}.json")


def backup_path(kernel: Path) -> Path:
    return kernel.with_name(f".{kernel.name}.{TAG}.orig")


def read(kernel: Path) -> Provenance | None:
    path = record_path(kernel)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:  # none, or a revert outside our lock just dropped it
        return None
    except OSError as e:
        raise FatalError(f"{path}: unreadable provenance record ({e})", Exit.UNKNOWN) from e
    try:
        raw = json.loads(text)
        return Provenance(**{k: raw[k] for k in Provenance.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FatalError(f"{path}: unreadable provenance record ({e})", Exit.UNKNOWN) from e


def write(kernel: Path, record: Provenance) -> None:
    data = json.dumps(asdict(record), indent=2, sort_keys=True) + "\n"
    atomic_write(record_path(kernel), data.encode("utf-8"), mode=0o644)


def discard(kernel: Path) -> None:
    remove(record_path(kernel))
    remove(backup_path(kernel))
