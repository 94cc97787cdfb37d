"""What each cached compress-plan build came from, and which are stale or racy.

Inventories builds, read-only (how the loader names them is jitnames.py; removal is
cacheclean.py). Pure and light (no torch, no SGLang, no tvm-ffi import): verify, status and the
plugin call it once the cache holds a planner entry that is not named by the kernel's current
bytes. Every file here is someone else's: opened non-blocking, checked to be a regular file, read
capped. The formulas are our own implementation of what the releases' loaders do (read off the
wheels, see docs/jit-cache.md); tests compare them with names produced by running the releases'
own code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import KERNEL_LIMIT, read_regular, sha256_bytes, sha256_file
from sglang_dsv4_fix.jitnames import (
    CUDA_FILE,
    LOADER_LIMIT,
    SIDECAR,
    loader_file,
    modelled_kernel,
    not_current,
    note_about,
    parse_name,
    planner_entries,
    scheme_of,
)
from sglang_dsv4_fix.jitroot import MODULE, cache_root
from sglang_dsv4_fix.jitsource import module_name, source_hash
from sglang_dsv4_fix.tree import Tree

if TYPE_CHECKING:
    from sglang_dsv4_fix.jitnames import Scheme

Origin = Literal["original", "no-init", "barrier", "current", "cannot tell", "other"]

# What every release's `_jit_compress_plan_module()` passes to `load_jit` (same body 0.5.12-0.5.23).
WRAPPERS = (
    ("plan_prefill", "plan_compress_prefill"),
    ("plan_decode", "plan_compress_decode"),
    ("plan_prefill_legacy", "plan_compress_prefill_legacy"),
    ("plan_decode_legacy", "plan_compress_decode_legacy"),
)
CFLAGS = ("-std=c++20", "-O3")  # load_jit's DEFAULT_CFLAGS
CUDA_FLAGS_TAIL = ("-std=c++20", "-O3", "--expt-relaxed-constexpr")  # after -DSGL_CUDA_ARCH=

_TVMFFI_HEADERS = (
    "#include <tvm/ffi/container/tensor.h>",
    "#include <tvm/ffi/dtype.h>",
    "#include <tvm/ffi/error.h>",
    "#include <tvm/ffi/extra/c_env_api.h>",
    "#include <tvm/ffi/function.h>",
)


# --------------------------------------------------------------------------- releases and schemes


def release_key(version: str) -> tuple[int, ...]:
    """``0.5.15.post1`` -> (0, 5, 15, 1); a plain release sorts before its posts."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", version)
    if m is None:
        raise ValueError(f"not a release version: {version}")
    return tuple(int(g or 0) for g in m.groups())


def tvm_ffi_pin(release: str | None) -> str | None:
    """The apache-tvm-ffi version the release's wheel pins (0.1.9 up to 0.5.14, then 0.1.11)."""
    if release is None:
        return None
    key = release_key(release)
    if key < (0, 5, 12):
        return None
    return "0.1.9" if key < (0, 5, 15) else "0.1.11"


# --------------------------------------------------------------------------- naming formulas


@dataclass(frozen=True)
class Arch:
    """A CUDA capability as one release's loader names it (``target``) and flags it."""

    major: int
    minor: int
    target: str  # TVM_FFI_CUDA_ARCH_LIST while compiling, and the dir suffix on 0.5.14+

    @property
    def flag(self) -> str:
        return f"-DSGL_CUDA_ARCH={self.major * 100 + self.minor * 10}"


def parse_capability(text: str) -> tuple[int, int]:
    """``9.0``, ``9.0a``, ``sm_90a``, ``90`` -> (9, 0)."""
    t = text.strip().lower().removeprefix("sm_").removeprefix("sm")
    m = re.match(r"^(\d+)\.(\d+)[af]?$", t) or re.match(r"^(\d+)(\d)[af]?$", t)
    if m is None:
        raise ValueError(f"not a CUDA architecture: {text!r} (expected e.g. 9.0a or sm_90a)")
    return int(m.group(1)), int(m.group(2))


def arch_for(tree: Tree, major: int, minor: int, nvcc: tuple[int, int] = (13, 0)) -> Arch:
    """The target name the tree's loader derives for a GPU of this capability.

    Up to 0.5.15.post1 no suffix; 0.5.16 and 0.5.17 add "a" on 9.x/10+ and pick "f"/"a"/"" on
    12.x by CUDA version (0.5.16 by torch's CUDA, 0.5.17 by nvcc's; we take ``nvcc`` for both).
    """
    arch_py = _arch_file(tree)
    text = _text(arch_py) if arch_py else ""
    suffix = ""
    if "_cuda_arch_suffix" in text:
        suffix = _suffix(major, minor, nvcc, by_nvcc="_jit_cuda_version" in text)
    return Arch(major, minor, f"{major}.{minor}{suffix}")


def _arch_file(tree: Tree) -> Path | None:
    loader = loader_file(tree)
    if loader is None:
        return None
    folder = loader.parent.parent if loader.parent.name == "compile" else loader.parent
    return folder / "arch.py" if (folder / "arch.py").is_file() else None


def _suffix(major: int, minor: int, cuda: tuple[int, int], by_nvcc: bool) -> str:
    if major == 12:
        if by_nvcc:
            return "f" if minor == 0 and cuda >= (12, 9) else "a"
        return "" if cuda < (12, 9) else ("f" if minor == 0 else "a")
    return "a" if major >= 9 else ""


@dataclass(frozen=True)
class LoadCall:
    """Exactly what the release's ``load_jit`` hands to tvm-ffi's ``load_inline``."""

    name: str
    cuda_sources: tuple[str, ...]
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    extra_include_paths: tuple[str, ...]
    build_directory: Path | None  # None: tvm-ffi names the dir itself
    build_dir: Path  # where the build lands either way
    arch: Arch


def load_call(
    tree: Tree, data: bytes, arch: Arch, tvm_ffi: str | None, root: Path | None = None
) -> LoadCall:
    """The loader's call for the tree with ``data`` as its kernel, for ``arch``.

    ``tvm_ffi`` is the apache-tvm-ffi version SGLang's runtime reports (it names 0.5.14+ dirs).
    """
    scheme = scheme_of(tree)
    if scheme == "sglang-ninja":
        raise FatalError(
            f"{tree.package_dir}: this release (0.5.18+) builds into SGLang's own JIT cache and "
            "ships the fix; there is no TVM-FFI compress-plan build to manage",
            Exit.NOT_APPLICABLE,
        )
    root = cache_root() if root is None else root
    kroot = tree.kernel_root.resolve()
    name = module_name(tree, data, scheme)
    sources = (f'#include "{kroot / "csrc" / CUDA_FILE}"', *_wrappers())
    cuda_flags = (arch.flag, *CUDA_FLAGS_TAIL)
    includes = (str(kroot / "include"),)
    if scheme == "content-dir":
        if not tvm_ffi:
            raise FatalError(
                "cannot name a 0.5.14+ build without the tvm-ffi version", Exit.UNKNOWN
            )
        directory = root / f"{name}__arch_{arch.target}__tvmffi_{tvm_ffi}"
        return LoadCall(name, sources, CFLAGS, cuda_flags, includes, directory, directory, arch)
    ffi = tvmffi_hash(sources, CFLAGS, cuda_flags, includes)
    return LoadCall(name, sources, CFLAGS, cuda_flags, includes, None, root / f"{name}_{ffi}", arch)


def _wrappers() -> tuple[str, ...]:
    return tuple(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({e}, ({k}));" for e, k in WRAPPERS)


def tvmffi_hash(
    cuda_sources: Iterable[str],
    cflags: Iterable[str],
    cuda_cflags: Iterable[str],
    include_paths: Iterable[str],
) -> str:
    """tvm-ffi ``build_inline``'s 16-hex dir hash for a CUDA-only call (no cpp sources, no
    functions, no ldflags, no cubin): a typed walk over the decorated sources and the flag lists."""
    cpp = _decorate("")
    cuda = _decorate("\n".join(cuda_sources))
    m = hashlib.sha256()
    m.update(b"Sequence")
    item: object
    for item in (
        cpp,
        cuda,
        None,
        None,
        {},
        list(cflags),
        list(cuda_cflags),
        [],
        list(include_paths),
        None,
    ):
        _typed(m, item)
    return m.hexdigest()[:16]


def _decorate(source: str) -> str:
    return "\n".join([*_TVMFFI_HEADERS, "", source, ""])


def _typed(m: Any, obj: object) -> None:
    if obj is None:
        m.update(b"None")
    elif isinstance(obj, str):
        m.update(b"str" + obj.encode("utf-8"))
    elif isinstance(obj, dict):
        m.update(b"Mapping")  # only ever empty here
    else:
        assert isinstance(obj, list)
        m.update(b"Sequence")
        for item in obj:
            _typed(m, item)


def runtime_tvm_ffi(tree: Tree) -> str | None:
    """The apache-tvm-ffi version next to an installed tree, else the release's pin."""
    infos = sorted(tree.package_dir.parent.glob("apache_tvm_ffi-*.dist-info"))
    if len(infos) == 1:
        return infos[0].name.removeprefix("apache_tvm_ffi-").removesuffix(".dist-info")
    return tvm_ffi_pin(tree.release)


# --------------------------------------------------------------------------- the tree's sources


def tree_sources(tree: Tree) -> dict[str, bytes]:
    """Kernel bytes this tree's builds can come from: ``current`` plus, when the original is
    known (the kernel itself or the backup beside it), ``original``, ``no-init`` and ``barrier``."""
    from sglang_dsv4_fix import provenance
    from sglang_dsv4_fix.rewrite import rewrite

    assert tree.kernel_path is not None
    current = read_regular(tree.kernel_path, KERNEL_LIMIT, "kernel")
    out = {"current": current}
    original = _original(tree.kernel_path, current, provenance.backup_path(tree.kernel_path))
    if original is None:
        return {**out, **_fixed_label(current)}
    out["original"] = original
    for variant in ("no-init", "barrier"):
        with contextlib.suppress(FatalError, UnicodeDecodeError):
            out[variant] = rewrite(original.decode("utf-8"), variant).encode("utf-8")
    return out


def _fixed_label(data: bytes) -> dict[str, bytes]:
    """A fixed kernel whose original is unknown still names its own variant."""
    from sglang_dsv4_fix.kernel import classify

    with contextlib.suppress(UnicodeDecodeError):
        variant = classify(data.decode("utf-8")).variant
        if variant in ("no-init", "barrier"):
            return {variant: data}
    return {}


def _original(kernel: Path, current: bytes, backup: Path) -> bytes | None:
    from sglang_dsv4_fix.kernel import classify

    for candidate in (current, _backup(backup)):
        if candidate is None:
            continue
        with contextlib.suppress(UnicodeDecodeError, Exception):
            if classify(candidate.decode("utf-8")).variant == "racy-init":
                return candidate
    return None


def _backup(path: Path) -> bytes | None:
    """The backup's bytes, read as anyone's file (regular, never blocking, capped), or None."""
    try:
        return read_regular(path, KERNEL_LIMIT, "backup", follow=False)
    except FatalError:
        return None


def _text(path: Path) -> str:
    return read_regular(path, LOADER_LIMIT, "JIT loader", Exit.UNKNOWN).decode(errors="replace")


# --------------------------------------------------------------------------- what tvm-ffi writes

# A build folder is named by SGLang 0.5.14+ (``<module>__arch_<t>__tvmffi_<v>``) or by tvm-ffi
# itself (``<module>_<16 hex>``); it holds only the files tvm-ffi's load_inline/build_inline and
# ninja write there (tvm_ffi/cpp/extension.py: lock, main.cpp, cuda.cu, build.ninja, cpp_0.o,
# cuda_0.o + depfiles, <module>.so, .ninja_log, .ninja_deps), plus our sidecar.
_JIT_NAMES = (
    re.compile(r"^(?P<module>[A-Za-z_]\w*?)__arch_[0-9a-z.]+__tvmffi_[0-9A-Za-z.+]+$"),
    re.compile(r"^(?P<module>[A-Za-z_]\w*)_[0-9a-f]{16}$"),
)
_TVMFFI_FILES = frozenset(
    {"lock", "build.ninja", "main.cpp", "cuda.cu", ".ninja_log", ".ninja_deps"}
)
_TVMFFI_OBJECTS = re.compile(
    r"^(?:(?:c|cpp|cuda)_\d+|unified(?:_with_\w+)?)\.o(?:\.d)?$|^\w+\.cubin$"
)
_NINJA_HEAD = "ninja_required_version = 1.3\n"
MAX_BUILD_FILES = 64
READ_CAP = 1 << 20  # build.ninja, cuda.cu, a sidecar: tvm-ffi and we write a few KB
SO_CAP = 1 << 28  # a planner .so is ~1 MB: never hash an unbounded file


def jit_module(name: str) -> str | None:
    """The module a cache entry named ``name`` builds, if the name is a JIT build's."""
    for pattern in _JIT_NAMES:
        m = pattern.match(name)
        if m:
            return m.group("module")
    return None


def tvmffi_file(name: str, module: str) -> bool:
    """A file name tvm-ffi (or our sidecar) writes into the build folder of ``module``."""
    return (
        name in _TVMFFI_FILES
        or name in (SIDECAR, f"{module}.so")
        or _TVMFFI_OBJECTS.match(name) is not None
    )


def build_problem(path: Path, module: str) -> str | None:
    """None if the folder ``path`` is, by its files, a tvm-ffi build of ``module``; else why not.

    Every entry must be a regular file tvm-ffi writes, and ``build.ninja`` must be the one it
    generates for ``<module>.so``. A link at ``path`` is followed (its target is what is read).
    """
    try:
        with os.scandir(path) as it:
            entries = [(e.name, e.is_file(follow_symlinks=False)) for e in _first(it)]
    except OSError as e:
        return f"cannot list it ({e.strerror})"
    if len(entries) > MAX_BUILD_FILES:
        return f"holds more than {MAX_BUILD_FILES} entries"
    for name, regular in sorted(entries):
        if not tvmffi_file(name, module):
            return f"holds {name!r}, which tvm-ffi does not write"
        if not regular:
            return f"its {name!r} is not a regular file"
    ninja = read_capped(path / "build.ninja")
    if ninja is None or not ninja.startswith(_NINJA_HEAD.encode()):
        return "no build.ninja generated by tvm-ffi"
    if f"\ndefault {module}.so\n".encode() not in ninja:
        return f"its build.ninja does not build {module}.so"
    return None


def _first(it: Iterator[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
    for i, entry in enumerate(it):
        if i > MAX_BUILD_FILES:
            return
        yield entry


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int | None:
    """A descriptor on ``path`` if it is a regular file, else None (missing, a link, a FIFO, a
    device, a socket: opened non-blocking so none of them can hang us, then checked on the fd)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_capped(path: Path, limit: int = READ_CAP) -> bytes | None:
    """The bytes of a regular file of at most ``limit`` bytes, else None."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def _sha256_path(path: Path, limit: int = SO_CAP) -> str | None:
    fd = open_regular(path)
    if fd is None:
        return None
    h, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                size += len(chunk)
                if size > limit:
                    return None
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


# --------------------------------------------------------------------------- inventory

Kind = Literal["folder", "empty folder", "link", "dangling link", "not a folder"]


@dataclass(frozen=True)
class Build:
    path: Path
    scheme: Scheme
    src_hash: str | None
    arch: str | None
    tvm_ffi: str | None
    origin: Origin
    detail: str
    origin_sha256: str | None  # sha256 of the kernel bytes it was built from, when known
    link: bool = False
    has_so: bool = False
    kind: Kind = "folder"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def ours(self) -> bool:
        """Built for this tree (by content hash or, on 0.5.12, by the kernel path it includes)."""
        return self.origin != "other"

    @property
    def loadable(self) -> bool:
        """A loader could take a .so from it: a folder with something in it, or a link to a
        folder. An empty folder (a fresh mkdir, our placeholder) or a file named like a build
        cannot hand a stale planner to anyone."""
        return self.kind in ("folder", "link")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "scheme": self.scheme,
            "src_hash": self.src_hash,
            "arch": self.arch,
            "tvm_ffi": self.tvm_ffi,
            "origin": self.origin,
            "origin_sha256": self.origin_sha256,
            "detail": self.detail,
            "link": self.link,
            "has_so": self.has_so,
            "kind": self.kind,
        }


def inventory(tree: Tree, root: Path | None = None) -> list[Build]:
    """Every compress-plan build in the cache and, as far as it can be told, what it came from."""
    return _inventory(tree, planner_entries(cache_root() if root is None else root))


def _inventory(tree: Tree, entries: list[os.DirEntry[str]]) -> list[Build]:
    if not entries:
        return []  # the cache is listed first: no candidate source is computed for nothing
    sources = tree_sources(tree)
    schemes = {parse_name(e.name)[0] for e in entries}  # type: ignore[index]
    hashes = _hashes(tree, sources, schemes)
    kernel = (tree.kernel_root.resolve() / "csrc" / CUDA_FILE).resolve()
    return [_build(e, hashes, sources, kernel) for e in entries]


def _hashes(
    tree: Tree, sources: dict[str, bytes], present: set[Scheme]
) -> dict[tuple[str, str], str]:
    """(scheme, src16) -> source label, for the content-hashing schemes that have entries."""
    out: dict[tuple[str, str], str] = {}
    schemes: tuple[Scheme, ...] = ("content-name", "content-dir")
    for scheme in (s for s in schemes if s in present):
        for label, data in sources.items():
            out.setdefault((scheme, source_hash(tree, data, scheme)), label)
    return out


def _kind(entry: os.DirEntry[str]) -> Kind:
    try:
        if entry.is_symlink():
            return "link" if stat.S_ISDIR(os.stat(entry.path).st_mode) else "dangling link"
        if not entry.is_dir(follow_symlinks=False):
            return "not a folder"
        with os.scandir(entry.path) as it:
            return "folder" if next(it, None) is not None else "empty folder"
    except OSError:  # a link loop, a vanished entry: nothing a loader can take a .so from
        return "dangling link" if os.path.islink(entry.path) else "folder"


def _build(
    entry: os.DirEntry[str],
    hashes: dict[tuple[str, str], str],
    sources: dict[str, bytes],
    kernel: Path,
) -> Build:
    parsed = parse_name(entry.name)
    assert parsed is not None
    scheme, parts = parsed
    path = Path(entry.path)
    kind = _kind(entry)
    link = kind in ("link", "dangling link")

    def build(origin: Origin, detail: str, sha: str | None, has_so: bool = False) -> Build:
        return Build(path, scheme, parts.get("src"), parts.get("arch"), parts.get("tvmffi"),
                     origin, detail, sha, link, has_so, kind)  # fmt: skip

    if link:
        return build("cannot tell", f"a {kind}: never followed", None)
    if kind == "not a folder":
        return build("cannot tell", "not a folder: named like a build, holds none", None)
    has_so = _lexists(path / f"{_module_of(entry.name, scheme)}.so")
    if scheme == "tvmffi-default":
        return build(*_origin_by_path(path, sources, kernel), has_so)
    label = hashes.get((scheme, parts["src"]))
    origin, sha = _label(label, sources)
    detail = (
        f"name hash matches this tree's {origin} kernel"
        if label
        else "name hash matches no kernel of this tree (another release, tree or edit)"
    )
    return build(origin, detail, sha, has_so)


def _label(label: str | None, sources: dict[str, bytes]) -> tuple[Origin, str | None]:
    if label is None:
        return "other", None
    sha = sha256_bytes(sources[label])
    if label == "current":
        label = next(
            (k for k, v in sources.items() if k != "current" and v == sources["current"]), "current"
        )
    return label, sha  # type: ignore[return-value]


def _module_of(name: str, scheme: Scheme) -> str:
    if scheme == "content-dir":
        return name.split("__arch_", 1)[0]
    if scheme == "content-name":
        return name.rsplit("_", 1)[0]
    return MODULE


def _origin_by_path(
    path: Path, sources: dict[str, bytes], kernel: Path
) -> tuple[Origin, str, str | None]:
    """0.5.12: the dir name ignores the kernel's bytes. Its cuda.cu names the kernel it includes;
    only our sidecar (checked against the .so's bytes) tells which bytes it was built from."""
    included = _included_kernel(path)
    if included is None:
        return "cannot tell", "no readable cuda.cu: cannot tell which tree it was built for", None
    if Path(included) != kernel:
        return "other", f"built for another tree ({included})", None
    note = read_sidecar(path, f"{MODULE}.so")
    if note is None:
        return (
            "cannot tell",
            "built for this tree; its kernel bytes cannot be told (0.5.12 "
            "names builds by path only)",
            None,
        )
    for label, data in sources.items():
        if sha256_bytes(data) == note.get("kernel_sha256"):
            origin, sha = _label(label, sources)
            return (
                origin,
                f"sidecar: built by sglang-dsv4-fix from this tree's {origin} kernel",
                sha,
            )
    return "cannot tell", "sidecar names kernel bytes this tree no longer has", None


def _included_kernel(path: Path) -> str | None:
    data = read_capped(path / "cuda.cu")
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    m = re.search(r'^#include "([^"]+c_plan\.cuh)"$', text, re.MULTILINE)
    return m.group(1) if m else None


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def read_sidecar(build: Path, so_name: str) -> dict[str, Any] | None:
    """Our note in a build dir, if it still describes ``so_name``, the .so there that a loader
    takes (else None): about that file (jitnames.note_about), and with its bytes."""
    note = note_about(read_capped(build / SIDECAR), so_name)
    if note is None or _sha256_path(build / so_name) != note.get("so_sha256"):
        return None  # rebuilt since we wrote it (or not a regular file): it no longer speaks
    return note


def write_sidecar(build: Path, so: Path, note: dict[str, Any]) -> None:
    from sglang_dsv4_fix.fswrite import atomic_write

    body = {**note, "so": so.name, "so_sha256": _sha256_path(so)}
    atomic_write(build / SIDECAR, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


# --------------------------------------------------------------------------- stale and racy


def stale_builds(tree: Tree, cache_dir: str | Path | None = None) -> list[Build]:
    """This tree's compress-plan builds not provably built from its current kernel bytes.

    That is builds of the other variants (the racy original above all) and, on 0.5.12, builds
    for this tree's path whose bytes cannot be told. Builds of other trees are left alone, and
    so are entries a loader cannot take a .so from (an empty folder, a file named like a build).
    """
    return _stale(tree, planner_entries(cache_root(cache_dir)))


def _stale(tree: Tree, entries: list[os.DirEntry[str]]) -> list[Build]:
    kernel = modelled_kernel(tree) if entries else None
    if kernel is None:
        return []
    suspects = not_current(tree, read_regular(kernel, KERNEL_LIMIT, "kernel"), entries)
    if not suspects:
        return []  # e.g. only the prewarmed fix: no other candidate source is computed
    current = sha256_file(kernel)
    return [
        b
        for b in _inventory(tree, suspects)
        if b.ours and b.loadable and (b.origin == "cannot tell" or b.origin_sha256 != current)
    ]


def racy_builds(
    tree: Tree, cache_dir: str | Path | None = None, variant: str | None = None
) -> list[Build]:
    """Stale builds that are (or may be) the racy original, while the tree's kernel is fixed.

    This is what ``verify`` fails on (Exit.STALE_BUILD) and ``status`` reports. The cache is
    listed first; the kernel is hashed only when a planner entry exists, and classified only if
    the caller does not already know its ``variant`` (the verdict does).
    """
    entries = planner_entries(cache_root(cache_dir))
    kernel = modelled_kernel(tree) if entries else None
    if kernel is None:
        return []
    if variant is None:
        from sglang_dsv4_fix.kernel import classify

        try:
            data = read_regular(kernel, KERNEL_LIMIT, "kernel")
            variant = classify(data.decode("utf-8")).variant
        except (UnicodeDecodeError, FatalError):
            return []
    if variant not in ("no-init", "barrier"):
        return []
    return [b for b in _stale(tree, entries) if b.origin in ("original", "cannot tell")]


def status_line(tree: Tree, cache_dir: str | Path | None = None) -> str:
    """``status``'s one line on the JIT cache: this tree's planner builds by origin. Whether any
    is a racy build still in force is the verdict's to say (with the user's own fix command)."""
    root = cache_root(cache_dir)
    try:
        if modelled_kernel(tree) is None:
            return f"{root}: not used for the planner by this release"
        ours = [b for b in inventory(tree, root) if b.ours]
    except (FatalError, OSError) as e:
        return f"{root}: cannot tell ({e})"
    counts = (
        ", ".join(
            f"{o} x{sum(b.origin == o for b in ours)}"
            for o in dict.fromkeys(b.origin for b in ours)
        )
        or "none"
    )
    return f"{root}: planner builds of this tree: {counts}"
