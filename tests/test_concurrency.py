"""Many real CLI processes on one tree at once: the folder lock lets exactly one write.

Each process imports everything, then blocks on a start gate (one byte on its stdin) so all of
them hit the tree within a millisecond or so; they are separate interpreters, as on a fleet node
where an init container and an operator run the tool at the same time.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest
from sglang_dsv4_fix.errors import Exit

N = 16
GATED = (
    "import json, os, sys\n"
    "from sglang_dsv4_fix.main import main\n"
    "import sglang_dsv4_fix.commands.apply, sglang_dsv4_fix.commands.revert\n"
    "os.read(0, 1)\n"
    "sys.exit(main(json.loads(sys.argv[1])))\n"
)
RECORD = ".c_plan.cuh.sglang-dsv4-fix.json"
BACKUP = ".c_plan.cuh.sglang-dsv4-fix.orig"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def race(argvs: list[list[str]]) -> list[tuple[int, dict, str]]:  # type: ignore[type-arg]
    """Start one process per argv, release them together, return (exit, JSON out, stderr)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GATED, json.dumps([*argv, "--json"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv in argvs
    ]
    for p in procs:  # all children are blocked in os.read by now or soon; none has started
        assert p.stdin is not None
        p.stdin.write(b"x")
        p.stdin.flush()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, json.loads(out) if out else {}, err.decode()))
    return results


def kernel_of(root: Path, version: str, git: bool) -> Path:
    rel = manifest.load().release(version)
    assert rel is not None
    return root / ("python" if git else "") / rel.path


@pytest.mark.parametrize(("kind", "version"), [("installed", "0.5.16"), ("git", "0.5.17")])
def test_16_concurrent_applies_write_once(
    tree_factory: TreeFactory, tmp_path: Path, kind: str, version: str
) -> None:
    root = getattr(tree_factory, kind)(version, tmp_path / "tree")
    kernel = kernel_of(root, version, kind == "git")
    original = sha(kernel)
    results = race([["apply", "--tree", str(root)]] * N)
    assert [r[0] for r in results] == [Exit.OK] * N, [r[2] for r in results]
    writers = [out for _, out, _ in results if out["written"]]
    others = [out for _, out, _ in results if not out["written"]]
    assert len(writers) == 1
    assert {o["message"] for o in others} == {"already fixed (no-init); nothing to do"}
    fixed = manifest.load().release(version).results["no-init"].sha256  # type: ignore[union-attr]
    assert sha(kernel) == fixed == writers[0]["result_sha256"]
    record = json.loads((kernel.parent / RECORD).read_text())
    assert (record["state"], record["base_sha256"], record["result_sha256"]) == (
        "applied",
        original,
        fixed,
    )
    assert sha(kernel.parent / BACKUP) == original
    assert not list(kernel.parent.glob("*.tmp"))


def test_16_concurrent_reverts_restore_once(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = kernel_of(root, "0.5.16", False)
    pristine = {p.name: sha(p) for p in kernel.parent.iterdir()}
    [(code, _, _)] = race([["apply", "--tree", str(root)]])
    assert code == Exit.OK
    results = race([["revert", "--tree", str(root)]] * N)
    assert [r[0] for r in results] == [Exit.OK] * N, [r[2] for r in results]
    assert sum(out["reverted"] for _, out, _ in results) == 1
    assert {p.name: sha(p) for p in kernel.parent.iterdir()} == pristine


def test_applies_and_reverts_racing_leave_a_consistent_tree(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """8 apply + 8 revert at once: whatever the order, the end state is one of the two, whole."""
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = kernel_of(root, "0.5.16", False)
    original = sha(kernel)
    fixed = manifest.load().release("0.5.16").results["no-init"].sha256  # type: ignore[union-attr]
    for _ in range(3):
        argvs = [["apply" if i % 2 else "revert", "--tree", str(root)] for i in range(N)]
        results = race(argvs)
        assert [r[0] for r in results] == [Exit.OK] * N, [r[2] for r in results]
        names = sorted(p.name for p in kernel.parent.iterdir() if p.name.startswith("."))
        if sha(kernel) == fixed:
            assert names == [RECORD, BACKUP]
            assert json.loads((kernel.parent / RECORD).read_text())["state"] == "applied"
            assert sha(kernel.parent / BACKUP) == original
        else:
            assert sha(kernel) == original
            assert names == []
