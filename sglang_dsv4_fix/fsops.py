"""The one place for side effects on files: hashing, atomic replacement, locking."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


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


@contextlib.contextmanager
def file_lock(folder: Path) -> Iterator[None]:
    """Exclusive advisory lock on the kernel's folder itself.

    Locking the directory (not a lock file) creates nothing in the tree, and ``os.replace`` of the
    kernel inside it never swaps the locked inode from under a waiting process.
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
