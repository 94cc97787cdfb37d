"""Read and apply the shipped unified diffs in-process (never ``git apply`` from a random cwd)."""

from __future__ import annotations

from pathlib import PurePosixPath

from sglang_dsv4_fix.errors import Exit, FatalError


def parse_single(patch: str, expected_path: str) -> object:
    """The one file of ``patch``; refuses several files, absolute paths or ``..``."""
    from unidiff.errors import UnidiffParseError
    from unidiff.patch import PatchSet

    try:
        files = PatchSet(patch)
    except UnidiffParseError as e:
        raise FatalError(f"malformed patch: {e}", Exit.UNKNOWN) from e
    if len(files) != 1:
        raise FatalError(
            f"a patch must change exactly one file, this one has {len(files)}", Exit.REFUSED
        )
    only = files[0]
    for name in (only.source_file, only.target_file):
        _check_path(name)
    if only.path != expected_path:
        raise FatalError(f"patch is for {only.path}, not {expected_path}", Exit.REFUSED)
    return only


def _check_path(name: str) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() and name != "/dev/null":
        raise FatalError(f"patch names an absolute path: {name}", Exit.REFUSED)
    if ".." in path.parts:
        raise FatalError(f"patch names a path outside the tree: {name}", Exit.REFUSED)


def apply(text: str, patch: str, expected_path: str) -> str:
    """``text`` with the patch's hunks applied at their exact lines (no fuzz, no offset)."""
    patched = parse_single(patch, expected_path)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for hunk in patched:  # type: ignore[attr-defined]
        start = hunk.source_start - 1
        source = [line.value for line in hunk if not line.is_added]
        if lines[start : start + len(source)] != source:
            raise FatalError(f"patch hunk at line {hunk.source_start} does not match", Exit.UNKNOWN)
        out += lines[cursor:start]
        out += [line.value for line in hunk if not line.is_removed]
        cursor = start + len(source)
    out += lines[cursor:]
    return "".join(out)


def make(before: str, after: str, path: str) -> str:
    """A ``git apply``-able unified diff of one file (``path`` relative to the checkout root)."""
    import difflib

    if not before.endswith("\n") or not after.endswith("\n"):
        raise ValueError("kernel files end with a newline; refusing to emit a marker-less diff")
    body = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(body)
