"""The plugin's entry point: its start modules executed from one file, then ``plugin.register()``.

SGLang imports this module in every process. Importing the plugin's start modules one file each
spends ~0.07 ms per module finding, opening and checking it (benchmarks/start_anatomy.py), and a
start imports ten to twelve: this runs them from one file instead,
``__pycache__/start.<cache tag>.bundle`` beside the ``.pyc`` files Python writes, which holds the
code objects Python compiled for them, each with its source's path, size and mtime. They are
executed straight into new modules in dependency order (``MODULES``), with no finder: the import
system's own steps per module are what this saves.

The bundle is a cache with the ``.pyc`` files' trust and freshness rule. A module whose source
differs from its entry, or that the bundle lacks, is imported as usual when the code asks for it;
a bundle that cannot be used (absent, a link, not a regular file, too big, another Python's,
damaged) is ignored; only the names in ``MODULES`` are ever executed from it. A process that
imported any of them as usual writes a new bundle after ``register()`` (atomically, beside the
``.pyc`` files, never when Python writes no bytecode). In warn mode nothing here can stop SGLang:
any failure falls back to plain imports.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import stat
import sys
from importlib.machinery import ModuleSpec, SourceFileLoader
from types import CodeType, ModuleType

PACKAGE = __name__.rpartition(".")[0]
DIRECTORY = os.path.dirname(os.path.abspath(__file__))
HEADER = b"sglang-dsv4-fix start bundle 2\n"
MAX_BYTES = 4 << 20  # ours is ~120 KB; a bigger file is not ours
# What every start imports of this package, dependencies first (each module's imports at its top
# name only modules before it: tests/test_start.py); then what only a fixed tree's start imports,
# from inside functions as ``from sglang_dsv4_fix import <name>``: our record (provenance) and the
# cache check (jitroot, jitnames). Those are run from the bundle only when asked for.
EAGER = tuple(f"{PACKAGE}.{m}" for m in
              ("value", "errors", "fsops", "tree", "manifest", "state", "verdict", "plugin"))  # fmt: skip
LAZY = tuple(f"{PACKAGE}.{m}" for m in ("provenance", "jitroot", "jitnames"))
MODULES = EAGER + LAZY
# a module's source as compiled: (path, size, mtime in ns), then its marshalled code object
Entry = tuple[str, int, int, bytes]


def register() -> None:
    """SGLang's entry point (``sglang_dsv4_fix`` in ``sglang.srt.plugins``)."""
    loaded = sys.modules.get(PACKAGE + ".plugin")
    if loaded is not None:  # registered before, or imported by other means
        loaded.register()
        return
    entries: dict[str, Entry] = {}
    served: list[str] = []
    package = sys.modules[PACKAGE]
    lazy = None
    with contextlib.suppress(Exception):  # a cache: never worth a failed start
        entries = _read(_bundle_path())
        _execute(entries, served, EAGER)
        if "__getattr__" not in vars(package):

            def lazy(name: str) -> ModuleType:
                return _lazy(entries, served, name)

            vars(package)["__getattr__"] = lazy
    try:
        from sglang_dsv4_fix import plugin

        plugin.register()
    finally:
        if lazy is not None and vars(package).get("__getattr__") is lazy:
            del vars(package)["__getattr__"]
    with contextlib.suppress(Exception):
        _save(_bundle_path(), entries, served)


class Bundle(SourceFileLoader):
    """The loader named on a module executed from the bundle; anything that asks it again (a
    reload, ``inspect``) is served from the source, as for any module of this package."""


def _lazy(entries: dict[str, Entry], served: list[str], name: str) -> ModuleType:
    """The package's ``__getattr__`` while ``register()`` runs: ``from sglang_dsv4_fix import
    <name>`` asks it before it imports, so a module of ``LAZY`` is run from the bundle here. For
    anything else, or an entry that cannot serve, AttributeError: the import goes on as usual."""
    full = f"{PACKAGE}.{name}"
    if full in LAZY:
        with contextlib.suppress(Exception):
            _execute(entries, served, (full,))
    module = sys.modules.get(full)
    if full not in served or module is None:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    return module


def _execute(entries: dict[str, Entry], served: list[str], names: tuple[str, ...]) -> None:
    """Run the fresh entries of ``names`` into new modules, in that order, noting each in
    ``served``; stop at the first that fails (the rest are imported as usual when asked for)."""
    package = sys.modules[PACKAGE]
    for name in names:
        entry = entries.get(name)
        if name in sys.modules or entry is None or not _fresh(name, entry):
            continue
        try:
            code = marshal.loads(entry[3])
        except (ValueError, EOFError, TypeError):
            code = None
        if not isinstance(code, CodeType):  # damaged: imported as usual, then written anew
            del entries[name]
            continue
        source = entry[0]
        module = ModuleType(name)
        module.__spec__ = spec = ModuleSpec(name, Bundle(name, source), origin=source)
        spec.has_location = True  # __file__ is the source, as for a .pyc
        module.__loader__, module.__file__, module.__package__ = spec.loader, source, PACKAGE
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            del sys.modules[name]
            raise
        setattr(package, name.rpartition(".")[2], module)
        served.append(name)


def _save(path: str | None, entries: dict[str, Entry], served: list[str]) -> None:
    """Write a bundle when a module of ``MODULES`` that it lacks (or holds stale) was imported as
    usual: the fresh entries kept, the new ones compiled from their source, in ``MODULES`` order."""
    if path is None or sys.dont_write_bytecode or not os.path.isdir(os.path.dirname(path)):
        return
    kept = {n: e for n, e in entries.items() if n in MODULES and _fresh(n, e)}
    missed = [n for n in MODULES if n not in served and n not in kept and n in sys.modules]
    new = {n: e for n in missed if (e := _compiled(n)) is not None}
    if new:
        merged = {**kept, **new}
        _write(path, _prefix() + marshal.dumps({n: merged[n] for n in MODULES if n in merged}))


def _fresh(name: str, entry: Entry) -> bool:
    """Whether ``entry`` was compiled from this install's source of ``name`` as it is now."""
    return entry[0] == _source(name) and _stat(entry[0]) == entry[1:3]


def _compiled(name: str) -> Entry | None:
    """The entry for ``name`` as it was imported from this package's folder, or None."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    source = _source(name)
    if spec is None or spec.origin != source:
        return None
    get_code = getattr(spec.loader, "get_code", None)
    before = _stat(source)
    code = get_code(name) if before is not None and get_code is not None else None
    if not isinstance(code, CodeType) or _stat(source) != before or before is None:
        return None  # not compiled from a file, or the source changed meanwhile
    return (source, *before, marshal.dumps(code))


def _source(name: str) -> str:
    return os.path.join(DIRECTORY, name.rpartition(".")[2] + ".py")


def _bundle_path() -> str | None:
    tag = sys.implementation.cache_tag
    if tag is None or sys.pycache_prefix is not None:  # .pyc files live elsewhere, or nowhere
        return None
    return os.path.join(DIRECTORY, "__pycache__", f"start.{tag}.bundle")


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
