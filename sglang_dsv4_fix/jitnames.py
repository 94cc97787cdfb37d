"""What the planner's JIT loader calls its builds.

The cheap step of every cache check that finds a planner entry, run by ``verify``, ``status`` and
the plugin in every SGLang process (stdlib and fsops only, no regular expressions): each
release's naming scheme, and which cached entries are not provably built from the kernel's
current bytes. Where the cache is and whether it holds any planner entry is jitroot.py; the
loaders' source hash is jitsource.py; what a build came from and what is stale is jitcache.py;
removal is cacheclean.py.

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
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import read_regular
from sglang_dsv4_fix.jitroot import MODULE

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from sglang_dsv4_fix.tree import Tree

    Scheme: TypeAlias = Literal["tvmffi-default", "content-name", "content-dir", "sglang-ninja"]

CUDA_FILE = "deepseek_v4/c_plan.cuh"  # what every release's _jit_compress_plan_module() builds

# Where load_jit lives, newest layout first (FACTS.md, "JIT build cache").
LOADER_FILES = (
    "kernels/jit/utils/compile/loader.py",  # 0.5.18+
    "kernels/jit/utils/compile.py",  # 0.5.17
    "jit_kernel/utils/compile.py",  # 0.5.16
    "jit_kernel/utils.py",  # 0.5.12 - 0.5.15.post1
)
NINJA_DIR = "compile"  # the loader's folder from 0.5.18, whose builds SGLang's own cache holds
LOADER_LIMIT = 1024 * 1024  # the loaders are 10-40 KB
SIDECAR = ".sglang-dsv4-fix.json"  # our note in a build folder we compiled (jitcache.py)
SIDECAR_LIMIT = 1 << 20  # we write a few hundred bytes
CONTENT_SCHEMES = ("content-name", "content-dir")  # a build's name carries its source hash

# Build names (FACTS.md, "JIT build cache"), ``<hex16>`` lowercase; parse_name reads them:
#   content-dir     MODULE_<src hex16>__arch_<arch: no "_" or "/">__tvmffi_<version: no "/">
#   content-name    MODULE_<src hex16>_<ffi hex16>
#   tvmffi-default  MODULE_<ffi hex16>
_PREFIX, _ARCH, _TVMFFI = f"{MODULE}_", "__arch_", "__tvmffi_"

# --------------------------------------------------------------------------- names


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
    path = _loader(tree)
    if path.parent.name == NINJA_DIR:
        return "sglang-ninja"
    text = read_regular(path, LOADER_LIMIT, "JIT loader", Exit.UNKNOWN).decode(errors="replace")
    if "_jit_build_dir_name" in text:
        return "content-dir"
    if "_local_jit_source_hash" in text:
        return "content-name"
    return "tvmffi-default"


def modelled_kernel(tree: Tree) -> Path | None:
    """The tree's c_plan.cuh if its builds live in a cache modelled here; None without the
    planner or with 0.5.18+'s own ninja cache (already fixed upstream), told by the loader's
    path alone: a cache check reads each entry's scheme from its name. FatalError without a
    loader, as scheme_of."""
    if tree.kernel_path is None or _loader(tree).parent.name == NINJA_DIR:
        return None
    return tree.kernel_path


def _loader(tree: Tree) -> Path:
    path = loader_file(tree)
    if path is None:
        raise FatalError(f"{tree.package_dir}: no SGLang JIT loader (load_jit) found", Exit.UNKNOWN)
    return path


# --------------------------------------------------------------------------- current or not


def not_current(
    tree: Tree, data: bytes, entries: list[os.DirEntry[str]], sha256: str | None = None
) -> list[os.DirEntry[str]]:
    """Entries not provably built from the kernel bytes ``data`` (0.5.13+: a 0.5.12 build's name
    never tells); ``sha256``: that of ``data``, where the caller has it already. Two proofs, the
    cheap one first:

    - our sidecar in the folder (``prewarm``, or the plugin when its process compiled the build)
      names the sha256 of ``data`` and this folder's own ``.so``: a folder copied or renamed under
      another hash carries a note about another ``.so``, and a loader rebuilds in place only from
      sources of the same hash, so the same kernel bytes (:func:`noted_current`);
    - the folder's name carries the loader's hash of ``data`` and the headers it includes (what a
      build by SGLang alone leaves): :func:`not_named_current`.
    """
    sha256 = sha256 or hashlib.sha256(data).hexdigest()
    return not_named_current(tree, data, [e for e in entries if not noted_current(e, sha256)])


def not_named_current(
    tree: Tree, data: bytes, entries: list[os.DirEntry[str]]
) -> list[os.DirEntry[str]]:
    """Entries whose name does not carry the loader's hash of ``data`` (and the headers it
    includes), computed once per scheme; a link or a name of no content scheme never does."""
    own: dict[Scheme, str] = {}
    out = []
    for entry in entries:
        scheme, parts = parse_name(entry.name)  # type: ignore[misc]
        if scheme in CONTENT_SCHEMES and not entry.is_symlink():
            if scheme not in own:
                from sglang_dsv4_fix.jitsource import source_hash

                own[scheme] = source_hash(tree, data, scheme)
            if parts["src"] == own[scheme]:
                continue
        out.append(entry)
    return out


def noted_current(entry: os.DirEntry[str], sha256: str) -> bool:
    """Our note in the build folder ``entry`` names the kernel ``sha256`` and the folder's own
    ``.so`` (a content scheme's folder, not a link): the first proof of :func:`not_current`."""
    parsed = parse_name(entry.name)
    if parsed is None or parsed[0] not in CONTENT_SCHEMES or entry.is_symlink():
        return False
    return noted_sha256(entry.path, f"{MODULE}_{parsed[1]['src']}.so") == sha256


def noted_sha256(build: str, so_name: str) -> str | None:
    """The kernel sha256 our sidecar in the folder ``build`` names, if it is about ``so_name``.

    Names and fields only, never the ``.so``'s bytes (jitcache.read_sidecar also checks those:
    a 0.5.12 folder's name does not change when its sources do). The folder is opened without
    following a link and the note read through it, regular file only, capped, never blocking."""
    try:
        fd = os.open(build, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = read_regular(SIDECAR, SIDECAR_LIMIT, "sidecar", follow=False, dir_fd=fd)
    except FatalError:  # absent, not a regular file, too big
        return None
    finally:
        os.close(fd)
    sha = (note_about(data, so_name) or {}).get("kernel_sha256")
    return sha if isinstance(sha, str) else None


def note_about(data: bytes | None, so_name: str) -> dict[str, Any] | None:
    """Our sidecar's fields, if ``data`` is one and it is about ``so_name``. A note about another
    .so says nothing about this one: a build folder renamed or copied under another module's name
    keeps its old .so and note, and the loader compiles the new name's .so beside them."""
    if data is None:
        return None
    try:
        note = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    return note if isinstance(note, dict) and note.get("so") == so_name else None
