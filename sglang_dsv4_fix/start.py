"""The plugin's entry point: its start modules read from one file, then ``plugin.register()``.

SGLang imports this module in every process. Importing the plugin's start modules one file each
spends ~0.07 ms per module finding and opening it (benchmarks/start_anatomy.py), about 0.8 ms in
all: this loads them from one file instead, ``__pycache__/start.<cache tag>.bundle`` beside the
``.pyc`` files Python writes, which holds the code objects Python compiled for them, each with its
source's path, size and mtime. The bundle is a cache with the ``.pyc`` files' own trust and
freshness rule: a module whose source differs, or one the bundle lacks, is imported as usual, and
a bundle that cannot be used (absent, not a regular file, too big, another Python's, damaged) is
ignored. A process that imported any start module as usual writes a new bundle after
``register()`` (atomically, beside the ``.pyc`` files, never when Python writes no bytecode).
The finder itself notes the names it could not serve, so nothing here lists ``sys.modules`` (a
server process holds ~4,000 modules: such a walk cost 0.6-1.5 ms per process, docs/benchmarks.md).
In warn mode nothing here can stop SGLang: any failure falls back to plain imports.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import stat
import sys
from importlib.machinery import ModuleSpec, SourceFileLoader
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

PACKAGE = __name__.rpartition(".")[0]
HEADER = b"sglang-dsv4-fix start bundle 1\n"
MAX_BYTES = 4 << 20  # ours is ~120 KB; a bigger file is not ours
# a module's source as compiled: (path, size, mtime in ns), then its marshalled code object
Entry = tuple[str, int, int, bytes]


def register() -> None:
    """SGLang's entry point (``sglang_dsv4_fix`` in ``sglang.srt.plugins``)."""
    loaded = sys.modules.get(PACKAGE + ".plugin")
    if loaded is not None:  # registered before, or imported by other means
        loaded.register()
        return
    finder, path = Bundle(_directory()), _bundle_path()
    with contextlib.suppress(Exception):
        finder.entries = _read(path)
    sys.meta_path.insert(0, finder)  # register() imports most of the start modules lazily
    try:
        from sglang_dsv4_fix import plugin

        plugin.register()
    finally:
        with contextlib.suppress(ValueError):  # taken out by someone else meanwhile
            sys.meta_path.remove(finder)
    with contextlib.suppress(Exception):  # a cache: never worth a failed start
        finder.save(path)


class Bundle:
    """A finder and loader for this package's modules, from the bundle's code objects."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.entries: dict[str, Entry] = {}
        self.missed: list[str] = []  # this package's modules it could not serve

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if not name.startswith(PACKAGE + "."):
            return None
        entry = self.entries.get(name)
        if entry is None or entry[0] != self._source(name) or _stat(entry[0]) != entry[1:3]:
            self.missed.append(name)
            return None
        spec = ModuleSpec(name, cast("Loader", self), origin=entry[0])
        spec.has_location = True  # __file__ is the source, as for a .pyc
        return spec

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        try:
            code = marshal.loads(self.entries[name][3])
        except (ValueError, EOFError, TypeError):  # damaged: compiled from the source instead
            code = SourceFileLoader(name, self.entries[name][0]).get_code(name)
        exec(code, module.__dict__)

    def _source(self, name: str) -> str:
        return os.path.join(self.directory, name.rpartition(".")[2] + ".py")

    def save(self, path: str | None) -> None:
        """Write a bundle of the fresh entries and of the modules the finder missed that were then
        imported as usual from this package's folder; nothing when there are none of the latter."""
        if not self.missed or path is None or sys.dont_write_bytecode:
            return
        if not os.path.isdir(os.path.dirname(path)):
            return
        new = {n: e for n in sorted(set(self.missed)) if (e := self._compiled(n)) is not None}
        if new:
            fresh = {n: e for n, e in self.entries.items() if _stat(e[0]) == e[1:3]}
            _write(path, _prefix() + marshal.dumps({**fresh, **new}))

    def _compiled(self, name: str) -> Entry | None:
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        source = self._source(name)
        if name.rpartition(".")[0] != PACKAGE or spec is None or spec.origin != source:
            return None
        get_code = getattr(spec.loader, "get_code", None)
        before = _stat(source)
        code = get_code(name) if before is not None and get_code is not None else None
        if not isinstance(code, CodeType) or _stat(source) != before or before is None:
            return None  # not compiled from a file, or the source changed meanwhile
        return (source, *before, marshal.dumps(code))


def _directory() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _bundle_path() -> str | None:
    tag = sys.implementation.cache_tag
    if tag is None or sys.pycache_prefix is not None:  # .pyc files live elsewhere, or nowhere
        return None
    return os.path.join(_directory(), "__pycache__", f"start.{tag}.bundle")


def _stat(path: str) -> tuple[int, int] | None:
    """A regular file's size and mtime (ns); None for anything else."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def _read(path: str | None) -> dict[str, Entry]:
    """The bundle's entries, or none: its data are checked by type before any is used."""
    try:
        data = _read_file(path) if path is not None else b""
        prefix = _prefix()
        if not data.startswith(prefix):
            return {}
        entries = marshal.loads(data[len(prefix) :])
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {n: e for n, e in entries.items() if _is_entry(n, e)}


def _prefix() -> bytes:
    from importlib.util import MAGIC_NUMBER  # the .pyc format's: code objects are per version

    return HEADER + MAGIC_NUMBER


def _is_entry(name: object, entry: object) -> bool:
    types = (str, int, int, bytes)
    return (
        isinstance(name, str)
        and isinstance(entry, tuple)
        and len(entry) == len(types)
        and all(isinstance(v, t) for v, t in zip(entry, types, strict=True))
    )


def _read_file(path: str) -> bytes:
    """A regular file's bytes, without following a link or waiting on a FIFO."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return b""
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)


def _write(path: str, data: bytes) -> None:
    """``data`` into ``path`` atomically: a private temporary file beside it, then a rename."""
    tmp = f"{path}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
