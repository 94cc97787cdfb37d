"""What the planner's JIT loader calls its builds, and where it puts them.

The cheap first step of every cache check, run by ``verify``, ``status`` and the plugin in every
SGLang process (stdlib and fsops only, no regular expressions): where the cache is,
whether it holds any planner entry, each release's naming scheme and source hash, and which
cached entries are not provably built from the kernel's current bytes. What a build came from
and what is stale is jitcache.py; removal is cacheclean.py.

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

import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import KERNEL_LIMIT, read_regular

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from sglang_dsv4_fix.tree import Tree

    Scheme: TypeAlias = Literal["tvmffi-default", "content-name", "content-dir", "sglang-ninja"]

MODULE = "sgl_kernel_jit_dpsk_v4_compress_plan"  # the start of every release's planner build name
CUDA_FILE = "deepseek_v4/c_plan.cuh"  # what every release's _jit_compress_plan_module() builds

# Where load_jit lives, newest layout first (FACTS.md, "JIT build cache").
LOADER_FILES = (
    "kernels/jit/utils/compile/loader.py",  # 0.5.18+
    "kernels/jit/utils/compile.py",  # 0.5.17
    "jit_kernel/utils/compile.py",  # 0.5.16
    "jit_kernel/utils.py",  # 0.5.12 - 0.5.15.post1
)
LOADER_LIMIT = 1024 * 1024  # the loaders are 10-40 KB

# Build names (FACTS.md, "JIT build cache"), ``<hex16>`` lowercase; parse_name reads them:
#   content-dir     MODULE_<src hex16>__arch_<arch: no "_" or "/">__tvmffi_<version: no "/">
#   content-name    MODULE_<src hex16>_<ffi hex16>
#   tvmffi-default  MODULE_<ffi hex16>
_PREFIX, _ARCH, _TVMFFI = f"{MODULE}_", "__arch_", "__tvmffi_"
# The loaders' include patterns, each anchored ``^\s*`` under re.MULTILINE; _directives scans for
# them with string operations (compiling the patterns cost a cached-build check 0.25 ms at start).
_QUOTED: dict[Scheme, str] = {
    "content-name": r'#\s*include\s+"([^"]+)"',
    "content-dir": r'#\s*include\s*"([^"]+)"',
}
_ANGLE = r"#\s*include\s*<(sgl_kernel/[^>]+)>"
# each pattern's parts: whitespace needed after ``include``, the opening text, the closing mark
_PARTS: dict[str, tuple[bool, str, str]] = {
    _QUOTED["content-name"]: (True, '"', '"'),
    _QUOTED["content-dir"]: (False, '"', '"'),
    _ANGLE: (False, "<sgl_kernel/", ">"),
}


# --------------------------------------------------------------------------- where


def cache_root(cache_dir: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``--cache-dir``, else ``$TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi`` (as both SGLang
    0.5.14+ and tvm-ffi compute it: the variable is taken as given, then ``~`` expanded).

    Set but empty, it is ``.``: tvm-ffi 0.1.9/0.1.11 (``os.environ.get("TVM_FFI_CACHE_DIR",
    default)`` in ``tvm_ffi/cpp/extension.py``) and SGLang's ``load_jit`` do not treat an empty
    value as unset, they build into each process's current folder. Readers look there too;
    ``cacheclean.clear_root`` refuses to clear it unless named by ``--cache-dir``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ if env is None else env
    return Path(env.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser()


def has_planner_entry(root: Path) -> bool:
    """Whether any top-level name in ``root`` starts like a planner build (names only)."""
    try:
        with os.scandir(root) as it:
            return any(e.name.startswith(MODULE) for e in it)
    except OSError:  # no cache (the usual case), or not a folder: nothing cached
        return False


def planner_entries(root: Path) -> list[os.DirEntry[str]]:
    """Top-level entries of ``root`` named like a compress-plan build (any release's scheme).

    Only names are read: this is the cheap first step of every cache check."""
    try:
        with os.scandir(root) as it:
            return sorted((e for e in it if parse_name(e.name)), key=lambda e: e.name)
    except OSError:  # no cache (the usual case), or not a folder: nothing cached
        return []


def parse_name(name: str) -> tuple[Scheme, dict[str, str]] | None:
    """The scheme and parts of a build name (the forms above), or None. String operations, not
    regular expressions: compiling those took 0.4 ms of a cached-build check at start."""
    if not name.startswith(_PREFIX):
        return None
    first, rest = name[len(_PREFIX) : len(_PREFIX) + 16], name[len(_PREFIX) + 16 :]
    if not _hex16(first):
        return None
    if not rest:
        return "tvmffi-default", {"ffi": first}
    if rest.startswith(_ARCH):
        arch, _, tvmffi = rest[len(_ARCH) :].partition(_TVMFFI)  # no separator: no tvmffi
        if arch and tvmffi and "_" not in arch and "/" not in arch and "/" not in tvmffi:
            return "content-dir", {"src": first, "arch": arch, "tvmffi": tvmffi}
        return None
    if rest[0] == "_" and _hex16(rest[1:]):
        return "content-name", {"src": first, "ffi": rest[1:]}
    return None


def _hex16(text: str) -> bool:
    return len(text) == 16 and not text.strip("0123456789abcdef")


# --------------------------------------------------------------------------- the tree's scheme


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
    text = read_regular(path, LOADER_LIMIT, "JIT loader", Exit.UNKNOWN).decode(errors="replace")
    if "_jit_build_dir_name" in text:
        return "content-dir"
    if "_local_jit_source_hash" in text:
        return "content-name"
    return "tvmffi-default"


def modelled_kernel(tree: Tree) -> Path | None:
    """The tree's c_plan.cuh if its builds live in a cache modelled here; None without the
    planner or with 0.5.18+'s own ninja cache (already fixed upstream). FatalError without a
    loader, as scheme_of."""
    if tree.kernel_path is None or scheme_of(tree) == "sglang-ninja":
        return None
    return tree.kernel_path


# --------------------------------------------------------------------------- naming formulas


def source_hash(tree: Tree, data: bytes, scheme: Scheme) -> str:
    """The loader's 16-hex source hash with ``data`` standing in for the tree's c_plan.cuh.

    Depth-first over the kernel and the headers it includes, in the loader's own stack order;
    0.5.13 names each file by its absolute path and follows quoted includes only, 0.5.14+ by the
    path relative to the kernel root and also ``<sgl_kernel/...>`` includes. Paths are strings
    here, not ``Path``s: this runs in every server process whose cache holds a planner build, and
    pathlib's parsing was two thirds of its time (30-odd headers, three paths each).
    """
    if scheme not in _QUOTED:
        raise ValueError(f"scheme {scheme} has no source hash")
    root = os.path.realpath(tree.kernel_root)
    real = _Resolver()
    kernel, is_file = real.file(os.path.join(root, "csrc", CUDA_FILE))
    digest = hashlib.sha256()
    seen: set[str] = set()
    stack = [kernel] if is_file else []
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        content = data if path == kernel else read_regular(path, KERNEL_LIMIT, "kernel header")
        digest.update(_ident(path, root, scheme).encode())
        digest.update(b"\0")
        digest.update(content)
        digest.update(b"\0")
        stack.extend(_includes(path, content, root, scheme, real))
    return digest.hexdigest()[:16]


class _Resolver:
    """The loaders' ``(folder / include).resolve()`` (``os.path.realpath``), with each folder
    resolved once, and whether that is a file (``is_file()``): one ``lstat`` per header instead
    of one per path component and a ``stat`` besides (30-odd headers of 8-10 components each)."""

    def __init__(self) -> None:
        self._folders: dict[str, str] = {}

    def file(self, path: str) -> tuple[str, bool]:
        """The resolved path, and whether it is a regular file (through any links)."""
        parent, name = os.path.split(path)
        if name in ("", ".", ".."):  # not a file name: resolve it whole, as the loader does
            full = os.path.realpath(path)
            return full, os.path.isfile(full)
        folder = self._folders.get(parent)
        if folder is None:
            folder = self._folders[parent] = os.path.realpath(parent)
        full = os.path.join(folder, name)
        try:
            mode = os.lstat(full).st_mode
        except (OSError, ValueError):
            return full, False
        if stat.S_ISLNK(mode):
            full = os.path.realpath(full)
            return full, os.path.isfile(full)
        return full, stat.S_ISREG(mode)


def _ident(path: str, root: str, scheme: Scheme) -> str:
    """The name the loader hashes a file under: its absolute path (0.5.13), else its path
    relative to the kernel root (``Path.relative_to``), or its bare name outside that root."""
    if scheme == "content-name":
        return path
    under = os.path.join(root, "")
    return path[len(under) :] if path.startswith(under) else os.path.basename(path)


def _includes(path: str, content: bytes, root: str, scheme: Scheme, real: _Resolver) -> list[str]:
    """The files ``path`` includes that exist, resolved, in the loader's order."""
    text = content.decode("utf-8", errors="ignore")
    folder = os.path.dirname(path)
    found = [real.file(os.path.join(folder, inc)) for inc in _directives(_QUOTED[scheme], text)]
    if scheme == "content-dir":
        include = os.path.join(root, "include")
        found += [real.file(os.path.join(include, inc)) for inc in _directives(_ANGLE, text)]
    return [p for p, is_file in found if is_file]


def _directives(pattern: str, text: str) -> list[str]:
    """``re.findall(r"^\\s*" + pattern, text, re.MULTILINE)``, the loaders' own scan, without
    ``re``: each ``include`` is found by ``str.find``, then the pattern is checked around it. Its
    ``#`` is the first character before it that is not whitespace, and counts if only whitespace
    precedes it on its line (``\\s`` and ``str.isspace`` are the same test) and it lies after the
    previous match, where findall goes on. Held to the regex by test_jitcache.py."""
    spaced, opening, closing = _PARTS[pattern]
    out: list[str] = []
    after = 0  # where the previous match ended
    word = text.find("include")
    while word >= 0:
        found = _directive_at(text, word, after, spaced, opening, closing)
        if found is not None:
            out.append(text[found[0] : found[1]])
            after = found[1] + 1
        word = text.find("include", max(word + 1, after))
    return out


def _directive_at(
    text: str, word: int, after: int, spaced: bool, opening: str, closing: str
) -> tuple[int, int] | None:
    """Where the value of the directive whose ``include`` is at ``word`` starts and ends."""
    mark = _skip_space_back(text, word)
    if mark < after or text[mark] != "#":
        return None
    line_start = text.rfind("\n", 0, mark) + 1
    if line_start != mark and not text[line_start:mark].isspace():
        return None
    value = _skip_space(text, word + len("include"))
    if spaced and value == word + len("include"):
        return None
    if not text.startswith(opening, value):
        return None
    end = text.find(closing, value + len(opening))
    return (value + 1, end) if end > value + len(opening) else None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _skip_space_back(text: str, i: int) -> int:
    """The index of the first character before ``i`` that is not whitespace (-1: none)."""
    i -= 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return i


def module_name(tree: Tree, data: bytes, scheme: Scheme) -> str:
    if scheme == "tvmffi-default":
        return MODULE
    return f"{MODULE}_{source_hash(tree, data, scheme)}"


# --------------------------------------------------------------------------- current or not


def not_current(tree: Tree, data: bytes, entries: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
    """Entries not provably built from the kernel bytes ``data``: a folder whose name carries the
    hash of those bytes is, by the loader's own naming, built from them (what ``prewarm`` and a
    fixed tree's first start leave). Nothing else is computed for the ones that are."""
    own: dict[Scheme, str] = {}
    out = []
    for entry in entries:
        scheme, parts = parse_name(entry.name)  # type: ignore[misc]
        if scheme in _QUOTED and not entry.is_symlink():
            if scheme not in own:
                own[scheme] = source_hash(tree, data, scheme)
            if parts["src"] == own[scheme]:
                continue
        out.append(entry)
    return out
