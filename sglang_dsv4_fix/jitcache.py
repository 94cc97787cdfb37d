"""Where each release's loader puts the compress-plan JIT build, what each cached build came from.

Pure and light (no torch, no SGLang, no tvm-ffi import): verify and status call it. The naming
formulas are our own implementation of what the releases' loaders do (read off the wheels, see
docs/jit-cache.md); tests compare them with names produced by running the releases' own code.

Schemes (sgl-project/sglang#32467 is only fixed in-tree from 0.5.18):
- ``tvmffi-default`` (0.5.12): tvm-ffi's ``<root>/<module>_<hash of generated source + flags>``;
  the hash sees the kernel's absolute path, not its bytes, so a patched kernel keeps the same dir.
- ``content-name`` (0.5.13): module name gets ``_<16 hex>`` of c_plan.cuh's bytes (absolute
  path as identity, quoted includes only), then tvm-ffi's default dir as above.
- ``content-dir`` (0.5.14-0.5.17): ``<root>/<module>_<src16>__arch_<arch>__tvmffi_<ver>``; src16
  covers c_plan.cuh and every header it includes, named relative to the kernel root.
- ``sglang-ninja`` (0.5.18+): SGLang's own cache, already fixed upstream; nothing to model here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import sha256_bytes, sha256_file
from sglang_dsv4_fix.tree import Tree

Scheme = Literal["tvmffi-default", "content-name", "content-dir", "sglang-ninja"]
Origin = Literal["original", "no-init", "barrier", "current", "cannot tell", "other"]

# What every release's `_jit_compress_plan_module()` passes to `load_jit` (same body 0.5.12-0.5.23).
MODULE = "sgl_kernel_jit_dpsk_v4_compress_plan"
CUDA_FILE = "deepseek_v4/c_plan.cuh"
WRAPPERS = (
    ("plan_prefill", "plan_compress_prefill"),
    ("plan_decode", "plan_compress_decode"),
    ("plan_prefill_legacy", "plan_compress_prefill_legacy"),
    ("plan_decode_legacy", "plan_compress_decode_legacy"),
)
CFLAGS = ("-std=c++20", "-O3")  # load_jit's DEFAULT_CFLAGS
CUDA_FLAGS_TAIL = ("-std=c++20", "-O3", "--expt-relaxed-constexpr")  # after -DSGL_CUDA_ARCH=
SIDECAR = ".sglang-dsv4-fix.json"  # our provenance note inside a build dir we compiled
TRASH = ".sglang-dsv4-fix-trash-"  # renamed-aside builds awaiting deletion
BUILD_MARKERS = ("lock", "build.ninja")

# Where load_jit lives, newest layout first (FACTS.md, "JIT build cache").
LOADER_FILES = (
    "kernels/jit/utils/compile/loader.py",  # 0.5.18+
    "kernels/jit/utils/compile.py",  # 0.5.17
    "jit_kernel/utils/compile.py",  # 0.5.16
    "jit_kernel/utils.py",  # 0.5.12 - 0.5.15.post1
)
_HEX16 = "[0-9a-f]{16}"
_NAMES: dict[Scheme, re.Pattern[str]] = {
    "content-dir": re.compile(
        rf"^{MODULE}_(?P<src>{_HEX16})__arch_(?P<arch>[^_/]+)__tvmffi_(?P<tvmffi>[^/]+)$"
    ),
    "content-name": re.compile(rf"^{MODULE}_(?P<src>{_HEX16})_(?P<ffi>{_HEX16})$"),
    "tvmffi-default": re.compile(rf"^{MODULE}_(?P<ffi>{_HEX16})$"),
}
_QUOTED = {
    "content-name": re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE),
    "content-dir": re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE),
}
_ANGLE = re.compile(r"^\s*#\s*include\s*<(sgl_kernel/[^>]+)>", re.MULTILINE)
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


def loader_file(tree: Tree) -> Path | None:
    return next(
        (tree.package_dir / f for f in LOADER_FILES if (tree.package_dir / f).is_file()), None
    )


def scheme_of(tree: Tree) -> Scheme:
    """The cache scheme of the tree's own ``load_jit``, read from its source (not its version)."""
    path = loader_file(tree)
    if path is None:
        raise FatalError(f"{tree.package_dir}: no SGLang JIT loader (load_jit) found", Exit.UNKNOWN)
    if path.parent.name == "compile":
        return "sglang-ninja"
    text = path.read_text(encoding="utf-8", errors="replace")
    if "_jit_build_dir_name" in text:
        return "content-dir"
    if "_local_jit_source_hash" in text:
        return "content-name"
    return "tvmffi-default"


# --------------------------------------------------------------------------- naming formulas


def cache_root(cache_dir: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``--cache-dir``, else ``$TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi`` (as both SGLang
    0.5.14+ and tvm-ffi compute it: the variable is taken as given, then ``~`` expanded)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ if env is None else env
    return Path(env.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser()


def source_hash(tree: Tree, data: bytes, scheme: Scheme) -> str:
    """The loader's 16-hex source hash with ``data`` standing in for the tree's c_plan.cuh.

    Depth-first over the kernel and the headers it includes, in the loader's own stack order;
    0.5.13 names each file by its absolute path and follows quoted includes only, 0.5.14+ by the
    path relative to the kernel root and also ``<sgl_kernel/...>`` includes.
    """
    if scheme not in _QUOTED:
        raise ValueError(f"scheme {scheme} has no source hash")
    root = tree.kernel_root.resolve()
    kernel = (root / "csrc" / CUDA_FILE).resolve()
    digest = hashlib.sha256()
    seen: set[Path] = set()
    stack = [kernel]
    while stack:
        path = stack.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        content = data if path == kernel else path.read_bytes()
        digest.update(_ident(path, root, scheme).encode())
        digest.update(b"\0")
        digest.update(content)
        digest.update(b"\0")
        stack.extend(_includes(path, content, root, scheme))
    return digest.hexdigest()[:16]


def _ident(path: Path, root: Path, scheme: Scheme) -> str:
    if scheme == "content-name":
        return str(path)
    try:
        return str(path.relative_to(root))
    except ValueError:
        return path.name


def _includes(path: Path, content: bytes, root: Path, scheme: Scheme) -> list[Path]:
    text = content.decode("utf-8", errors="ignore")
    found = [(path.parent / inc).resolve() for inc in _QUOTED[scheme].findall(text)]
    if scheme == "content-dir":
        found += [(root / "include" / inc).resolve() for inc in _ANGLE.findall(text)]
    return [p for p in found if p.is_file()]


def module_name(tree: Tree, data: bytes, scheme: Scheme) -> str:
    if scheme == "tvmffi-default":
        return MODULE
    return f"{MODULE}_{source_hash(tree, data, scheme)}"


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
    text = arch_py.read_text(encoding="utf-8", errors="replace") if arch_py else ""
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
    current = tree.kernel_path.read_bytes()
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

    for candidate in (current, backup.read_bytes() if backup.is_file() else None):
        if candidate is None:
            continue
        with contextlib.suppress(UnicodeDecodeError, Exception):
            if classify(candidate.decode("utf-8")).variant == "racy-init":
                return candidate
    return None


# --------------------------------------------------------------------------- inventory


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

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def ours(self) -> bool:
        """Built for this tree (by content hash or, on 0.5.12, by the kernel path it includes)."""
        return self.origin != "other"

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
        }


def parse_name(name: str) -> tuple[Scheme, dict[str, str]] | None:
    for scheme, pattern in _NAMES.items():
        m = pattern.match(name)
        if m:
            return scheme, m.groupdict()
    return None


def planner_entries(root: Path) -> list[os.DirEntry[str]]:
    """Top-level entries of ``root`` named like a compress-plan build (any release's scheme)."""
    if not root.is_dir():
        return []
    with os.scandir(root) as it:
        return sorted((e for e in it if parse_name(e.name)), key=lambda e: e.name)


def inventory(tree: Tree, root: Path | None = None) -> list[Build]:
    """Every compress-plan build in the cache and, as far as it can be told, what it came from."""
    root = cache_root() if root is None else root
    sources = tree_sources(tree)
    hashes = _hashes(tree, sources)
    kernel = (tree.kernel_root.resolve() / "csrc" / CUDA_FILE).resolve()
    return [_build(e, hashes, sources, kernel) for e in planner_entries(root)]


def _hashes(tree: Tree, sources: dict[str, bytes]) -> dict[tuple[str, str], str]:
    """(scheme, src16) -> source label, for the schemes that hash content."""
    out: dict[tuple[str, str], str] = {}
    schemes: tuple[Scheme, ...] = ("content-name", "content-dir")
    for scheme in schemes:
        for label, data in sources.items():
            out.setdefault((scheme, source_hash(tree, data, scheme)), label)
    return out


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
    link = entry.is_symlink()

    def build(origin: Origin, detail: str, sha: str | None, has_so: bool = False) -> Build:
        return Build(path, scheme, parts.get("src"), parts.get("arch"), parts.get("tvmffi"),
                     origin, detail, sha, link, has_so)  # fmt: skip

    if link:
        return build("cannot tell", "a link: never followed", None)
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
    note = read_sidecar(path)
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
    text = _read_nofollow(path / "cuda.cu")
    if text is None:
        return None
    m = re.search(r'^#include "([^"]+c_plan\.cuh)"$', text, re.MULTILINE)
    return m.group(1) if m else None


def _read_nofollow(path: Path, limit: int = 1 << 20) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def read_sidecar(build: Path) -> dict[str, Any] | None:
    """Our note in a build dir, if it still describes the .so beside it (else None)."""
    text = _read_nofollow(build / SIDECAR)
    if text is None:
        return None
    try:
        note = json.loads(text)
    except ValueError:
        return None
    so = build / str(note.get("so", ""))
    if not isinstance(note, dict) or not so.is_file() or so.is_symlink():
        return None
    if _sha256_path(so) != note.get("so_sha256"):
        return None  # rebuilt since we wrote it: the note no longer speaks for the .so
    return note


def _sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_sidecar(build: Path, so: Path, note: dict[str, Any]) -> None:
    from sglang_dsv4_fix.fsops import atomic_write

    body = {**note, "so": so.name, "so_sha256": _sha256_path(so)}
    atomic_write(build / SIDECAR, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


# --------------------------------------------------------------------------- stale and racy


def stale_builds(tree: Tree, cache_dir: str | Path | None = None) -> list[Build]:
    """This tree's compress-plan builds not provably built from its current kernel bytes.

    That is builds of the other variants (the racy original above all) and, on 0.5.12, builds
    for this tree's path whose bytes cannot be told. Builds of other trees are left alone.
    """
    if tree.kernel_path is None or scheme_of(tree) == "sglang-ninja":
        return []
    current = sha256_file(tree.kernel_path)
    return [
        b
        for b in inventory(tree, cache_root(cache_dir))
        if b.ours and (b.origin == "cannot tell" or b.origin_sha256 != current)
    ]


def racy_builds(tree: Tree, cache_dir: str | Path | None = None) -> list[Build]:
    """Stale builds that are (or may be) the racy original, while the tree's kernel is fixed.

    This is what ``verify`` fails on (Exit.STALE_BUILD) and ``status`` reports.
    """
    from sglang_dsv4_fix.kernel import classify

    if tree.kernel_path is None or scheme_of(tree) == "sglang-ninja":
        return []
    try:
        variant = classify(tree.kernel_path.read_text(encoding="utf-8")).variant
    except (UnicodeDecodeError, OSError):
        return []
    if variant not in ("no-init", "barrier"):
        return []
    return [b for b in stale_builds(tree, cache_dir) if b.origin in ("original", "cannot tell")]


def stale_message(tree: Tree, cache_dir: str | Path | None = None) -> str | None:
    """One line for verify/status when racy planner builds sit in the cache of a fixed tree."""
    try:
        racy = racy_builds(tree, cache_dir)
    except (FatalError, OSError):
        return None  # no loader to model, unreadable cache: the kernel verdict stands alone
    if not racy:
        return None
    names = ", ".join(b.name for b in racy)
    return (
        f"STALE BUILD: the kernel is fixed but {len(racy)} racy (or untellable) planner build(s) "
        f"remain in {cache_root(cache_dir)}: {names} (run: sglang-dsv4-fix clear-cache)"
    )


def status_line(tree: Tree, cache_dir: str | Path | None = None) -> str:
    """``status``'s one line on the JIT cache: this tree's planner builds by origin, stale ones."""
    root = cache_root(cache_dir)
    try:
        if tree.kernel_path is None or scheme_of(tree) == "sglang-ninja":
            return f"{root}: not used for the planner by this release"
        ours = [b for b in inventory(tree, root) if b.ours]
        stale = stale_message(tree, cache_dir)
    except (FatalError, OSError) as e:
        return f"{root}: cannot tell ({e})"
    counts = (
        ", ".join(
            f"{o} x{sum(b.origin == o for b in ours)}"
            for o in dict.fromkeys(b.origin for b in ours)
        )
        or "none"
    )
    return f"{root}: planner builds of this tree: {counts}" + (f"; {stale}" if stale else "")


# --------------------------------------------------------------------------- safe removal


def checked_root(root: Path) -> Path | None:
    """``root`` if it is safe to clear; None if it does not exist; FatalError(REFUSED) if not a
    TVM-FFI cache, or ``/``, or the home folder or one above it."""
    resolved = Path(os.path.abspath(root)).resolve()
    home = Path.home().resolve()
    if resolved == Path("/") or resolved == home or resolved in home.parents:
        raise FatalError(
            f"refusing to clear {resolved}: that is / or the home folder", Exit.REFUSED
        )
    if not os.path.lexists(resolved):
        return None
    if not resolved.is_dir():
        raise FatalError(f"refusing to clear {root}: not a folder", Exit.REFUSED)
    with os.scandir(resolved) as it:
        entries = [e for e in it if not e.name.startswith(TRASH)]
    if entries and not any(is_build_dir(e) for e in entries):
        raise FatalError(
            f"refusing to clear {root}: not a TVM-FFI cache (no entry holds a build: "
            f"{', '.join(BUILD_MARKERS)} or a .so)",
            Exit.REFUSED,
        )
    return resolved


def is_build_dir(entry: os.DirEntry[str]) -> bool:
    if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
        return False
    return any(os.path.lexists(os.path.join(entry.path, m)) for m in BUILD_MARKERS) or any(
        n.endswith(".so") for n in os.listdir(entry.path)
    )


@dataclass(frozen=True)
class Removal:
    path: Path
    outcome: Literal["removed", "would remove", "busy", "gone"]
    detail: str = ""


def remove_entries(root: Path, paths: Iterable[Path], dry_run: bool = False) -> list[Removal]:
    """Remove build dirs (and links: the link only) from ``root`` so that a loader racing us never
    crashes: a build whose lock is held (being compiled now) is left alone; the others are renamed
    aside under their lock, an empty dir is left at the old name for half a second so a loader
    that began waiting on the lock then finds a folder to build in, then the renamed copy is
    deleted (an mmapped .so stays valid for processes that loaded it)."""
    out: list[Removal] = []
    placeholders: list[Path] = []
    trash: list[Path] = []
    for path in paths:
        if path.parent != root:
            raise FatalError(f"refusing to remove {path}: not directly inside {root}", Exit.REFUSED)
        if dry_run:
            out.append(Removal(path, "would remove"))
            continue
        result, aside = _move_aside(path)
        out.append(result)
        if aside is not None:
            trash.append(aside)
            placeholders.append(path)
    if placeholders:
        time.sleep(0.5)
        for p in placeholders:
            with contextlib.suppress(OSError):
                os.rmdir(p)  # fails (kept) if a loader started building into it meanwhile
    for t in [*trash, *_old_trash(root, trash)]:
        shutil.rmtree(t, ignore_errors=True)
    return out


def _move_aside(path: Path) -> tuple[Removal, Path | None]:
    if not os.path.lexists(path):
        return Removal(path, "gone", "already gone"), None
    if path.is_symlink():
        os.unlink(path)  # the link only; never what it points to
        return Removal(path, "removed", "link removed (its target left alone)"), None
    aside = path.with_name(f"{TRASH}{path.name}-{secrets.token_hex(4)}")
    with _build_lock(path) as locked:
        if not locked:
            return Removal(path, "busy", "a loader holds its lock (compiling now): left"), None
        os.rename(path, aside)
        with contextlib.suppress(OSError):
            os.mkdir(path)
    return Removal(path, "removed"), aside


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[bool]:
    """tvm-ffi's own advisory lock on ``<build>/lock``, non-blocking; True if we hold it."""
    try:
        fd = os.open(path / "lock", os.O_WRONLY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):
            yield True  # no lock file: nobody is building (or a link we never open)
            return
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _old_trash(root: Path, skip: list[Path]) -> list[Path]:
    with os.scandir(root) as it:
        return [
            Path(e.path)
            for e in it
            if e.name.startswith(TRASH) and Path(e.path) not in skip and not e.is_symlink()
        ]


def whole_cache(root: Path) -> list[Path]:
    """``--all``: every build dir and link in the cache (other files are left alone)."""
    with os.scandir(root) as it:
        return sorted(
            Path(e.path)
            for e in it
            if not e.name.startswith(TRASH) and (e.is_symlink() or is_build_dir(e))
        )


def count_modules(root: Path) -> int:
    """Build dirs a full wipe would force to recompile (each is one JIT module + arch)."""
    return len(whole_cache(root)) if root.is_dir() else 0


# --------------------------------------------------------------------------- apply/revert seam


def after_kernel_change(tree: Tree, old_sha256: str, new_sha256: str, args: Any) -> list[Removal]:
    """Called by apply/revert after the kernel's bytes changed: drop this tree's stale planner
    builds (not the rest of the cache) unless ``--no-clear-cache``. Never fails the write."""
    if getattr(args, "no_clear_cache", False) or old_sha256 == new_sha256:
        return []
    try:
        root = checked_root(cache_root(getattr(args, "cache_dir", None)))
        if root is None:
            return []
        done = remove_entries(root, [b.path for b in stale_builds(tree, root)])
    except (FatalError, OSError) as e:
        print(f"sglang-dsv4-fix: warning: JIT cache not cleared: {e}", file=sys.stderr)
        return []
    for r in done:
        print(
            f"jit cache: {r.outcome}: {r.path}" + (f" ({r.detail})" if r.detail else ""),
            file=sys.stderr,
        )
    return done
