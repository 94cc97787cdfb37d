"""Permission errors, seen by a user root's override does not cover (see unprivileged.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from trees import TreeFactory
from unprivileged import give_away, install, open_up, run_cli

from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main

KERNEL = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
RECORD = ".c_plan.cuh.sglang-dsv4-fix.json"


@dataclass
class World:
    """A world-readable folder (pytest's tmp_path is 0700): the package, a home, a tree."""

    base: Path
    site: Path
    home: Path

    def tree(self, factory: TreeFactory, version: str = "0.5.16") -> tuple[Path, Path]:
        root = factory.installed(version, self.base / "sp")
        open_up(root)
        return root, root / KERNEL

    def cli(self, *argv: str) -> tuple[int, str, str]:
        res = run_cli(self.site, self.home, list(argv))
        return res.returncode, res.stdout, res.stderr


@pytest.fixture
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="sglang-dsv4-fix-unprivileged-"))
    try:
        base.chmod(0o755)
        home = base / "home"
        home.mkdir()
        give_away(home)
        yield World(base, install(base / "site"), home)
    finally:
        shutil.rmtree(base)


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("command", ["verify", "status"])
def test_unreadable_kernel_is_one_line(
    tree_factory: TreeFactory, world: World, command: str
) -> None:
    root, kernel = world.tree(tree_factory)
    kernel.chmod(0)
    code, out, err = world.cli(command, "--tree", str(root))
    assert (code, out) == (Exit.NOT_FOUND, "")
    assert err == f"sglang-dsv4-fix: error: {kernel}: cannot read the kernel (Permission denied)\n"


def test_unreadable_record_is_a_note_not_trusted(tree_factory: TreeFactory, world: World) -> None:
    root, kernel = world.tree(tree_factory)
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    record = kernel.with_name(RECORD)
    record.chmod(0)
    code, out, err = world.cli("verify", "--tree", str(root))
    # the bytes are a known fix, so verify passes; the record it could not read is not trusted
    assert (code, err) == (Exit.OK, "")
    assert out.splitlines()[1] == (
        f"  note: provenance record damaged, not trusted: {record}: damaged provenance record "
        "(cannot read the provenance record (Permission denied)); not acting on it"
    )


def test_apply_into_a_read_only_folder_is_refused(tree_factory: TreeFactory, world: World) -> None:
    root, kernel = world.tree(tree_factory)
    give_away(root)  # the kernel is the user's and writable; its folder is not
    kernel.parent.chmod(0o555)
    before = snapshot(root)
    code, _out, err = world.cli("apply", "--tree", str(root), "--no-clear-cache")
    assert snapshot(root) == before
    assert (code, err) == (
        Exit.REFUSED,
        f"sglang-dsv4-fix: error: {kernel.parent}: the kernel's folder is not writable for this user; "
        "nothing changed\n",
    )
