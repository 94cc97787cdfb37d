from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix.errors import Exit, FatalError
from sglang_dsv4_fix.tree import find_tree

PRE = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
POST = "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh"


@pytest.mark.parametrize("sub", ["", "python", "python/sglang"])
def test_git_checkout_from_any_level(sub: str, tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    tree = find_tree(root / sub)
    assert (tree.kind, tree.layout, tree.release, tree.release_source) == (
        "git",
        "pre-refactor",
        "0.5.16",
        "git tag",
    )
    assert tree.kernel_path == root / "python" / PRE
    assert tree.kernel_relpath == f"python/{PRE}"


@pytest.mark.parametrize("sub", ["", "sglang"])
def test_installed_package_from_site_packages_or_package(
    sub: str, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed("0.5.17", tmp_path / "sp")
    tree = find_tree(root / sub)
    assert (tree.kind, tree.layout, tree.release) == ("installed", "post-refactor", "0.5.17")
    assert tree.kernel_path == root / POST
    assert tree.loader_module == "sglang.kernels.ops.attention.dsv4.compress"


def test_release_from_version_file_without_dist_info(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed("0.5.14", tmp_path / "sp")
    shutil.rmtree(next(root.glob("sglang-*.dist-info")))
    tree = find_tree(root)
    assert (tree.kind, tree.release, tree.release_source) == (
        "package",
        "0.5.14",
        "sglang/_version.py",
    )


@pytest.mark.parametrize("before", [4096 - 10, 4096, 40_000])
def test_release_from_a_version_header_past_the_head_read(
    before: int, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """Only the first 4 KB of METADATA is read when Version is there; a Version line cut by that
    edge, or further down, is still read whole (from the whole file)."""
    root = tree_factory.installed("0.5.17", tmp_path / "sp")
    metadata = next(root.glob("sglang-*.dist-info")) / "METADATA"
    lines = metadata.read_text().splitlines(keepends=True)
    version = next(line for line in lines if line.startswith("Version:"))
    rest = "".join(line for line in lines if line is not version)
    first, _, body = rest.partition("\n")  # Metadata-Version, then a Summary to fill the bytes
    head = f"{first}\nSummary: {'x' * (before - len(first) - 11)}\n"
    assert len(head.encode()) == before
    metadata.write_text(head + version + body)
    tree = find_tree(root)
    assert (tree.release, tree.release_source) == ("0.5.17", "dist-info")


def test_untagged_checkout_has_unknown_release(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    subprocess.run(
        ["git", "-C", str(root), "tag", "-d", "v0.5.16"], check=True, capture_output=True
    )
    assert (find_tree(root).release, find_tree(root).release_source) == (None, "unknown")


def test_default_is_the_importable_sglang(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    code = "from sglang_dsv4_fix.tree import find_tree; import sys; t = find_tree(None); print(t.release, 'sglang' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["0.5.16", "False"]  # found, never imported


def test_two_kernels_in_one_tree_is_an_error(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    (root / POST).parent.mkdir(parents=True)
    shutil.copy(root / PRE, root / POST)
    with pytest.raises(FatalError) as e:
        find_tree(root)
    assert e.value.code == Exit.UNKNOWN
    assert (
        str(e.value)
        == f"two planner kernels in one tree: {root / PRE} and {root / POST}; refusing to guess"
    )


def test_two_packages_is_an_error(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    shutil.copytree(root / "python" / "sglang", root / "sglang")
    with pytest.raises(FatalError, match="several SGLang packages") as e:
        find_tree(root)
    assert e.value.code == Exit.UNKNOWN


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "no such file or folder"),
        (lambda p: p, "no SGLang package here"),
        (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "not a folder"),
    ],
)
def test_bad_paths(make, message: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FatalError, match=message) as e:
        find_tree(make(tmp_path))
    assert e.value.code == Exit.NOT_FOUND
