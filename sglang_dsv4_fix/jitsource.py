"""The planner loaders' source hash: the 16 hex a build's name carries (0.5.13+).

What ``jitnames.not_current`` falls back to when no sidecar of ours speaks for a build, and what
the inventory (jitcache.py) computes for every candidate source. Kept out of jitnames.py, which
every SGLang process imports whose cache is looked at: a process whose only build is one we
compiled never imports this (docs/plugin.md, "Cost"). Stdlib and fsops only, no regular
expressions: the loaders' include patterns are scanned for with string operations.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import TYPE_CHECKING

from sglang_dsv4_fix.fsops import KERNEL_LIMIT, read_regular
from sglang_dsv4_fix.jitnames import CUDA_FILE
from sglang_dsv4_fix.jitroot import MODULE

if TYPE_CHECKING:
    from sglang_dsv4_fix.jitnames import Scheme
    from sglang_dsv4_fix.tree import Tree

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
