from __future__ import annotations

import json
import os
import re
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
        "heavy = [m for m in ('torch', 'git', 'sglang', 'unidiff', 'tvm_ffi', 'argcomplete') if m in sys.modules];"
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


# --------------------------------------------------------------------------- many trees


def test_many_trees_one_line_each_most_severe_exit(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    racy = tree_factory.installed("0.5.16", tmp_path / "racy")
    fixed = tree_factory.installed("0.5.18", tmp_path / "fixed")
    old = tree_factory.installed("0.5.11", tmp_path / "old")
    missing = tmp_path / "nope"
    trees = ["--tree", str(fixed), "--tree", str(racy), "--tree", str(missing), "--tree", str(old)]
    assert main(["verify", *trees]) == 1  # racy outranks not found (7) and not applicable (4)
    cap = capsys.readouterr()
    kernel = "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh"
    assert cap.out.splitlines() == [
        f"{fixed / kernel}: VERIFIED: no-init, release 0.5.18's own kernel (fixed upstream) "
        "(sha256 b0d792dc409ea18a…)",
        f"{racy / KERNEL.removeprefix('python/')}: RACY: racy-init kernel0 (sgl-project/sglang#32467)"
        f" (run: sglang-dsv4-fix apply --tree {racy})",
        f"{old / 'sglang'}: NOT APPLICABLE: no DeepSeek-V4 planner in this tree (release 0.5.11); "
        "not affected",
    ]
    assert cap.err == f"sglang-dsv4-fix: error: {missing}: no such file or folder\n"
    assert main(["verify", *trees[:2], *trees[4:]]) == 7  # not found outranks not applicable
    assert main(["verify", "--allow-not-applicable", *trees[:2], *trees[6:]]) == 0


def test_many_trees_json_is_an_array_in_order(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    racy = tree_factory.installed("0.5.16", tmp_path / "racy")
    fixed = tree_factory.installed("0.5.18", tmp_path / "fixed")
    missing = tmp_path / "nope"
    trees = ["--tree", str(racy), "--tree", str(missing), "--tree", str(fixed)]
    assert main(["verify", "--json", *trees]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [(o["tree"], o["exit"]) for o in out] == [
        (str(racy), 1),
        (str(missing), 7),
        (str(fixed), 0),
    ]
    assert out[0]["state"] == "racy" and out[2]["state"] == "verified"
    assert out[1] == {"command": "verify", "tree": str(missing), "exit": 7,
                      "error": f"{missing}: no such file or folder"}  # fmt: skip
    assert main(["status", "--json", *trees]) == 7  # status is informational; not found is not
    assert [o["exit"] for o in json.loads(capsys.readouterr().out)] == [1, 7, 0]
    assert main(["verify", "--json", "--tree", str(fixed)]) == 0  # one tree: one object
    assert json.loads(capsys.readouterr().out)["state"] == "verified"


def test_apply_and_revert_many_trees(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tree_factory.installed("0.5.16", tmp_path / "a")
    b = tree_factory.git("0.5.13", tmp_path / "b")
    trees = ["--tree", str(a), "--tree", str(b)]
    assert main(["apply", *trees]) == 0
    assert [ln.split(": ", 1)[1] for ln in capsys.readouterr().out.splitlines()] == [
        "wrote: known base (release 0.5.16); no-init -> sha256 e5fc32a523b4bbc2…",
        "wrote: known base (release 0.5.13, 0.5.13.post1, 0.5.14); no-init"
        f" -> sha256 {_fixed_sha('0.5.13')[:16]}…",
    ]
    assert main(["verify", *trees]) == 0
    capsys.readouterr()
    assert main(["revert", "--dry-run", "--json", *trees]) == 0
    assert [o["would_revert"] for o in json.loads(capsys.readouterr().out)] == [True, True]
    assert main(["revert", *trees]) == 0
    assert main(["verify", *trees]) == 1


def _fixed_sha(version: str) -> str:
    from sglang_dsv4_fix import manifest

    release = manifest.load().release(version)
    assert release is not None
    return release.results["no-init"].sha256


def test_single_tree_commands_refuse_several(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["clear-cache", "--tree", "a", "--tree", "b"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "sglang-dsv4-fix clear-cache: error: --tree: clear-cache takes one tree "
        "(several: apply, verify, revert, status)"
    )


# --------------------------------------------------------------------------- operator habits


def test_version_short_and_long(capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_dsv4_fix import __version__

    for flag in ("-V", "--version"):
        with pytest.raises(SystemExit) as e:
            main([flag])
        assert e.value.code == 0
        assert capsys.readouterr().out == f"sglang-dsv4-fix {__version__}\n"


@pytest.mark.parametrize("name", ["apply", "verify", "revert", "status", "clear-cache", "prewarm"])
def test_each_subcommand_shows_its_own_usage_on_its_errors(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main([name, "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"usage: sglang-dsv4-fix {name} [-h] [-q | -v] [--tree PATH]")
    assert err[-1] == f"sglang-dsv4-fix {name}: error: unrecognized arguments: --bogus"


def test_bare_path_suggests_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["verify", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("usage: sglang-dsv4-fix verify ")
    assert err[-1] == (
        f"sglang-dsv4-fix verify: error: unrecognized arguments: {tmp_path} "
        f"(did you mean --tree {tmp_path}?)"
    )


def test_bad_choice_shows_the_subcommand_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["apply", "--variant", "nope"])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("usage: sglang-dsv4-fix apply ")
    assert err[-1].startswith("sglang-dsv4-fix apply: error: argument --variant: invalid choice")


def test_quiet_prints_only_failing_trees_and_verbose_the_details(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    racy = tree_factory.installed("0.5.16", tmp_path / "racy")
    fixed = tree_factory.installed("0.5.18", tmp_path / "fixed")
    assert main(["verify", "-q", "--tree", str(fixed), "--tree", str(racy)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith(f"(run: sglang-dsv4-fix apply --tree {racy})")
    assert main(["verify", "-q", "--tree", str(fixed)]) == 0
    assert capsys.readouterr().out == ""
    assert main(["-q", "verify", "--tree", str(fixed)]) == 0  # before the command, as pip and git
    assert capsys.readouterr().out == ""
    assert main(["-v", "verify", "--tree", str(fixed)]) == 0
    assert "  pinned by: release 0.5.18's own kernel (fixed upstream)" in capsys.readouterr().out
    assert main(["verify", "-v", "--tree", str(racy)]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"  tree: {racy} (installed); release 0.5.16 (from dist-info); layout pre-refactor",
        "  state: racy (exit 1); variant racy-init; sha256 "
        "6fa3a2a0cef7a4d751f21bfafd09b770bfca92b57cbfc76186d16b337397e497",
        "  problem: racy: the racy init of warp_max/warp_min",
        f"  fix: sglang-dsv4-fix apply --tree {racy}",
    ]


def test_dry_run_and_check_are_one_flag(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    before = snapshot(root)
    for flag in ("--dry-run", "--check"):
        assert main(["apply", flag, "--tree", str(root)]) == 0
        assert "would write: known base (release 0.5.16)" in capsys.readouterr().out
    assert snapshot(root) == before
    assert main(["apply", "--tree", str(root)]) == 0
    patched = snapshot(root)
    for flag in ("--dry-run", "--check"):
        assert main(["revert", flag, "--tree", str(root)]) == 0
        assert capsys.readouterr().out.endswith(
            "would restore the original kernel (sha256 6fa3a2a0cef7a4d7…)\n"
        )
    assert snapshot(root) == patched


# --------------------------------------------------------------------------- revert --commit


def _git_out(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout


def test_revert_commit_outside_git_is_refused_before_any_write(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["apply", "--tree", str(root)]) == 0
    capsys.readouterr()
    patched = snapshot(root)
    assert main(["revert", "--commit", "--tree", str(root)]) == 6
    assert capsys.readouterr().err == (
        f"sglang-dsv4-fix: error: --commit needs a git checkout; {root} is not one\n"
    )
    assert snapshot(root) == patched


def worktree(root: Path) -> dict[str, bytes]:
    """The checkout's files, without .git (whose index git rewrites on every status)."""
    return {k: v for k, v in snapshot(root).items() if not k.startswith(".git/")}


def _no_git_identity(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """git as on a fresh machine: empty HOME, no system config, no identity in the environment."""
    for name in ("AUTHOR", "COMMITTER"):
        for part in ("NAME", "EMAIL"):
            monkeypatch.delenv(f"GIT_{name}_{part}", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def test_revert_commit_without_identity_is_refused_before_any_write(
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    assert main(["apply", "--tree", str(root), "--commit"]) == 0
    capsys.readouterr()
    head = _git_out(root, "rev-parse", "HEAD")
    empty = tmp_path / "empty-home"
    empty.mkdir()
    _no_git_identity(monkeypatch, empty)
    patched, status = worktree(root), _git_out(root, "status", "--porcelain")
    index = _git_out(root, "ls-files", "-s", "--", KERNEL)
    assert main(["revert", "--commit", "--tree", str(root)]) == 6
    assert re.fullmatch(
        r"sglang-dsv4-fix: error: git has no identity to commit with \(set user\.name and "
        r"user\.email\): fatal: unable to auto-detect email address \(got '.*'\)\n",
        capsys.readouterr().err,
    )
    assert worktree(root) == patched
    assert _git_out(root, "rev-parse", "HEAD") == head
    assert _git_out(root, "status", "--porcelain") == status  # index and work tree as before
    assert _git_out(root, "ls-files", "-s", "--", KERNEL) == index


def test_revert_commit_refused_by_a_hook_restores_kernel_and_index(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.git("0.5.16", tmp_path / "co")
    assert main(["apply", "--tree", str(root), "--commit"]) == 0
    capsys.readouterr()
    head = _git_out(root, "rev-parse", "HEAD")
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'policy: no reverts today' >&2\nexit 1\n")
    hook.chmod(0o755)
    patched, status = worktree(root), _git_out(root, "status", "--porcelain")
    index = _git_out(root, "ls-files", "-s", "--", KERNEL)
    assert main(["revert", "--commit", "--tree", str(root)]) == 6
    assert capsys.readouterr().err.endswith("; the patched kernel and the index were restored\n")
    assert worktree(root) == patched  # kernel, record and backup as before revert
    assert _git_out(root, "rev-parse", "HEAD") == head
    assert _git_out(root, "status", "--porcelain") == status  # index and work tree as before
    assert _git_out(root, "ls-files", "-s", "--", KERNEL) == index
    assert main(["verify", "--tree", str(root)]) == 0


# --------------------------------------------------------------------------- progress line

PROGRESS = (
    "import time; from sglang_dsv4_fix.commands._common import progress\n"
    "with progress('compiling the planner', after=0.3):\n"
    "    time.sleep(1.6)\n"
    "print('done', flush=True)\n"
)


def test_progress_line_on_a_terminal() -> None:
    import os
    import pty

    parent, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", PROGRESS], stdout=child, stderr=child)
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(parent, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(parent)
    assert proc.wait() == 0
    assert b"\rcompiling the planner\xe2\x80\xa6 0 s\x1b[K" in seen  # drawn after 0.3 s
    assert b"\rcompiling the planner\xe2\x80\xa6 1 s\x1b[K" in seen  # redrawn each second
    assert seen.endswith(b"\r\x1b[Kdone\r\n")  # erased before the next output


def test_no_progress_line_in_a_pipe() -> None:
    r = subprocess.run([sys.executable, "-c", PROGRESS], capture_output=True, check=True)
    assert (r.stdout, r.stderr) == (b"done\n", b"")


def test_run_again_hints_repeat_the_users_own_command(capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_dsv4_fix.error_handler import error_handler
    from sglang_dsv4_fix.errors import Exit, FatalError

    rerun = "sglang-dsv4-fix apply --tree /srv/img --cache-dir /c"
    with error_handler("sglang-dsv4-fix", rerun=rerun) as r:
        raise FatalError("/k/c_plan.cuh: changed while planning; run again", Exit.REFUSED)
    assert r[0] == 6
    assert capsys.readouterr().err == (
        "sglang-dsv4-fix: error: /k/c_plan.cuh: changed while planning; run again: "
        "sglang-dsv4-fix apply --tree /srv/img --cache-dir /c\n"
    )


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("sglang-dsv4-fix ver", ["verify"]),
        ("sglang-dsv4-fix verify --tr", ["--tree"]),
        ("sglang-dsv4-fix verify --require-variant ", ["no-init", "barrier"]),
        ("sglang-dsv4-fix revert --dry", ["--dry-run"]),
    ],
)
def test_shell_completion_through_argcomplete(tmp_path: Path, line: str, want: list[str]) -> None:
    pytest.importorskip("argcomplete")  # the optional [completion] extra
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}  # fmt: skip
    code = "from sglang_dsv4_fix.main import main; main()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    assert [w.rstrip() for w in out.read_text().split("\x0b")] == want  # one gets a trailing space


def test_stale_build_hint_repeats_the_users_tree_and_cache_dir(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    from test_jitcache import lay_build, real_dir, variant_tree

    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "original")
    cache = tmp_path / "my cache"
    lay_build(cache, *real_dir(tree, "original", cache))  # the racy build, by the loader's name
    assert main(["apply", "--tree", str(tree.root)]) == 0  # clears the default cache, not this one
    capsys.readouterr()
    where = ["--tree", str(tree.root), "--cache-dir", str(cache)]
    fix = shlex.join(["sglang-dsv4-fix", "clear-cache", *where])
    assert main(["status", *where]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(ln for ln in lines if ln.startswith("jit cache:")) == (
        f"jit cache:     {cache}: planner builds of this tree: original x1"
    )
    verdict = next(ln for ln in lines if ln.startswith("verdict:"))
    assert verdict.startswith("verdict:       STALE BUILD: the kernel is verified (no-init)")
    assert verdict.endswith(f"(run: {fix})")
    assert main(["verify", *where]) == 5
    assert capsys.readouterr().out.splitlines()[0].endswith(f"(run: {fix})")


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["status", "--json"], 0),
        (["status"], 0),
        (["verify", "--json"], 1),
        (["verify"], 1),
        (["apply", "--check", "--json"], 0),
    ],
)
def test_a_reader_that_went_away_keeps_the_exit_code(
    tree_factory: TreeFactory, tmp_path: Path, argv: list[str], code: int
) -> None:
    """`... | head` on a racy tree: the closed pipe ends the output, not the verdict's exit code,
    and leaves no traceback (Python ignores SIGPIPE, so every write fails with EPIPE)."""
    installed = tree_factory.installed("0.5.16", tmp_path / "site")
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sglang_dsv4_fix", *argv, "--tree", str(installed)],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (code, b"")
