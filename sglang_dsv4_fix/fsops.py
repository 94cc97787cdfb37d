"""Reading files we did not create: hashing and bounded reads; and the one write on the plugin's
start path, an entry replaced atomically inside a folder held by descriptor (:func:`replace_at`).

Every file we did not create is treated as hostile: reads never block (``O_NONBLOCK``, regular
files only) and are capped. This half is on the plugin's start path (every SGLang process
imports it, and a first process stores its start memo through ``replace_at``); the rest of the
write half (folders opened and locked, durable writes by path) is fswrite.py's, which is not.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_dsv4_fix.errors import Exit, FatalError

if TYPE_CHECKING:
    from sglang_dsv4_fix.fswrite import Folder

TEMP_TAG = "sglang-dsv4-fix.tmp"  # the last part of every temp file name we create
KERNEL_LIMIT = 4 * 1024 * 1024  # the real c_plan.cuh is 20-30 KB
RECORD_LIMIT = 64 * 1024  # a provenance record is under 1 KB
_NOT_REGULAR = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 of a regular file, streamed; never blocks (a FIFO or device raises ``OSError``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def read_regular(
    path: Path | str,
    limit: int,
    what: str,
    code: int = Exit.NOT_FOUND,
    *,
    follow: bool = True,
    dir_fd: int | None = None,
    head: bool = False,
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, never blocking.

    A FIFO, device, socket or folder, an unreadable path and a file over ``limit`` raise a
    ``FatalError`` with ``code`` and one line naming ``path`` and ``what`` it should have been.
    With ``head``, a longer file is not an error: its first ``limit`` bytes are returned.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    name = Path(path).name if dir_fd is not None else path
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        reason = "a symbolic link" if e.errno == errno.ELOOP and not follow else e.strerror
        raise FatalError(f"{path}: cannot read the {what} ({reason})", code) from e
    try:
        return _read_fd(fd, path, limit, what, code, head)
    finally:
        os.close(fd)


def _read_fd(fd: int, path: Path | str, limit: int, what: str, code: int, head: bool) -> bytes:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):  # as open(2) of a folder for writing would say
        raise FatalError(f"{path}: cannot read the {what} (Is a directory)", code)
    if not stat.S_ISREG(st.st_mode):
        kind = _NOT_REGULAR.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise FatalError(f"{path}: cannot read the {what} (not a regular file: {kind})", code)
    if st.st_size > limit and not head:
        raise FatalError(_too_big(path, what, st.st_size, limit), code)
    chunks, total, want = [], 0, limit if head else limit + 1  # one more: did it grow?
    try:
        while chunk := os.read(fd, min(1 << 20, want - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while we read
                raise FatalError(_too_big(path, what, total, limit), code)
    except OSError as e:
        raise FatalError(f"{path}: cannot read the {what} ({e.strerror})", code) from e
    return b"".join(chunks)


def _too_big(path: Path | str, what: str, size: int, limit: int) -> str:
    return f"{path}: the {what} is {size} bytes, over the {limit}-byte limit; not reading it"


def temp_name(name: str) -> str:
    """A temp file name for ``name`` that no one else picks: pid and 64 random bits."""
    return f".{name}.{os.getpid()}.{os.urandom(8).hex()}.{TEMP_TAG}"


def replace_at(
    dir_fd: int,
    name: str,
    data: bytes,
    mode: int,
    owner: tuple[int, int] | None = None,
    durable: bool = True,
) -> None:
    """Atomically replace the entry ``name`` of the folder ``dir_fd`` with ``data``: a new temp
    file (never a link followed), fsync, rename over ``name``, folder fsync. Not ``durable``: no
    fsync (a cache entry that a crash may lose, never one half-written). ``owner``: as root, the
    file's (uid, gid)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = temp_name(name)
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            break
        except FileExistsError:  # 64 random bits taken: pick again
            continue
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None and os.geteuid() == 0:
                os.fchown(fd, *owner)  # root keeps a user's kernel the user's
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if durable:
        os.fsync(dir_fd)


# the kernel folders this process holds locked: fswrite.file_lock fills it, readers under the
# lock (provenance) go through the held descriptor
LOCKED: dict[Path, Folder] = {}


def held(folder: Path) -> Folder | None:
    """The ``Folder`` this process holds the lock of, if any (see ``fswrite.file_lock``)."""
    return LOCKED.get(folder)
