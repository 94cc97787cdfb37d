"""The three kernel variants of one tree, as texts written into a private build folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sglang_dsv4_fix import provenance
from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.kernel import classify
from sglang_dsv4_fix.rewrite import rewrite
from sglang_dsv4_fix.tree import Tree

Name = Literal["original", "barrier", "no-init"]
NAMES: tuple[Name, ...] = ("original", "barrier", "no-init")
FIXED: tuple[Name, ...] = ("barrier", "no-init")


@dataclass(frozen=True)
class Variant:
    release: str  # the tree's label: its release ("unknown" without one), see label()
    name: Name
    kernel: Path  # the variant's c_plan.cuh, inside the build folder
    include: Path  # the tree's own <kernel root>/include (read, never written)

    @property
    def label(self) -> str:
        return f"{self.release}/{self.name}"


def label(tree: Tree) -> str:
    """The release, marked ``+unknown-base`` where ``apply`` rewrote a file no manifest knows."""
    release = tree.release or "unknown"
    record = provenance.read(tree.kernel_path) if tree.kernel_path is not None else None
    return (
        f"{release}+unknown-base"
        if record is not None and record.method == "structural"
        else release
    )


def prepare(
    tree: Tree, names: tuple[Name, ...], build_dir: Path, release: str | None = None
) -> list[Variant]:
    """Write each requested variant of ``tree``'s kernel under ``build_dir``; the tree is untouched.

    ``release`` labels the variants (default: ``label(tree)``) and names their build folder.
    """
    if tree.kernel_path is None:
        raise FatalError(f"{tree.package_dir}: no DeepSeek-V4 planner kernel", Exit.NOT_APPLICABLE)
    release = release or label(tree)
    texts = _texts(tree.kernel_path, names)
    out = []
    for name in names:
        folder = build_dir / release / name
        folder.mkdir(parents=True, exist_ok=True)
        kernel = folder / "c_plan.cuh"
        data = texts[name].encode("utf-8")
        if not kernel.is_file() or kernel.read_bytes() != data:  # same bytes: ninja keeps the build
            kernel.write_bytes(data)
        out.append(Variant(release, name, kernel, tree.kernel_root / "include"))
    return out


def _texts(kernel: Path, names: tuple[Name, ...]) -> dict[Name, str]:
    current = kernel.read_bytes().decode("utf-8")
    state = classify(current).variant
    original = _original(kernel, current, state)
    texts: dict[Name, str] = {}
    for name in names:
        if name == state:
            texts[name] = current
        elif original is None:
            raise FatalError(
                f"{kernel}: the kernel is {state} and no racy original is at hand (no backup "
                f"from 'apply'), so the {name} variant cannot be built; ask for --variants {state}",
                Exit.NOT_APPLICABLE if state != "unknown" else Exit.UNKNOWN,
            )
        else:
            texts[name] = original if name == "original" else rewrite(original, name)
    return texts


def _original(kernel: Path, current: str, state: str) -> str | None:
    """The racy text: the file itself, or the backup ``apply`` left beside it."""
    if state == "racy-init":
        return current
    record = provenance.read(kernel)
    backup = kernel.parent / record.backup if record is not None else None
    if backup is None or not backup.is_file():
        return None
    text = backup.read_bytes().decode("utf-8")
    return text if classify(text).variant == "racy-init" else None
