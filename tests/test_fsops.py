"""fsops' own reads, in-process: the streamed hash of a file that may be hostile, and the walk to
the kernel's folder that refuses a component turned into a link (the mutation selection's reach;
the folder-swap and hostile-file tests drive the same code through subprocesses)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import sha256_file
from sglang_dsv4_fix.fswrite import open_folder

SWAPPED = "a folder on the way to the kernel is (now) a symbolic link or not a folder; refusing to write through it"  # fmt: skip


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """A call still blocked after ``seconds`` fails the test instead of hanging it."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_sha256_file_hashes_every_chunk(tmp_path: Path) -> None:
    data = bytes(range(256)) * 12_289  # 3 MiB and 256 bytes: three full reads and a short one
    path = tmp_path / "c_plan.cuh"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_sha256_file_refuses_a_fifo_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "c_plan.cuh"
    os.mkfifo(fifo)
    with deadline(5), pytest.raises(OSError) as caught:
        sha256_file(fifo)
    e = caught.value
    assert (e.errno, e.strerror, e.filename) == (errno.EINVAL, "not a regular file", str(fifo))


def test_open_folder_opens_the_very_folder(tmp_path: Path) -> None:
    path = tmp_path.resolve() / "csrc"
    path.mkdir()
    folder = open_folder(path)
    try:
        st = path.stat()
        assert (folder.path, folder.identity()) == (path, (st.st_dev, st.st_ino))
    finally:
        os.close(folder.fd)


@pytest.mark.parametrize("kind", ["link", "file"])
def test_open_folder_refuses_a_component_that_is_not_a_folder(tmp_path: Path, kind: str) -> None:
    root = tmp_path.resolve()
    (root / "real" / "csrc").mkdir(parents=True)
    if kind == "link":
        (root / "pkg").symlink_to(root / "real")
    else:
        (root / "pkg").write_bytes(b"")
    path = root / "pkg" / "csrc"
    with pytest.raises(FatalError) as caught:
        open_folder(path)
    assert (str(caught.value), caught.value.code) == (f"{path}: {SWAPPED}", Exit.REFUSED)


def test_open_folder_names_a_missing_folder(tmp_path: Path) -> None:
    path = tmp_path.resolve() / "gone" / "csrc"
    with pytest.raises(FatalError) as caught:
        open_folder(path)
    assert (str(caught.value), caught.value.code) == (
        f"{path}: cannot open the kernel's folder (No such file or directory)",
        Exit.REFUSED,
    )
