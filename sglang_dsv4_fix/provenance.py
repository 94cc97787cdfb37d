"""The provenance record and the original's backup, kept beside the kernel so they travel with it.

A record is read as hostile input: a regular file of at most ``RECORD_LIMIT`` bytes, one flat JSON
object whose every field has its type, length and allowed values, and whose manifest-patch claims
agree with the release manifest. A record that fails is damaged: reported, never acted on.
Read here (a fixed tree's plugin start reads it); written only by transaction.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import RECORD_LIMIT, held, read_regular
from sglang_dsv4_fix.tree import backup_path as backup_path  # where our files sit: tree.py
from sglang_dsv4_fix.tree import record_path as record_path
from sglang_dsv4_fix.value import Value

STATES = ("pending", "applied")
VARIANTS = ("no-init", "barrier")  # kernel.FIXED, without importing the classifier here
METHODS = ("manifest-patch", "structural")
WRITERS = ("cli", "plugin")
DEFAULT_WRITER = "cli"  # what a record written before ``written_by`` existed was written by
_HEX = frozenset("0123456789abcdef")


class DamagedRecord(FatalError):
    """The record beside the kernel fails validation; nothing may be decided from it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"{path}: damaged provenance record ({why}); not acting on it", Exit.UNKNOWN
        )
        self.why = why


class Provenance(Value):
    __slots__ = (
        "backup",
        "base_release",
        "base_sha256",
        "kernel",
        "method",
        "previous_method",
        "previous_sha256",
        "previous_variant",
        "result_sha256",
        "state",
        "time",
        "tool_version",
        "variant",
        "written_by",
    )  # fmt: skip
    # The optional fields and the value each takes when a record lacks it (records written before
    # the field existed): ``__init__``'s keyword defaults and the reader (``_fields``) both.
    OPTIONAL: ClassVar[Mapping[str, str | None]] = MappingProxyType(
        {
            "previous_variant": None,
            "previous_sha256": None,
            "previous_method": None,
            "written_by": DEFAULT_WRITER,
        }
    )

    def __init__(
        self,
        state: str,
        variant: str,
        method: str,
        base_release: str | None,
        base_sha256: str,
        result_sha256: str,
        tool_version: str,
        time: str,
        kernel: str,
        backup: str,
        *,  # the optional fields, defaults as in ``OPTIONAL``
        previous_variant: str | None = None,
        previous_sha256: str | None = None,
        previous_method: str | None = None,
        written_by: str = DEFAULT_WRITER,
    ) -> None:
        self.state = state  # "pending" while the kernel is being replaced, then "applied"
        self.variant = variant
        self.method = method  # "manifest-patch" (known release) or "structural" (unknown base)
        self.base_release, self.base_sha256, self.result_sha256 = (
            base_release,
            base_sha256,
            result_sha256,
        )
        self.tool_version = tool_version
        self.time = time  # UTC, ISO 8601
        self.kernel = kernel  # the kernel's file name
        self.backup = backup  # the backup's file name, beside the kernel
        # While a variant switch is pending: the record it replaces (variant, bytes, method), so a
        # run killed before the kernel was replaced rolls back to it. None otherwise.
        self.previous_variant, self.previous_sha256 = previous_variant, previous_sha256
        self.previous_method = previous_method
        self.written_by = (
            written_by  # or "plugin" (SGLANG_DSV4_FIX_MODE=heal); absent in old records
        )


def read(kernel: Path) -> Provenance | None:
    """The validated record beside ``kernel``, None if there is none; ``DamagedRecord`` if bad."""
    path = record_path(kernel)
    folder = held(kernel.parent)
    try:
        if folder is not None:
            if folder.stat(path.name) is None:
                return None
            data = folder.read(path.name, RECORD_LIMIT, "provenance record", Exit.UNKNOWN)
        else:
            if not path.exists() and not path.is_symlink():
                return None
            data = read_regular(path, RECORD_LIMIT, "provenance record", follow=False)
    except FatalError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None  # removed between the look and the open (a revert that just finished)
        raise DamagedRecord(path, str(e).removeprefix(f"{path}: ")) from e
    return parse(path, data, kernel)


def parse(path: Path, data: bytes, kernel: Path) -> Provenance:
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        raise DamagedRecord(path, f"not JSON: {type(e).__name__}") from e
    if not isinstance(raw, dict):
        raise DamagedRecord(path, f"not a JSON object but {type(raw).__name__}")
    record = _fields(path, raw)
    _check(path, record, kernel)
    return record


def _fields(path: Path, raw: dict[str, Any]) -> Provenance:
    nested = [k for k, v in raw.items() if isinstance(v, (dict, list))]
    if nested:
        raise DamagedRecord(path, f"nested value in {_show(nested[0])}")
    optional = Provenance.OPTIONAL
    missing = [n for n in Provenance.__slots__ if n not in raw and n not in optional]
    if missing:
        raise DamagedRecord(path, f"missing {', '.join(missing)}")
    values: dict[str, Any] = {n: raw.get(n, optional.get(n)) for n in Provenance.__slots__}
    return Provenance(**values)  # checked next


def _check(path: Path, r: Provenance, kernel: Path) -> None:
    problems = [
        _one_of("state", r.state, STATES),
        _one_of("variant", r.variant, VARIANTS),
        _one_of("method", r.method, METHODS),
        _sha("base_sha256", r.base_sha256),
        _sha("result_sha256", r.result_sha256),
        _short("tool_version", r.tool_version),
        _short("time", r.time),
        None if r.base_release is None else _short("base_release", r.base_release),
        _equal("kernel", r.kernel, kernel.name),
        _equal("backup", r.backup, backup_path(kernel).name),
        _one_of("written_by", r.written_by, WRITERS),
        *_previous(r),
    ]
    found = next((p for p in problems if p), None) or _manifest_claim(r)
    if found:
        raise DamagedRecord(path, found)


def _previous(r: Provenance) -> list[str | None]:
    values = (r.previous_variant, r.previous_sha256, r.previous_method)
    if all(v is None for v in values):
        return []
    return [
        _one_of("previous_variant", r.previous_variant, VARIANTS),
        _sha("previous_sha256", r.previous_sha256),
        _one_of("previous_method", r.previous_method, METHODS),
        None if r.state == "pending" else "previous_* fields on an applied record",
    ]


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> str | None:
    return None if value in allowed else f"{name} {_show(value)} is not one of {', '.join(allowed)}"


def _sha(name: str, value: object) -> str | None:
    ok = isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)
    return None if ok else f"{name} {_show(value)} is not 64 lowercase hex digits"


def _short(name: str, value: object) -> str | None:
    # versions, times: printable ASCII (0x20-0x7e), one line, at most 64 characters
    ok = isinstance(value, str) and 0 < len(value) <= 64 and value.isascii() and value.isprintable()
    return None if ok else f"{name} {_show(value)} is not a short printable string"


def _equal(name: str, value: object, expected: str) -> str | None:
    return None if value == expected else f"{name} {_show(value)} is not {expected!r}"


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _manifest_claim(r: Provenance) -> str | None:
    """A manifest-patch record must name bytes the manifest knows: the base release's original
    and its fix. Otherwise a replaced backup plus an edited base_sha256 would pass for ours."""
    if r.method != "manifest-patch":
        return None
    from sglang_dsv4_fix import manifest

    m = manifest.load()
    known = [
        rel
        for rel in m.releases.values()
        if rel.sha256 == r.base_sha256
        and r.variant in rel.results
        and rel.results[r.variant].sha256 == r.result_sha256
    ]
    if not known:
        return (
            f"manifest-patch, but no release's original {r.base_sha256[:16]}… has the "
            f"{r.variant} fix {r.result_sha256[:16]}…"
        )
    if r.base_release is not None and r.base_release not in {rel.version for rel in known}:
        return f"base_release {r.base_release} does not have the original {r.base_sha256[:16]}…"
    return None
