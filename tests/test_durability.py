"""Durability and write order, observed on the real calls (the writes themselves stay real).

A spy wraps the real ``os.fsync`` and ``os.replace``/``os.rename``: each call is recorded with
what the file system holds at that moment, then passed through. So removing the file's or the
folder's fsync from the atomic write, or replacing the kernel before the pending record is on
disk, fails here in milliseconds instead of only under the slow crash test.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import fswrite
from sglang_dsv4_fix.main import main

RECORD = ".c_plan.cuh.sglang-dsv4-fix.json"
BACKUP = ".c_plan.cuh.sglang-dsv4-fix.orig"


@dataclass(frozen=True)
class Fsync:
    is_dir: bool
    ident: tuple[int, int]  # (st_dev, st_ino) of what was synced
    data: bytes | None  # a regular file's bytes at that moment


@dataclass(frozen=True)
class Move:
    src: Path
    dst: Path
    data: bytes  # what lands at dst


def _in(name: Any, dir_fd: int | None) -> Path:
    """The path ``name`` stands for (relative to ``dir_fd`` when the call gave one)."""
    if dir_fd is None:
        return Path(name)
    return Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / name


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


class Spy:
    """Records every fsync and every rename/replace, with a hook run before each move lands."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[Fsync | Move] = []
        self.before_move: Callable[[Move], None] = lambda move: None
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            is_dir = stat.S_ISDIR(st.st_mode)
            data = None if is_dir else Path(f"/proc/self/fd/{fd}").read_bytes()
            self.events.append(Fsync(is_dir, _ident(st), data))
            real_fsync(fd)

        def mover(real: Callable[..., None]) -> Callable[..., None]:
            def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                where = _in(src, kwargs.get("src_dir_fd")), _in(dst, kwargs.get("dst_dir_fd"))
                event = Move(where[0], where[1], where[0].read_bytes())
                self.before_move(event)
                self.events.append(event)
                real(src, dst, *args, **kwargs)

            return move

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", mover(real_replace))
        monkeypatch.setattr(os, "rename", mover(real_rename))

    def moves_to(self, name: str) -> list[Move]:
        return [e for e in self.events if isinstance(e, Move) and e.dst.name == name]


# --------------------------------------------------------------------------- atomic write


@pytest.mark.parametrize("existing", [True, False])
def test_atomic_write_syncs_the_new_bytes_then_the_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, existing: bool
) -> None:
    target = tmp_path / "dir" / "file.txt"
    target.parent.mkdir()
    if existing:
        target.write_bytes(b"old bytes")
    spy = Spy(monkeypatch)
    fswrite.atomic_write(target, b"new bytes")
    assert target.read_bytes() == b"new bytes"
    folder = _ident(target.parent.stat())
    moves = [i for i, e in enumerate(spy.events) if isinstance(e, Move) and e.dst == target]
    assert len(moves) == 1, spy.events
    landed = moves[0]
    # the file: its full new bytes are synced before it is moved into place, under another name
    file_syncs = [
        i
        for i, e in enumerate(spy.events[:landed])
        if isinstance(e, Fsync) and not e.is_dir and e.data == b"new bytes"
    ]
    assert file_syncs, f"no fsync of the new bytes before the replace: {spy.events}"
    synced = spy.events[file_syncs[-1]]
    assert isinstance(synced, Fsync) and synced.ident == _ident(target.stat())
    # the folder: synced after the replace, so the new name itself is durable
    dir_syncs = [
        e
        for e in spy.events[landed + 1 :]
        if isinstance(e, Fsync) and e.is_dir and e.ident == folder
    ]
    assert dir_syncs, f"no fsync of {target.parent} after the replace: {spy.events}"


def test_removal_is_made_durable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    target.write_bytes(b"x")
    spy = Spy(monkeypatch)
    fswrite.remove(target)
    assert not target.exists()
    assert [e for e in spy.events if isinstance(e, Fsync)] == [
        Fsync(True, _ident(tmp_path.stat()), None)
    ]


# --------------------------------------------------------------------------- journal order


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_apply_journals_before_the_kernel_is_replaced(
    tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "repo")
    kernel = root / "python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    original = kernel.read_bytes()
    seen: list[dict[str, Any]] = []

    def at_kernel_replace(move: Move) -> None:
        if move.dst.name != kernel.name:
            return
        # what a kill right now would leave: the backup and a pending record naming both hashes
        assert (kernel.parent / BACKUP).read_bytes() == original
        record = json.loads((kernel.parent / RECORD).read_text())
        seen.append(record)
        assert record["state"] == "pending"
        assert (record["base_sha256"], record["result_sha256"]) == (
            _sha(original),
            _sha(move.data),
        )

    spy = Spy(monkeypatch)
    spy.before_move = at_kernel_replace
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == 0
    assert len(spy.moves_to(kernel.name)) == 1 and len(seen) == 1
    names = [e.dst.name for e in spy.events if isinstance(e, Move)]
    assert names == [BACKUP, RECORD, kernel.name, RECORD]
    final = json.loads((kernel.parent / RECORD).read_text())
    assert final == {**seen[0], "state": "applied"}
    assert _sha(kernel.read_bytes()) == final["result_sha256"]


def test_revert_restores_before_dropping_the_record(
    tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "repo")
    kernel = root / "python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    original = kernel.read_bytes()
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == 0
    seen: list[bool] = []

    def at_kernel_replace(move: Move) -> None:
        if move.dst.name == kernel.name:
            # a kill now must still find the record (and the backup) that says what to undo
            seen.append((kernel.parent / RECORD).is_file() and (kernel.parent / BACKUP).is_file())

    spy = Spy(monkeypatch)
    spy.before_move = at_kernel_replace
    assert main(["revert", "--tree", str(root), "--no-clear-cache"]) == 0
    assert seen == [True]
    assert kernel.read_bytes() == original
    assert not (kernel.parent / RECORD).exists() and not (kernel.parent / BACKUP).exists()


# --------------------------------------------------------------------------- base release


@pytest.mark.parametrize(
    ("version", "kernel_from", "expected"),
    [
        ("0.5.16", "0.5.16", "0.5.16"),  # one release has these bytes in this layout
        ("0.5.17", "0.5.17", "0.5.17"),  # same bytes as 0.5.16, but the only post-refactor one
        ("0.5.12.post1", "0.5.12.post1", "0.5.12.post1"),  # bytes shared with 0.5.12: the tree's
        ("0.5.14", "0.5.14", "0.5.14"),  # bytes shared with 0.5.13, 0.5.13.post1: the tree's
        ("0.5.15", "0.5.16", "0.5.16"),  # 0.5.16's kernel in a 0.5.15 tree: the bytes' release
    ],
)
def test_record_names_the_base_release(
    tree_factory: TreeFactory, tmp_path: Path, version: str, kernel_from: str, expected: str
) -> None:
    root = tree_factory.installed(version, tmp_path / "sp")
    kernel = next(root.glob("sglang/**/csrc/deepseek_v4/c_plan.cuh"))
    if kernel_from != version:
        donor = tree_factory.installed(kernel_from, tmp_path / "donor")
        kernel.write_bytes(next(donor.glob("sglang/**/csrc/deepseek_v4/c_plan.cuh")).read_bytes())
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == 0
    record = json.loads((kernel.parent / RECORD).read_text())
    assert (record["base_release"], record["method"]) == (expected, "manifest-patch")


def test_the_temp_file_sits_beside_the_target_under_a_hidden_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # same folder: os.replace is atomic only within one file system; the name is what recovery
    # looks for (.<name>.*.tmp) after a killed run
    target = tmp_path / "c_plan.cuh"
    seen: list[Path] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fswrite.atomic_write(target, b"x")
    (temp,) = seen
    assert temp.parent == tmp_path
    assert temp.name.startswith(".c_plan.cuh.") and temp.name.endswith(".tmp")
    assert temp.name != ".c_plan.cuh..tmp" and not temp.exists()


@pytest.mark.parametrize(("before", "after"), [(0o600, 0o600), (0o755, 0o755), (None, 0o644)])
def test_atomic_write_keeps_the_mode(tmp_path: Path, before: int | None, after: int) -> None:
    target = tmp_path / "f"
    if before is not None:
        target.write_bytes(b"old")
        target.chmod(before)
    fswrite.atomic_write(target, b"new")
    assert stat.S_IMODE(target.stat().st_mode) == after


@pytest.mark.parametrize("temp_gone", [False, True])
def test_a_failed_replace_leaves_no_temp_file_and_raises_its_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, temp_gone: bool
) -> None:
    target = tmp_path / "d" / "f"
    target.parent.mkdir()
    target.write_bytes(b"old")

    def replace(src: Any, dst: Any) -> None:
        if temp_gone:  # e.g. a concurrent recovery already dropped it: still the real error
            os.unlink(src)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="cross-device") as e:
        fswrite.atomic_write(target, b"new")
    assert e.type is OSError
    assert sorted(p.name for p in target.parent.iterdir()) == ["f"]
    assert target.read_bytes() == b"old"


def test_fsync_dir_opens_only_a_folder(tmp_path: Path) -> None:
    # O_DIRECTORY: a folder swapped for a file (or a FIFO, which would block a plain open) fails
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fswrite.fsync_dir(tmp_path / "file")


def test_removing_a_missing_file_is_a_no_op(tmp_path: Path) -> None:
    fswrite.remove(tmp_path / "gone")
    assert not (tmp_path / "gone").exists()
