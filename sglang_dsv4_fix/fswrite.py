"""Side effects on files: atomic replacement, folders held by descriptor, locking.

Writes beside the kernel go through a ``Folder``, a descriptor of the kernel's folder opened
without following a symbolic link anywhere on the way, so a folder swapped for a link mid-run
cannot send a temp file, a sidecar or a kernel outside the tree. Kept apart from the reads
(fsops.py), which every SGLang process imports at start through the plugin.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import LOCKED, TEMP_TAG, read_regular, replace_at


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data``: same-folder temp file, fsync, ``os.replace``, folder fsync.

    Readers see the old bytes or the new bytes, never a mix; the file mode is kept.
    """
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    import tempfile  # writers only: its import (random, shutil) costs a read-only verify ~6 ms

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    """Delete a file if present, then make the removal durable."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        fsync_dir(path.parent)


# ---------------------------------------------------------------- a folder held by descriptor


def is_our_temp(temp: str, name: str) -> bool:
    """``temp`` has the exact shape ``temp_name(name)`` gives (a user's ``.name.x.tmp`` has not)."""
    return (
        re.fullmatch(rf"\.{re.escape(name)}\.\d+\.[0-9a-f]{{16}}\.{re.escape(TEMP_TAG)}", temp)
        is not None
    )


class Folder:
    """A folder opened by descriptor; every operation names a plain entry inside it (``dir_fd``)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def stat(self, name: str) -> os.stat_result | None:
        """``lstat`` of the entry, None if absent."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def is_file(self, name: str) -> bool:
        st = self.stat(name)
        return st is not None and stat.S_ISREG(st.st_mode)

    def read(self, name: str, limit: int, what: str, code: int = Exit.REFUSED) -> bytes:
        return read_regular(self.path / name, limit, what, code, follow=False, dir_fd=self.fd)

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def write(
        self, name: str, data: bytes, mode: int, owner: tuple[int, int] | None, durable: bool = True
    ) -> None:
        """Atomically replace ``name`` with ``data`` (fsops.replace_at: temp file, fsync, rename,
        folder fsync); not ``durable``: no fsync."""
        replace_at(self.fd, name, data, mode, owner, durable)

    def unlink(self, name: str) -> None:
        """Delete the file ``name`` if present, durably."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        self.fsync()

    def fsync(self) -> None:
        os.fsync(self.fd)

    def identity(self) -> tuple[int, int]:
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino


def open_folder(path: Path) -> Folder:
    """Open ``path`` (absolute, symlinks already resolved by the caller) component by component
    with ``O_NOFOLLOW``: a component that became a symbolic link or stopped being a folder is
    refused, so the descriptor is the very folder at ``path``, not where a link points."""
    walk = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # needs search right only
    last = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # flock and fsync need it
    parts = path.parts[1:]
    fd = os.open("/", walk)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, last if i == len(parts) - 1 else walk, dir_fd=fd)
            except OSError as e:
                raise _refuse_folder(path, e) from e
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return Folder(fd, path)


def _refuse_folder(path: Path, e: OSError) -> FatalError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return FatalError(
            f"{path}: a folder on the way to the kernel is (now) a symbolic link or not a folder; "
            "refusing to write through it",
            Exit.REFUSED,
        )
    return FatalError(f"{path}: cannot open the kernel's folder ({e.strerror})", Exit.REFUSED)


@contextlib.contextmanager
def file_lock(folder: Path) -> Iterator[Folder]:
    """Exclusive advisory lock on the kernel's folder itself, held by descriptor.

    The folder is opened without following links (``open_folder``), locked, then walked to again:
    if the path no longer leads to the locked folder, it was swapped while we waited: refused.
    Locking the directory (not a lock file) creates nothing in the tree, and ``os.replace`` of
    the kernel inside it never swaps the locked inode from under a waiting process.
    """
    held_folder = open_folder(folder)
    try:
        fcntl.flock(held_folder.fd, fcntl.LOCK_EX)
        again = open_folder(folder)
        same = again.identity() == held_folder.identity()
        os.close(again.fd)
        if not same:
            raise FatalError(
                f"{folder}: the folder was replaced while waiting for the lock; refusing",
                Exit.REFUSED,
            )
        LOCKED[folder] = held_folder
        try:
            yield held_folder
        finally:
            LOCKED.pop(folder, None)
    finally:
        os.close(held_folder.fd)
