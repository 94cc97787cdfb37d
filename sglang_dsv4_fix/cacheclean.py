"""Removing JIT builds from a TVM-FFI cache: only tvm-ffi builds, never a link's target, kill-safe.

The writer half of the cache code (jitcache.py names and inventories, read-only). A folder is
cleared only when it is a TVM-FFI cache by positive evidence (an entry that is a tvm-ffi build
by its name and its files, or our own leftovers), and only entries that pass the same test go.

A removal, step by step (a loader racing us never crashes; a SIGKILL at any step is finished by
the next run, see :func:`finish_pending`):
1. take tvm-ffi's own lock on ``<build>/lock`` (non-blocking: a build being compiled is left);
2. rename the build aside to ``.sglang-dsv4-fix-trash-<name>-<8 hex>`` (one atomic step);
3. make an empty placeholder folder at the old name, then release the lock;
4. after ``PLACEHOLDER_SECONDS`` remove the placeholder if it is still empty: a tvm-ffi loader
   that was waiting on the lock polls ``open(<build>/lock, O_CREAT)`` every 0.1 s and would poll
   forever if the folder had vanished; the placeholder lets it build there instead;
5. delete the renamed copy file by file (only the files tvm-ffi writes), then the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sglang_dsv4_fix import jitcache, jitroot
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fswrite import fsync_dir
from sglang_dsv4_fix.tree import Tree

TRASH = ".sglang-dsv4-fix-trash-"  # renamed-aside builds awaiting deletion
_TRASH = re.compile(rf"^{re.escape(TRASH)}(?P<name>.+)-[0-9a-f]{{8}}$")
PLACEHOLDER_SECONDS = 0.5  # > tvm-ffi FileLock's 0.1 s poll interval
ROOT_LOCK_SECONDS = 10.0  # how long to wait for another clear-cache on the same folder
EMPTY_VAR = (
    "TVM_FFI_CACHE_DIR is set but empty: tvm-ffi and SGLang then build into each process's "
    "current folder, so there is no cache folder to clear; name it with --cache-dir"
)

Outcome = Literal["removed", "would remove", "busy", "gone", "left"]


@dataclass(frozen=True)
class Removal:
    path: Path
    outcome: Outcome
    detail: str = ""

    @property
    def refused(self) -> bool:
        """Still there and stale: the command that asked for it exits REFUSED (6)."""
        return self.outcome in ("busy", "left")


# --------------------------------------------------------------------------- which folder


def clear_root(cache_dir: str | Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The cache folder to clear (see :func:`checked_root`); an empty ``TVM_FFI_CACHE_DIR`` is
    refused unless ``--cache-dir`` names the folder (it means "the current folder" to tvm-ffi,
    which is where clear-cache once emptied a project folder)."""
    env = os.environ if env is None else env
    if cache_dir is None and env.get("TVM_FFI_CACHE_DIR") == "":
        raise FatalError(EMPTY_VAR, Exit.REFUSED)
    return checked_root(jitroot.cache_root(cache_dir, env))


def checked_root(root: Path) -> Path | None:
    """``root`` (links resolved) if it is safe to clear; None if it does not exist;
    FatalError(REFUSED) for ``/``, the home folder or one above it, a non-folder, or a folder
    that is not a TVM-FFI cache by positive evidence."""
    resolved = Path(os.path.realpath(os.path.abspath(root)))
    home = Path(os.path.realpath(Path.home()))
    if resolved == Path("/") or resolved == home or resolved in home.parents:
        raise FatalError(
            f"refusing to clear {resolved}: that is / or the home folder", Exit.REFUSED
        )
    try:
        mode = os.lstat(resolved).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise FatalError(f"refusing to clear {root}: {e.strerror}", Exit.REFUSED) from e
    if not stat.S_ISDIR(mode):
        raise FatalError(f"refusing to clear {root}: not a folder", Exit.REFUSED)
    if not is_cache(resolved):
        raise FatalError(
            f"refusing to clear {root}: not a TVM-FFI cache (no entry is a tvm-ffi build by "
            "its name and files)",
            Exit.REFUSED,
        )
    return resolved


def is_cache(root: Path) -> bool:
    """Empty, or holding a tvm-ffi build (name and files) or our own leftovers."""
    try:
        with os.scandir(root) as it:
            entries = list(it)
    except OSError:
        return False
    return not entries or any(_is_build(e) or _trash_of(e) is not None for e in entries)


def _is_build(entry: os.DirEntry[str]) -> bool:
    module = jitcache.jit_module(entry.name)
    if module is None or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
        return False
    return jitcache.build_problem(Path(entry.path), module) is None


def _trash_of(entry: os.DirEntry[str]) -> str | None:
    """The build name a trash folder of ours was renamed from, else None."""
    m = _TRASH.match(entry.name)
    if m is None or jitcache.jit_module(m.group("name")) is None:
        return None
    return m.group("name") if entry.is_dir(follow_symlinks=False) else None


def whole_cache(root: Path) -> list[Path]:
    """``--all``: every entry named like a JIT build that a loader could use (a folder with
    something in it, or a link); each is still checked by its files before it goes."""
    with os.scandir(root) as it:
        return sorted(Path(e.path) for e in it if _named_build(e))


def _named_build(entry: os.DirEntry[str]) -> bool:
    if jitcache.jit_module(entry.name) is None:
        return False
    if entry.is_symlink():
        return True
    if not entry.is_dir(follow_symlinks=False):
        return False
    try:
        with os.scandir(entry.path) as it:
            return next(it, None) is not None
    except OSError:
        return True  # unreadable: a target, so that why it stays is said


# --------------------------------------------------------------------------- removal


def clear_stale(tree: Tree, cache_dir: str | Path | None = None) -> list[Removal]:
    """Remove this tree's stale planner builds (apply/revert after a write; ``clear-cache``)."""
    root = clear_root(cache_dir)
    if root is None:
        return []
    return remove_entries(root, [b.path for b in jitcache.stale_builds(tree, root)])


def remove_entries(root: Path, paths: Iterable[Path], dry_run: bool = False) -> list[Removal]:
    """Remove tvm-ffi build folders (and links to them: the link only) directly inside ``root``,
    finishing any removal a killed run left first. Anything that is not a tvm-ffi build by its
    files is left and says why (outcome ``left``); a build being compiled is ``busy``."""
    targets = list(paths)
    for path in targets:
        if path.parent != root:
            raise FatalError(f"refusing to remove {path}: not directly inside {root}", Exit.REFUSED)
    if dry_run:
        return [_would(path) for path in targets]
    with _root_lock(root):
        out = finish_pending(root)
        moved: list[tuple[Path, Path]] = []
        for path in targets:
            try:
                result, aside = _move_aside(path)
            except OSError as e:  # read-only or full filesystem, a vanished folder: one line
                result, aside = Removal(path, "left", f"cannot move it aside ({e.strerror})"), None
            out.append(result)
            if aside is not None:
                moved.append((path, aside))
        if moved:
            time.sleep(PLACEHOLDER_SECONDS)
        for placeholder, aside in moved:
            _drop_placeholder(placeholder)
            problem = _delete_trash(aside)
            if problem:
                out.append(Removal(aside, "left", problem))
    return out


def _would(path: Path) -> Removal:
    problem = _problem(path)
    return Removal(path, "left", problem) if problem else Removal(path, "would remove")


def _problem(path: Path) -> str | None:
    """None if ``path`` may go: a tvm-ffi build folder, or a link to one (the link only)."""
    module = jitcache.jit_module(path.name)
    if module is None:
        return "not named like a JIT build"
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        return f"cannot tell ({e.strerror})"
    if stat.S_ISLNK(mode):
        problem = jitcache.build_problem(path, module)  # read through it, never written
        return f"a link to something that is not a tvm-ffi build ({problem})" if problem else None
    if not stat.S_ISDIR(mode):
        return "not a folder: named like a build, holds none"
    problem = jitcache.build_problem(path, module)
    return f"not a tvm-ffi build: {problem}" if problem else None


def _move_aside(path: Path) -> tuple[Removal, Path | None]:
    if not os.path.lexists(path):
        return Removal(path, "gone", "already gone"), None
    problem = _problem(path)
    if problem:
        return Removal(path, "left", problem), None
    if path.is_symlink():
        os.unlink(path)  # the link only; never what it points to
        fsync_dir(path.parent)
        return Removal(path, "removed", "link removed (its target left alone)"), None
    aside = path.with_name(f"{TRASH}{path.name}-{secrets.token_hex(4)}")
    with _build_lock(path) as busy:
        if busy:
            return Removal(path, *busy), None
        os.rename(path, aside)
        with contextlib.suppress(OSError):
            os.mkdir(path)
        fsync_dir(path.parent)
    return Removal(path, "removed"), aside


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[tuple[Outcome, str] | None]:
    """tvm-ffi's own advisory lock on ``<build>/lock``, non-blocking: None while we hold it (or
    there is no lock file), else the outcome and why we do not."""
    try:
        fd = os.open(path / "lock", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        yield None if e.errno == errno.ENOENT else ("left", f"its lock cannot be opened ({e})")
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield "left", "its lock is not a regular file"
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "busy", "a loader holds its lock (compiling now): left"
            return
        yield None
    finally:
        os.close(fd)


@contextlib.contextmanager
def _root_lock(root: Path) -> Iterator[None]:
    """One remover at a time per cache folder (an advisory lock on the folder itself, so
    nothing is created in it; tvm-ffi never locks the folder)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + ROOT_LOCK_SECONDS
        while not _try_lock(fd, root):
            if time.monotonic() > deadline:
                raise FatalError(
                    f"{root}: another sglang-dsv4-fix is clearing this cache; try again",
                    Exit.REFUSED,
                )
            time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _try_lock(fd: int, root: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:  # e.g. ENOLCK on a network filesystem
        raise FatalError(f"{root}: cannot lock it ({e.strerror})", Exit.REFUSED) from e
    return True


def _drop_placeholder(placeholder: Path) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(placeholder)  # fails (kept) if a loader started building into it meanwhile


def _delete_trash(trash: Path) -> str | None:
    """Delete a renamed-aside build: the files tvm-ffi writes, one by one, then the folder.
    None when it is gone; else what was left and why (nothing else is ever deleted)."""
    m = _TRASH.match(trash.name)
    module = None if m is None else jitcache.jit_module(m.group("name"))
    try:
        fd = os.open(trash, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # another run finished it
    except OSError as e:
        return f"cannot open it ({e.strerror})"
    try:
        odd = _unlink_build_files(fd, module)
        if odd:
            return f"holds {', '.join(sorted(odd)[:3])}, which tvm-ffi does not write: left"
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(trash)
    except OSError as e:
        return f"cannot delete it ({e.strerror}): left"
    finally:
        os.close(fd)
    return None


def _unlink_build_files(fd: int, module: str | None) -> list[str]:
    """Unlink, inside the folder open as ``fd``, the regular files tvm-ffi writes; the rest."""
    odd: list[str] = []
    for name in os.listdir(fd):
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if module and stat.S_ISREG(mode) and jitcache.tvmffi_file(name, module):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
        else:
            odd.append(name)
    return odd


def finish_pending(root: Path) -> list[Removal]:
    """Finish what a killed removal left: its empty placeholder (recognised as ours by the trash
    folder renamed from the same name) and the trash itself. Without this, a kill in the
    placeholder window left a folder clear-cache refused and a verify stuck at 5."""
    pending: dict[str, list[Path]] = {}
    with os.scandir(root) as it:
        for entry in it:
            name = _trash_of(entry)
            if name is not None:
                pending.setdefault(name, []).append(Path(entry.path))
    out: list[Removal] = []
    for name, folders in sorted(pending.items()):
        placeholder = root / name
        if _is_empty_dir(placeholder):
            _wait_out(placeholder)
            _drop_placeholder(placeholder)
        left = [p for p in (_delete_trash(t) for t in sorted(folders)) if p]
        detail = "finished an interrupted removal" + (f"; {'; '.join(left)}" if left else "")
        out.append(Removal(placeholder, "left" if left else "removed", detail))
    return out


def _is_empty_dir(path: Path) -> bool:
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


def _wait_out(placeholder: Path) -> None:
    """A placeholder made moments ago still serves a waiting loader: give it its full time."""
    with contextlib.suppress(OSError):
        age = time.time() - os.lstat(placeholder).st_mtime
        if 0 <= age < PLACEHOLDER_SECONDS:
            time.sleep(PLACEHOLDER_SECONDS - age)
