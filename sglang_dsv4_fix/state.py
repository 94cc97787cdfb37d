"""What a tree's kernel is right now: bytes, verdict, manifest match, provenance. Read-only, light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_dsv4_fix import manifest, provenance
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.fsops import sha256_bytes, sha256_file
from sglang_dsv4_fix.kernel import Verdict, classify
from sglang_dsv4_fix.manifest import Release
from sglang_dsv4_fix.tree import Tree


@dataclass(frozen=True)
class KernelState:
    tree: Tree
    data: bytes
    sha256: str
    verdict: Verdict
    bases: list[Release]  # releases whose original kernel has these bytes
    produced: list[tuple[Release, str]]  # (base release, variant) whose patched result it is
    expected: Release | None  # the manifest entry of the tree's own release
    record: provenance.Provenance | None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")

    @property
    def known(self) -> bool:
        return bool(self.bases or self.produced)

    @property
    def ours(self) -> bool:
        """The bytes are what this tool wrote, as its record says."""
        return self.record is not None and self.record.result_sha256 == self.sha256

    @property
    def drift(self) -> str | None:
        """Why the bytes do not belong to the tree's own release, if its release is known."""
        rel = self.expected
        if rel is None or not rel.applicable:
            return None
        allowed = {rel.sha256, *(r.sha256 for r in rel.results.values())}
        if self.sha256 in allowed:
            return None
        return f"sha256 {self.sha256[:16]}… is neither release {rel.version}'s kernel nor its fix"

    @property
    def backup(self) -> str | None:
        assert self.tree.kernel_path is not None
        path = provenance.backup_path(self.tree.kernel_path)
        return str(path) if path.exists() else None

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "kernel": str(self.tree.kernel_path),
            "sha256": self.sha256,
            "variant": v.variant,
            "reason": v.reason,
            "safe": v.safe,
            "preconditions": [
                {"name": p.name, "ok": p.ok, "detail": p.detail} for p in v.preconditions
            ],
            "known_base": [r.version for r in self.bases],
            "produced_from": [f"{r.version}:{variant}" for r, variant in self.produced],
            "drift": self.drift,
            "provenance": None if self.record is None else self.record.__dict__,
            "backup": self.backup,
        }


def inspect(tree: Tree) -> KernelState:
    """Read the kernel of ``tree`` (which must have one) and everything known about it."""
    assert tree.kernel_path is not None
    try:
        data = tree.kernel_path.read_bytes()
    except OSError as e:  # a folder, a dangling link, unreadable: say so, not a traceback
        raise FatalError(
            f"{tree.kernel_path}: cannot read the kernel ({e.strerror})", Exit.NOT_FOUND
        ) from e
    sha = sha256_bytes(data)
    m = manifest.load()
    return KernelState(
        tree=tree,
        data=data,
        sha256=sha,
        verdict=_classify(data),
        bases=m.bases(sha, tree.layout),
        produced=m.produced(sha, tree.layout),
        expected=m.release(tree.release),
        record=provenance.read(tree.kernel_path),
    )


def _classify(data: bytes) -> Verdict:
    if b"\0" in data:
        return Verdict("unknown", "the kernel file is binary, not CUDA source")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return Verdict(
            "unknown", f"the kernel file is not UTF-8 text ({e.reason} at byte {e.start})"
        )
    return classify(text)


def backup_matches(state: KernelState) -> bool:
    """The backup beside the kernel holds the base the record names."""
    if state.record is None or state.tree.kernel_path is None:
        return False
    path = provenance.backup_path(state.tree.kernel_path)
    return path.is_file() and sha256_file(path) == state.record.base_sha256
