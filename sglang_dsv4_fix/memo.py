"""The plugin's start status of a tree, kept for the next SGLang process on this host.

Judging a tree imports the domain's modules, nine to twelve of them: most of what the plugin adds
to every process's start (docs/plugin.md, "Cost"). A process that finds the entry an earlier one
left, with nothing it rests on changed, takes that status and imports none of them:
- the kernel's bytes are read and hashed again at every start, and must have the entry's sha256;
- every other path the verdict rests on (``verdict.inputs``: found by reading, listing or looking
  for it), and this package's own modules that judged it, must have the same inode, size, mtime
  and ctime, both of the path and of what it points to (Python trusts a ``.pyc`` on its source's
  mtime and size alone); a path that was missing must still be missing;
- the environment that names the JIT cache (``jitroot.ENV``) and the folder this package runs
  from are part of the entry's name (a second install of the plugin beside the tree's own, on
  ``PYTHONPATH`` say, judges for itself: its code may differ).
An entry is written only when none of those paths changed in the second before the judgement
began, or since (a change within one tick of the file system's clock could leave its times as
they were: git's "racy clean" problem; a change during the judgement may have been half seen),
and never for heal mode or for a verdict resting on more than paths (a source hash; a git tag
read where a GIT_* variable may steer git).
Entries live in ``$XDG_CACHE_HOME/sglang-dsv4-fix/start`` (else ``~/.cache``), a folder that must
be this user's and writable by no one else; anything else, any doubt or any error, and the process
judges its tree as before. ``SGLANG_DSV4_FIX_MEMO=off`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from sglang_dsv4_fix.fsops import KERNEL_LIMIT, read_regular, replace_at, sha256_bytes
from sglang_dsv4_fix.jitroot import ENV

SWITCH_ENV = "SGLANG_DSV4_FIX_MEMO"
FORMAT = 2
LIMIT = 256 * 1024  # an entry is a few KB
QUIET_NS = 1_000_000_000  # inputs unchanged this long before an entry is written

_CODE = os.path.dirname(os.path.abspath(__file__))  # this package's folder: the code that judges
Fingerprint = list[list[int] | None]  # [lstat, stat] of a path, each None where it is missing


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "").strip().lower() != "off"


def lookup(package_dir: str) -> dict[str, Any] | None:
    """The stored status of the tree at ``package_dir``, if nothing it rests on has changed."""
    if not enabled():
        return None
    try:
        fd = _open_folder()
        if fd is None:
            return None
        try:
            data = read_regular(_name(package_dir), LIMIT, "memo", follow=False, dir_fd=fd)
        finally:
            os.close(fd)
        entry = json.loads(data)
        return entry["status"] if _still(entry, package_dir) else None
    except Exception:  # no entry, a damaged one: judge as before
        return None


def store(package_dir: str, status: dict[str, Any], inputs: list[Path], judged_ns: int) -> None:
    """Keep ``status``, judged from ``judged_ns`` on (``time.time_ns()``), for the next process,
    keyed on ``inputs`` and this package's loaded modules; nothing when one of them changed in
    the second before the judgement began, or since (it may have read the old state)."""
    if not enabled():
        return
    paths = [str(p) for p in (*inputs, *_own_files())]
    prints = [_fingerprint(p) for p in paths]
    if not _quiet(prints, judged_ns - QUIET_NS):
        return
    fd = _open_folder(make=True)
    if fd is None:
        return
    entry = {"format": FORMAT, "package_dir": package_dir, "code": _CODE,
             "inputs": list(zip(paths, prints, strict=True)), "status": status}  # fmt: skip
    try:
        replace_at(fd, _name(package_dir), json.dumps(entry).encode(), 0o600, durable=False)
    finally:
        os.close(fd)


def _still(entry: dict[str, Any], package_dir: str) -> bool:
    made_by = (entry.get("format"), entry.get("package_dir"), entry.get("code"))
    if made_by != (FORMAT, package_dir, _CODE):
        return False
    if any(_fingerprint(path) != printed for path, printed in entry["inputs"]):
        return False
    status = entry["status"]
    if status["kernel"] is None:  # no planner in this tree: its paths said all
        return True
    data = read_regular(status["kernel"], KERNEL_LIMIT, "kernel")
    return bool(sha256_bytes(data) == status["sha256"])


def _fingerprint(path: str) -> Fingerprint:
    """The path's ``lstat`` and ``stat``: one system call where it is no symbolic link (the two
    then agree: every link before its last part is followed by both)."""
    link = _stat(path, False)
    return [link, _stat(path, True) if link is not None and stat.S_ISLNK(link[0]) else link]


def _stat(path: str, follow: bool) -> list[int] | None:
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    return [st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _quiet(prints: list[Fingerprint], since: int) -> bool:
    """None of the paths changed at or after ``since`` (nor claims a time to come)."""
    return all(s is None or max(s[4], s[5]) < since for pair in prints for s in pair)


def _own_files() -> list[str]:
    """This package's modules loaded now: a verdict judged by other code is not this one's.

    Looked up by the names in the package's folder (~40), not by a walk over the ~4,000 modules
    of a server process (~1 ms there; copying their items as pairs started a full garbage
    collection, ~0.28 s)."""
    names = [e.name[:-3] for e in os.scandir(_CODE) if e.name.endswith(".py")]
    files = [os.path.join(_CODE, "__init__.py")]
    for name in sorted(names):
        module = sys.modules.get(f"{__package__}.{name}")
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            files.append(file)
    return files


def _name(package_dir: str) -> str:
    words = [package_dir, _CODE, *(os.environ.get(n, "\0") for n in ENV)]
    return hashlib.sha256("\0".join(words).encode()).hexdigest()[:32] + ".json"


def _folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang-dsv4-fix", "start")


def _open_folder(make: bool = False) -> int | None:
    """The entries' folder, by descriptor, if it is this user's own and no one else can write
    to it (not a link); None otherwise. ``make``: made first where it is missing (0700)."""
    folder = _folder()
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if not make:
            return None
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return _open_folder()
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return fd
    os.close(fd)
    return None
