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


def _git(root: Path, what: str, *args: str) -> str:
    """One git command in the checkout at ``root``; git's refusal becomes one line (exit 6)."""
    import git

    try:
        return str(_repo(root).git.execute(["git", *args]))
    except git.exc.GitCommandError as e:
        raise FatalError(f"{what}: {_reason(e)}", Exit.REFUSED) from e


def _reason(e: Exception) -> str:
    """git's own reason on one line: its first ``fatal:``/``error:`` line when there is one."""
    text = str(getattr(e, "stderr", "") or e)
    for marker in ("fatal:", "error:"):
        at = text.find(marker)
        if at >= 0:
            return text[at:].splitlines()[0].rstrip("'").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else "unknown error"


def uncommitted(root: Path, relpath: str) -> bool:
    """The kernel differs from HEAD (or is untracked) in the checkout at ``root``."""
    # --no-optional-locks: a dry run must not even refresh the index's stat cache
    out = _git(root, f"git status of {relpath} failed", "--no-optional-locks", "status",
               "--porcelain", "--", relpath)  # fmt: skip
    return bool(out.strip())


def check_identity(root: Path) -> None:
    """Refuse (6) before any write when git could not make the commit for lack of an identity."""
    _git(root, "git has no identity to commit with (set user.name and user.email)",
         "var", "GIT_COMMITTER_IDENT")  # fmt: skip
    _git(root, "git has no identity to commit with (set user.name and user.email)",
         "var", "GIT_AUTHOR_IDENT")  # fmt: skip


def commit(root: Path, relpath: str, message: str) -> str:
    """Commit only ``relpath`` (other staged changes stay staged); returns the new commit's sha.

    If git refuses (a hook, no identity), the index entry of ``relpath`` is put back as it was.
    """
    saved = _git(root, "git ls-files failed", "ls-files", "-s", "--", relpath)
    try:
        _git(root, "git add failed", "add", "--", relpath)
        _git(root, "git commit failed", "commit", "--only", "-m", message, "--", relpath)
    except FatalError:
        _restore_index(root, relpath, saved)
        raise
    return _git(root, "git rev-parse failed", "rev-parse", "HEAD").strip()


def _restore_index(root: Path, relpath: str, saved: str) -> None:
    if saved.strip():
        mode, sha, _stage = saved.split("\t")[0].split()
        _git(
            root,
            "git update-index failed",
            "update-index",
            "--cacheinfo",
            f"{mode},{sha},{relpath}",
        )
    else:
        _git(root, "git rm --cached failed", "rm", "--cached", "-q", "--", relpath)


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
