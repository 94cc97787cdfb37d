from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix.main import main

KERNEL = "python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("apply", "verify", "revert", "status"))


def test_unknown_flag_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["verify", "--bogus"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_missing_tree_is_one_line_and_exit_7(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--tree", str(tmp_path / "nope")]) == 7
    assert (
        capsys.readouterr().err
        == f"sglang-dsv4-fix: error: {tmp_path / 'nope'}: no such file or folder\n"
    )


def test_check_writes_nothing(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    before = snapshot(root)
    assert main(["apply", "--tree", str(root), "--check"]) == 0
    assert "would write: known base (release 0.5.16)" in capsys.readouterr().out
    assert snapshot(root) == before


def test_git_refuses_foreign_changes_unless_forced(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    kernel = root / KERNEL
    kernel.write_text(kernel.read_text().replace("// === Stage A", "// === local edit, Stage A"))
    before = snapshot(root)
    assert main(["apply", "--tree", str(root)]) == 6
    assert capsys.readouterr().err == (
        f"sglang-dsv4-fix: error: {KERNEL} has uncommitted changes not made by sglang-dsv4-fix; "
        f"commit or stash them, or run: sglang-dsv4-fix apply --force --tree {root}\n"
    )
    assert snapshot(root) == before
    assert main(["apply", "--tree", str(root), "--force"]) == 0
    assert "base is unknown" in capsys.readouterr().out
    # a 0.5.16 tree whose fix is not the manifest's: pinned by the sha256 our record wrote
    assert main(["verify", "--tree", str(root), "--strict"]) == 0
    assert "VERIFIED: no-init, the sha256 sglang-dsv4-fix recorded" in capsys.readouterr().out


def test_commit_records_the_fix(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.git("0.5.13", tmp_path / "co")
    assert main(["apply", "--tree", str(root), "--commit"]) == 0
    git = ["git", "-C", str(root)]
    message = subprocess.run(
        [*git, "log", "-1", "--format=%B"], capture_output=True, text=True, check=True
    ).stdout
    changed = subprocess.run(
        [*git, "show", "--name-only", "--format="], capture_output=True, text=True, check=True
    ).stdout
    assert changed.split() == [KERNEL]
    assert (
        "sgl-project/sglang#32467" in message
        and "8549cce11b878d2fbf814d5e27bcc5e626890e70" in message
    )
    assert "Variant: no-init" in message and "Base sha256: 9ce705c08de18ee1" in message


def test_fork_is_rewritten_structurally(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.15", tmp_path / "sp")
    next(root.glob("sglang-*.dist-info")).joinpath("METADATA").write_text(
        "Name: sglang\nVersion: 0.5.15+fork\n"
    )
    kernel = root / KERNEL.removeprefix("python/")
    kernel.write_bytes(kernel.read_bytes().replace(b"\n", b"\r\n"))
    assert main(["apply", "--tree", str(root), "--variant", "barrier", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["written"] and "base is unknown" in out["message"]
    assert main(["verify", "--tree", str(root), "--require-variant", "barrier"]) == 0
    assert b"\r\n  __syncthreads();\r\n" in kernel.read_bytes()


def test_unknown_kernel_is_refused(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = root / KERNEL.removeprefix("python/")
    kernel.write_text(kernel.read_text().replace("warp_max[warp_id] = ", "warp_max[lane_id] = "))
    before = snapshot(root)
    assert main(["apply", "--tree", str(root)]) == 3
    assert "kernel0 not recognised" in capsys.readouterr().err
    assert snapshot(root) == before


def test_revert_refuses_a_file_we_did_not_write(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    kernel = root / KERNEL.removeprefix("python/")
    assert main(["apply", "--tree", str(root)]) == 0
    kernel.write_text(kernel.read_text() + "// operator edit\n")
    assert main(["revert", "--tree", str(root)]) == 6
    assert "is not what sglang-dsv4-fix wrote" in capsys.readouterr().err


def test_status_shows_provenance(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["apply", "--tree", str(root), "--variant", "barrier"]) == 0
    capsys.readouterr()
    assert main(["status", "--tree", str(root)]) == 0
    out = capsys.readouterr().out
    assert "variant:       barrier" in out
    assert "provenance:    barrier by sglang-dsv4-fix 0.1.0" in out
    assert "manifest:      original of -; fix of 0.5.16:barrier" in out


def test_verify_path_imports_nothing_heavy(tree_factory: TreeFactory, tmp_path: Path) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    code = (
        "import sys; from sglang_dsv4_fix.main import main; rc = main(['verify', '--tree', sys.argv[1]]);"
        "heavy = [m for m in ('torch', 'git', 'sglang', 'unidiff', 'tvm_ffi') if m in sys.modules];"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True
    ).stdout
    assert out.splitlines()[-1] == "HEAVY []"


def test_a_checkout_git_calls_dubious_is_a_one_line_refusal(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    if os.geteuid() != 0:
        pytest.skip("needs root to give the checkout to another owner")
    for path in (root, root / ".git"):
        os.chown(path, 65534, 65534)  # nobody: git now refuses the checkout for root
    before = snapshot(root)
    assert main(["apply", "--tree", str(root)]) == 6
    err = capsys.readouterr().err
    assert err.startswith(
        f"sglang-dsv4-fix: error: git status of {KERNEL} failed: fatal: detected dubious ownership"
    ), err
    assert len(err.splitlines()) == 1
    assert snapshot(root) == before


def test_commit_outside_a_checkout_is_refused_before_any_write(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    before = snapshot(root)
    assert main(["apply", "--tree", str(root), "--commit"]) == 6
    assert capsys.readouterr().err == (
        f"sglang-dsv4-fix: error: --commit needs a git checkout; {root} is not one\n"
    )
    assert snapshot(root) == before


def test_a_failed_commit_restores_the_kernel_and_the_index(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'policy: no kernel edits' >&2\nexit 1\n")
    hook.chmod(0o755)
    git = ["git", "-C", str(root)]
    index_before = (root / ".git" / "index").read_bytes()
    kernel_before = (root / KERNEL).read_bytes()
    assert main(["apply", "--tree", str(root), "--commit"]) == 6
    err = capsys.readouterr().err
    assert err.startswith("sglang-dsv4-fix: error: git commit failed: "), err
    assert err.rstrip().endswith("; the kernel and the index were restored"), err
    assert (root / KERNEL).read_bytes() == kernel_before
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == "", status.stdout
    del index_before  # git rewrites the index's stat cache; what matters is that it is clean


def test_commit_without_a_git_identity_is_refused_before_any_write(
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    for name in (
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("EMAIL", "")
    before = snapshot(root)
    assert main(["apply", "--tree", str(root), "--commit", "--check"]) == 6
    assert main(["apply", "--tree", str(root), "--commit"]) == 6
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(
        "sglang-dsv4-fix: error: git has no identity to commit with (set user.name and "
        "user.email): "
    ), err
    assert snapshot(root) == before
