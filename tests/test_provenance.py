"""The provenance record as hostile input, in this process: every way a record beside a real
kernel can be wrong is damaged, with the one reason the operator reads; a good record reads back
as written; discarding takes the record and the backup (and nothing else).

The CLI tests (test_hostile_files.py) show the same through ``python -m sglang_dsv4_fix``; these
reach the validation in-process, where mutation testing can see them.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest, provenance, transaction
from sglang_dsv4_fix.fswrite import file_lock
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.provenance import DamagedRecord, Provenance
from sglang_dsv4_fix.tree import find_tree

SHA_A = "a" * 64
LONG = "x" * 41  # shown cut to 37 characters and "..."


@pytest.fixture
def kernel(tree_factory: TreeFactory, tmp_path: Path) -> Path:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == 0
    path = find_tree(root).kernel_path
    assert path is not None
    return path


def _written(kernel: Path) -> dict[str, object]:
    raw: dict[str, object] = json.loads(provenance.record_path(kernel).read_text())
    return raw


def _damage(kernel: Path, raw: dict[str, object]) -> str:
    provenance.record_path(kernel).write_text(json.dumps(raw))
    with pytest.raises(DamagedRecord) as caught:
        provenance.read(kernel)
    assert str(caught.value) == (
        f"{provenance.record_path(kernel)}: damaged provenance record ({caught.value.why}); "
        "not acting on it"
    )
    return caught.value.why


def test_a_written_record_reads_back(kernel: Path) -> None:
    fixes = manifest.load().releases["0.5.16"]
    record = provenance.read(kernel)
    assert record is not None
    assert record._replace(time="t", tool_version="v") == Provenance(
        "applied", "no-init", "manifest-patch", "0.5.16", fixes.sha256,
        fixes.results["no-init"].sha256, "v", "t", "c_plan.cuh",
        ".c_plan.cuh.sglang-dsv4-fix.orig", written_by="cli",
    )  # fmt: skip


def test_an_old_record_without_the_optional_fields_reads(kernel: Path) -> None:
    raw = _written(kernel)
    for name in ("previous_variant", "previous_sha256", "previous_method", "written_by"):
        raw.pop(name, None)
    provenance.record_path(kernel).write_text(json.dumps(raw))
    record = provenance.read(kernel)
    assert record is not None and record.written_by == "cli"
    assert (record.previous_variant, record.previous_sha256, record.previous_method) == (None,) * 3


def test_the_optional_fields_are_the_keyword_only_ones_with_their_defaults() -> None:
    # the reader takes OPTIONAL's values for a record that lacks them; the constructor its own
    # defaults: one list, or an old record would read differently from a new one made without them
    keyword_only = {
        p.name: p.default
        for p in inspect.signature(Provenance.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert dict(Provenance.OPTIONAL) == keyword_only == {
        "previous_variant": None, "previous_sha256": None, "previous_method": None,
        "written_by": "cli",
    }  # fmt: skip


# Each case: the change to a good record, and the reason given.
DAMAGE = [
    ({"state": "done"}, "state 'done' is not one of pending, applied"),
    ({"variant": "racy-init"}, "variant 'racy-init' is not one of no-init, barrier"),
    ({"method": "magic"}, "method 'magic' is not one of manifest-patch, structural"),
    ({"base_sha256": SHA_A.upper()}, f"base_sha256 '{SHA_A.upper()[:36]}... is not 64 lowercase hex digits"),
    ({"result_sha256": 123}, "result_sha256 123 is not 64 lowercase hex digits"),
    ({"result_sha256": SHA_A[:63]}, f"result_sha256 '{SHA_A[:36]}... is not 64 lowercase hex digits"),
    ({"tool_version": ""}, "tool_version '' is not a short printable string"),
    ({"tool_version": "1\n2"}, "tool_version '1\\n2' is not a short printable string"),
    ({"time": "é"}, "time 'é' is not a short printable string"),
    ({"time": "x" * 65}, f"time '{'x' * 36}... is not a short printable string"),
    ({"base_release": 16}, "base_release 16 is not a short printable string"),
    ({"kernel": "other.cuh"}, "kernel 'other.cuh' is not 'c_plan.cuh'"),
    ({"backup": "/etc/passwd"}, "backup '/etc/passwd' is not '.c_plan.cuh.sglang-dsv4-fix.orig'"),
    ({"written_by": "someone"}, "written_by 'someone' is not one of cli, plugin"),
    ({"previous_variant": "barrier"}, "previous_sha256 None is not 64 lowercase hex digits"),
    ({"previous_variant": "barrier", "previous_sha256": SHA_A, "previous_method": "structural"},
     "previous_* fields on an applied record"),
    ({"previous_method": "manifest-patch", "previous_variant": "x", "previous_sha256": SHA_A,
      "state": "pending"}, "previous_variant 'x' is not one of no-init, barrier"),
    ({"note": {"a": 1}}, "nested value in 'note'"),
    ({"kernel": ["c_plan.cuh"]}, "nested value in 'kernel'"),
    ({"base_sha256": SHA_A}, f"manifest-patch, but no release's original {SHA_A[:16]}… has the "
     "no-init fix e5fc32a523b4bbc2…"),
    ({"base_release": "0.5.15"}, "base_release 0.5.15 does not have the original 6fa3a2a0cef7a4d7…"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "why"), DAMAGE, ids=[w[:40] for _, w in DAMAGE])
def test_a_wrong_field_is_damage_with_its_reason(
    kernel: Path, change: dict[str, object], why: str
) -> None:
    assert _damage(kernel, {**_written(kernel), **change}) == why


@pytest.mark.parametrize("name", ["state", "base_sha256", "kernel", "backup", "time"])
def test_a_missing_field_is_damage(kernel: Path, name: str) -> None:
    raw = _written(kernel)
    del raw[name]
    assert _damage(kernel, raw) == f"missing {name}"


def test_every_missing_field_is_named(kernel: Path) -> None:
    assert _damage(kernel, {"state": "applied"}) == (
        "missing backup, base_release, base_sha256, kernel, method, result_sha256, time, "
        "tool_version, variant"
    )


def test_a_value_shown_is_cut_after_40_characters(kernel: Path) -> None:
    raw = _written(kernel)
    forty = "y" * 38  # repr adds two quotes: 40 characters, shown whole
    assert (
        _damage(kernel, {**raw, "state": forty})
        == f"state '{forty}' is not one of pending, applied"
    )
    assert _damage(kernel, {**raw, "state": LONG}) == (
        f"state '{LONG[:36]}... is not one of pending, applied"
    )


@pytest.mark.parametrize(
    ("data", "why"),
    [(b"{", "not JSON: JSONDecodeError"), (b"\xff", "not JSON: UnicodeDecodeError"),
     (b"[1]", "not a JSON object but list"), (b"null", "not a JSON object but NoneType")],
)  # fmt: skip
def test_not_a_json_object_is_damage(kernel: Path, data: bytes, why: str) -> None:
    provenance.record_path(kernel).write_bytes(data)
    with pytest.raises(DamagedRecord) as caught:
        provenance.read(kernel)
    assert caught.value.why == why


def test_no_record_is_none(kernel: Path) -> None:
    provenance.record_path(kernel).unlink()
    assert provenance.read(kernel) is None
    with file_lock(kernel.parent):  # the same answer through the held folder
        assert provenance.read(kernel) is None


@pytest.mark.parametrize("held", [False, True])
def test_discard_takes_the_record_and_the_backup_only(kernel: Path, held: bool) -> None:
    before = sorted(p.name for p in kernel.parent.iterdir())
    assert {provenance.record_path(kernel).name, provenance.backup_path(kernel).name} <= set(before)
    if held:
        with file_lock(kernel.parent):
            transaction.discard_record(kernel)
    else:
        transaction.discard_record(kernel)
    after = sorted(p.name for p in kernel.parent.iterdir() if not p.name.endswith(".lock"))
    gone = {provenance.record_path(kernel).name, provenance.backup_path(kernel).name}
    assert after == sorted(set(before) - gone)


def test_discard_under_the_lock_takes_them_from_the_locked_folder(kernel: Path) -> None:
    # the folder renamed and another put at its path while the lock is held: the record and the
    # backup go from the folder the lock holds (by descriptor), the new folder's are left
    names = (provenance.record_path(kernel).name, provenance.backup_path(kernel).name)
    moved = kernel.parent.with_name("moved")
    with file_lock(kernel.parent):
        kernel.parent.rename(moved)
        kernel.parent.mkdir()
        for name in names:
            (kernel.parent / name).write_bytes(b"not ours")
        transaction.discard_record(kernel)
    assert not any((moved / name).exists() for name in names)
    assert all((kernel.parent / name).read_bytes() == b"not ours" for name in names)
