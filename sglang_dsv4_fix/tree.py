"""Find the planner kernel in any SGLang layout, without importing SGLang.

Accepted: a git source checkout (``python/sglang``), its ``python/`` folder, a ``site-packages``
folder, the ``sglang`` package folder itself, or (no path) the sglang the interpreter would import.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import read_regular
from sglang_dsv4_fix.value import Value

if TYPE_CHECKING:  # aliases for the checker: a Literal costs its definition in every process
    from typing import Literal, TypeAlias

    Layout: TypeAlias = Literal["pre-refactor", "post-refactor"]
    Kind: TypeAlias = Literal["git", "installed", "package"]

# Kernel root (holds csrc/ and include/) and loader module, per layout; from FACTS.md's matrix.
KERNEL_ROOTS: dict[Layout, str] = {
    "pre-refactor": "jit_kernel",  # 0.5.12 - 0.5.16
    "post-refactor": "kernels/jit",  # 0.5.17 +
}
LOADER_MODULES: dict[Layout, str] = {
    "pre-refactor": "sglang.jit_kernel.dsv4.compress",
    "post-refactor": "sglang.kernels.ops.attention.dsv4.compress",
}
KERNEL_IN_ROOT = "csrc/deepseek_v4/c_plan.cuh"
METADATA_LIMIT = 1024 * 1024  # a dist-info METADATA (sglang's: ~30 KB) or _version.py
# Name and Version are the first headers of every release's METADATA: every SGLang process reads
# its first 4 KB (of ~30), and the whole file only if Version is not among the whole lines there.
METADATA_HEAD = 4096
_RELEASE = r"^v?(\d+\.\d+\.\d+(?:\.post\d+)?)$"  # a release tag (compiled when a tag is read)
# What ``git tag --points-at HEAD`` reads in a checkout whose .git is a folder of its own: HEAD,
# the refs (loose files, packed-refs or a reftable) and the config (the objects they name never
# change). Where git may read more than these (a linked work tree's common folder, a GIT_*
# variable that moves or reconfigures the repository, refs past the limit), the release rests on
# more than paths.
_GIT_PATHS = ("HEAD", "config", "commondir", "objects", "packed-refs", "reftable", "shallow",
              "refs")  # fmt: skip
# where git looks for a ref named HEAD before it takes .git/HEAD (ambiguity is checked)
_GIT_HEADS = ("refs/HEAD", "refs/tags/HEAD", "refs/heads/HEAD", "refs/remotes/HEAD",
              "refs/remotes/HEAD/HEAD")  # fmt: skip
_GIT_REFS = ("refs/heads", "refs/tags", "refs/replace")
# who commits, how git reaches remotes, what it shows: never what a read of the refs sees
_GIT_HARMLESS = ("GIT_AUTHOR_", "GIT_COMMITTER_", "GIT_SSL_", "GIT_SSH", "GIT_HTTP_", "GIT_CURL_",
                 "GIT_PROXY_", "GIT_ASKPASS", "GIT_TERMINAL_PROMPT", "GIT_PAGER", "GIT_EDITOR",
                 "GIT_TRACE")  # fmt: skip
_GIT_REF_LIMIT = 4096


OWN_TAG = "sglang-dsv4-fix"  # in the names of our files beside a kernel


def record_path(kernel: Path) -> Path:
    """Our provenance record beside ``kernel`` (provenance.py reads and writes it)."""
    return kernel.with_name(f".{kernel.name}.{OWN_TAG}.json")


def backup_path(kernel: Path) -> Path:
    """Our backup of the original beside ``kernel`` (transaction.py writes it)."""
    return kernel.with_name(f".{kernel.name}.{OWN_TAG}.orig")


class Tree(Value):
    __slots__ = (
        "git_root",
        "kernel_path",
        "kind",
        "layout",
        "package_dir",
        "release",
        "release_source",
        "root",
    )  # fmt: skip

    def __init__(
        self,
        root: Path,
        kind: Kind,
        package_dir: Path,
        kernel_path: Path | None,
        layout: Layout | None,
        release: str | None,
        release_source: str,
        git_root: Path | None,
    ) -> None:
        self.root, self.kind, self.package_dir = root, kind, package_dir
        self.kernel_path, self.layout = kernel_path, layout
        self.release, self.release_source, self.git_root = release, release_source, git_root

    @property
    def kernel_root(self) -> Path:
        if self.layout is None:
            raise FatalError(f"{self.package_dir} has no DeepSeek-V4 planner", Exit.NOT_APPLICABLE)
        return self.package_dir / KERNEL_ROOTS[self.layout]

    @property
    def loader_module(self) -> str | None:
        return LOADER_MODULES[self.layout] if self.layout else None

    @property
    def kernel_relpath(self) -> str | None:
        """The kernel's path as a git checkout names it (``python/sglang/...``)."""
        if self.kernel_path is None:
            return None
        return f"python/sglang/{self.kernel_path.relative_to(self.package_dir).as_posix()}"


def find_tree(path: str | Path | None = None) -> Tree:
    """The SGLang tree at ``path`` (or the importable one); raises FatalError if there is none."""
    root = None if path is None else _folder(Path(path))
    package = _importable_package() if root is None else _package_under(root)
    layout, kernel = _kernel(package)
    git_root = _git_root(package)
    infos = _dist_infos(package.parent)
    kind: Kind = "git" if git_root is not None else "installed" if infos else "package"
    release, source = _release(package, git_root, infos)
    return Tree(root or package, kind, package, kernel, layout, release, source, git_root)


def inputs(tree: Tree) -> list[Path] | None:
    """Every path :func:`find_tree` read or looked for to find ``tree`` (memo.py keeps a start
    status on them), with what git read where it was asked for a release tag; None where git
    may have read more."""
    package = tree.package_dir
    looked = [package.parent, package.parent.parent / ".git", package / "_version.py"]
    for candidate in _candidates(tree.root):
        looked += [candidate, candidate / "__init__.py"]
        looked += [candidate / root for root in KERNEL_ROOTS.values()]
    looked += [package / root / KERNEL_IN_ROOT for root in KERNEL_ROOTS.values()]
    looked += [info / "METADATA" for info in _dist_infos(package.parent)]
    if tree.git_root is None or tree.release_source not in ("git tag", "unknown"):
        return looked  # git was not asked
    git = _git_inputs(tree.git_root)
    return None if git is None else looked + git


def _importable_package() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang")  # finds, never imports, a top-level package
    if spec is None or not spec.submodule_search_locations:
        raise FatalError("no --tree given and this Python cannot import sglang", Exit.NOT_FOUND)
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _folder(path: Path) -> Path:
    """``path`` resolved, if it is an existing folder."""
    if not path.exists():
        raise FatalError(f"{path}: no such file or folder", Exit.NOT_FOUND)
    if not path.is_dir():
        raise FatalError(f"{path}: not a folder (give the tree, not a file)", Exit.NOT_FOUND)
    return path.resolve()


def _package_under(path: Path) -> Path:
    found = [p for p in _candidates(path) if _is_sglang(p)]
    if not found:
        raise FatalError(
            f"{path}: no SGLang package here (looked for sglang/, python/sglang/ or the package "
            "folder itself)",
            Exit.NOT_FOUND,
        )
    if len(found) > 1:
        names = ", ".join(str(p) for p in found)
        raise FatalError(f"{path}: several SGLang packages: {names}; name one", Exit.UNKNOWN)
    return found[0]


def _candidates(path: Path) -> list[Path]:
    return [path, path / "sglang", path / "python" / "sglang"]


def _is_sglang(path: Path) -> bool:
    if path.name != "sglang" or not path.is_dir():
        return False
    return (path / "__init__.py").is_file() or any(
        (path / r).is_dir() for r in KERNEL_ROOTS.values()
    )


def _kernel(package: Path) -> tuple[Layout | None, Path | None]:
    present = [
        (layout, package / root / KERNEL_IN_ROOT)
        for layout, root in KERNEL_ROOTS.items()
        if (package / root / KERNEL_IN_ROOT).exists()
        or (package / root / KERNEL_IN_ROOT).is_symlink()
    ]
    if len(present) > 1:
        names = " and ".join(str(p) for _, p in present)
        raise FatalError(
            f"two planner kernels in one tree: {names}; refusing to guess", Exit.UNKNOWN
        )
    return present[0] if present else (None, None)


def _git_root(package: Path) -> Path | None:
    """The checkout root when the package sits at ``<root>/python/sglang`` of a git work tree."""
    root = package.parent.parent
    if package.parent.name == "python" and (root / ".git").exists():
        return root
    return None


def _dist_infos(folder: Path) -> list[Path]:
    """The ``sglang-*.dist-info`` folders beside the package (one listing of a site-packages)."""
    try:
        with os.scandir(folder) as it:
            names = [e.name for e in it if e.name.startswith("sglang-")]
    except OSError:
        return []
    return sorted(folder / n for n in names if n.endswith(".dist-info"))


def _release(package: Path, git_root: Path | None, infos: list[Path]) -> tuple[str | None, str]:
    found = _from_dist_info(infos)
    if found:
        return found, "dist-info"
    found = _from_version_file(package)
    if found:
        return found, "sglang/_version.py"
    if git_root is not None:
        tag = _from_git_tag(git_root)
        if tag:
            return tag, "git tag"
    return None, "unknown"


def _from_dist_info(infos: list[Path]) -> str | None:
    if len(infos) != 1:
        return None  # none, or several stale ones: the name would be a guess
    path = infos[0] / "METADATA"
    head = _read(path, METADATA_HEAD, head=True)
    if len(head) == METADATA_HEAD:  # cut: only whole lines count
        head = head[: head.rfind(b"\n") + 1]
    version, ended = _version_header(head)
    if version or ended:
        return version
    return _version_header(_read(path, METADATA_LIMIT))[0]  # headers longer than the head


def _version_header(data: bytes) -> tuple[str | None, bool]:
    """The ``Version:`` header in ``data``, and whether the header block ended in it."""
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip(), True
        if not line.strip():
            return None, True
    return None, False


def _from_version_file(package: Path) -> str | None:
    text = _text(package / "_version.py")
    m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", text)
    return m.group(1) if m else None


def _text(path: Path) -> str:
    return _read(path, METADATA_LIMIT).decode("utf-8", errors="replace")


def _read(path: Path, limit: int, head: bool = False) -> bytes:
    """A metadata file's bytes, read as hostile (regular files only, never blocking, capped);
    empty if it is missing or unfit, so the release is looked for elsewhere."""
    try:
        return read_regular(path, limit, "metadata", head=head)
    except FatalError:
        return b""


def _from_git_tag(git_root: Path) -> str | None:
    """A release tag on HEAD (plain git: no gitpython on the read-only paths)."""
    import subprocess  # only for a checkout without a version file

    try:
        out = subprocess.run(
            ("git", "-C", str(git_root), "tag", "--points-at", "HEAD"),
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    tags = [m.group(1) for t in out.split() if (m := re.match(_RELEASE, t))]
    return tags[0] if len(tags) == 1 else None


def _git_inputs(root: Path) -> list[Path] | None:
    """The paths a release tag read by :func:`_from_git_tag` rests on, or None."""
    if any(k.startswith("GIT_") and not k.startswith(_GIT_HARMLESS) for k in os.environ):
        return None
    git = root / ".git"
    try:
        if not stat.S_ISDIR(os.lstat(git).st_mode) or os.path.lexists(git / "commondir"):
            return None
    except OSError:
        return None
    home = Path(os.path.expanduser("~"))
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "git" / "config"
    found = [root, *(git / p for p in (*_GIT_PATHS, *_GIT_HEADS))]  # .git: among inputs' own
    found += [Path("/etc/gitconfig"), home / ".gitconfig", config]
    for top in _GIT_REFS:  # a ref written anew is a new entry of its folder (git renames it in)
        refs = _under(git / top, _GIT_REF_LIMIT - len(found))
        if refs is None:
            return None
        found += refs
    return found


def _under(top: Path, limit: int) -> list[Path] | None:
    """``top`` and everything under it (links not followed), or None past ``limit`` paths or
    where ``top`` is itself a link (what it points to is not the checkout's)."""
    if os.path.islink(top):
        return None
    found, folders = [top], [top]
    while folders:
        try:
            with os.scandir(folders.pop()) as it:
                for entry in it:
                    found.append(Path(entry.path))
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
        except OSError:  # missing or no folder: its fingerprint tells
            pass
        if len(found) > limit:
            return None
    return found
