"""Git checkouts: refuse foreign uncommitted changes, commit just the kernel. Uses gitpython."""

from __future__ import annotations

from pathlib import Path

from sglang_dsv4_fix.errors import Exit, FatalError

FIX_PR = "sgl-project/sglang#32467"
FIX_COMMIT = "8549cce11b878d2fbf814d5e27bcc5e626890e70"


def _repo(root: Path):  # type: ignore[no-untyped-def]
    import git  # heavy: only on the paths that touch a checkout

    try:
        return git.Repo(root)
    except git.exc.GitError as e:
        raise FatalError(f"{root}: not a usable git checkout ({e})", Exit.REFUSED) from e


def uncommitted(root: Path, relpath: str) -> bool:
    """The kernel differs from HEAD (or is untracked) in the checkout at ``root``."""
    return bool(_repo(root).git.status("--porcelain", "--", relpath).strip())


def commit(root: Path, relpath: str, message: str) -> str:
    """Commit only ``relpath`` (other staged changes stay staged); returns the new commit's sha."""
    import git

    repo = _repo(root)
    try:
        repo.git.add("--", relpath)
        repo.git.commit("--only", "-m", message, "--", relpath)
    except git.exc.GitCommandError as e:
        raise FatalError(f"git commit failed: {e.stderr.strip() or e}", Exit.REFUSED) from e
    return str(repo.head.commit.hexsha)


def apply_message(variant: str, base_release: str | None, base_sha: str, result_sha: str) -> str:
    return (
        f"deepseek_v4: fix the kernel0 shared-memory race ({variant})\n\n"
        f"Backport of {FIX_PR} (upstream {FIX_COMMIT}) by sglang-dsv4-fix.\n\n"
        f"Variant: {variant}\nBase release: {base_release or 'unknown'}\n"
        f"Base sha256: {base_sha}\nResult sha256: {result_sha}\n"
    )


def revert_message(base_sha: str) -> str:
    return (
        "deepseek_v4: revert the sglang-dsv4-fix kernel0 patch\n\n"
        f"Restores the original c_plan.cuh (sha256 {base_sha}); see {FIX_PR}.\n"
    )
