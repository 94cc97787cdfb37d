"""What a tree's kernel is right now: bytes, variant, manifest match, provenance. Read-only, light.

Known bytes (a release's original or fix) are looked up by sha256 in the manifest; the kernel is
parsed only when a caller asks for its classification (unknown bytes, ``status``'s precondition list).
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from sglang_dsv4_fix import manifest
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import KERNEL_LIMIT, held, read_regular, sha256_bytes
from sglang_dsv4_fix.manifest import Release
from sglang_dsv4_fix.tree import Tree, record_path

if TYPE_CHECKING:  # the parser is imported only for bytes the manifest does not know
    from sglang_dsv4_fix.kernel import Classification
    from sglang_dsv4_fix.provenance import Provenance


class KernelState:
    """One read of a tree's kernel and of everything recorded about it."""

    def __init__(self, tree: Tree, data: bytes, m: manifest.Manifest) -> None:
        assert tree.kernel_path is not None
        self.tree = tree
        self.kernel = tree.kernel_path
        self.data = data
        self.sha256 = sha256_bytes(data)
        self.bases: list[Release] = m.bases(
            self.sha256, tree.layout
        )  # releases shipping these bytes
        self.produced: list[tuple[Release, str]] = m.produced(self.sha256, tree.layout)
        self.expected: Release | None = m.release(tree.release)  # the tree's own release
        self.record: Provenance | None = None
        self.record_damage: str | None = None  # why the record beside the kernel is not trusted
        # the record's reader only where there is one: a tree as released has none, and every
        # SGLang process would import it for nothing (docs/plugin.md, "Cost")
        if held(self.kernel.parent) is not None or os.path.lexists(record_path(self.kernel)):
            from sglang_dsv4_fix import provenance

            try:
                self.record = provenance.read(self.kernel)
            except FatalError as e:
                self.record_damage = str(e)

    @cached_property
    def classification(self) -> Classification:
        """The parsed kernel0 (costly: only for unknown bytes or a full report)."""
        return _classify(self.data)

    @property
    def variant(self) -> str:
        """The variant, from the manifest for known bytes, else from the parser."""
        if self.produced:
            return self.produced[0][1]
        if self.bases:
            return self.bases[0].variant
        return self.classification.variant

    @property
    def safe(self) -> bool:
        """A fix whose launch-geometry preconditions hold (known fixes were checked at backport)."""
        if self.produced:
            return True
        if self.bases:  # a release's own bytes: the manifest says whether they are fixed
            return self.bases[0].fixed_upstream
        return self.classification.safe

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")

    @property
    def ours(self) -> bool:
        """The bytes are what this tool wrote, as its (trusted) record says."""
        return self.record is not None and self.record.result_sha256 == self.sha256


def inspect(tree: Tree) -> KernelState:
    """Read the kernel of ``tree`` (which must have one) and everything known about it."""
    assert tree.kernel_path is not None
    try:
        data = read_regular(tree.kernel_path, KERNEL_LIMIT, "kernel")
    except OSError as e:  # a folder, a dangling link, unreadable: say so, not a traceback
        raise FatalError(
            f"{tree.kernel_path}: cannot read the kernel ({e.strerror})", Exit.NOT_FOUND
        ) from e
    return KernelState(tree, data, manifest.load())


def _classify(data: bytes) -> Classification:
    from sglang_dsv4_fix.kernel import Classification, classify

    if b"\0" in data:
        return Classification("unknown", "the kernel file is binary, not CUDA source")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return Classification(
            "unknown", f"the kernel file is not UTF-8 text ({e.reason} at byte {e.start})"
        )
    return classify(text)
