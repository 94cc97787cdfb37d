"""Run the CLI as a user without root's override of file permissions.

CI runs as root, and root reads a mode-000 file and writes into a mode-555 folder, so tests of
permission errors would prove nothing there. Here the CLI runs in a subprocess that drops to
``nobody`` (``os.setuid`` through ``subprocess.run(user=...)``) when the test runs as root, and as
the current user otherwise; it never skips. The package (with its patches as package data, as a
wheel lays them out) and its pure-Python dependencies are copied into a world-readable folder,
since the checkout and the interpreter may sit under a home folder ``nobody`` cannot enter.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
DEPENDENCIES = ("unidiff", "git", "gitdb", "smmap")


def dropping() -> bool:
    return os.geteuid() == 0


def _as_user() -> dict[str, object]:
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if dropping() else {}


def _runs(python: str) -> bool:
    try:
        res = subprocess.run(
            [python, "-c", "import sys; assert sys.version_info >= (3, 10)"],
            capture_output=True,
            timeout=30,
            cwd="/",
            **_as_user(),  # type: ignore[arg-type]
        )
    except OSError:
        return False
    return res.returncode == 0


@functools.cache
def interpreter() -> str:
    """A Python >= 3.10 the unprivileged user can execute (the venv's may live under /root)."""
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [sys.executable, os.path.realpath(sys.executable), f"/usr/bin/{minor}"]
    candidates += [f"/usr/local/bin/{minor}", "/usr/bin/python3", "/usr/local/bin/python3"]
    for python in dict.fromkeys(candidates):
        if os.path.exists(python) and _runs(python):
            return python
    raise AssertionError(f"no Python >= 3.10 that uid {NOBODY} can run among {candidates}")


def install(dest: Path) -> Path:
    """Lay the package and its dependencies under ``dest`` (world-readable); returns it."""
    shutil.copytree(REPO / "sglang_dsv4_fix", dest / "sglang_dsv4_fix", dirs_exist_ok=True)
    shutil.copytree(REPO / "patches", dest / "sglang_dsv4_fix" / "patches", dirs_exist_ok=True)
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        shutil.copytree(next(iter(spec.submodule_search_locations)), dest / name)
    open_up(dest)
    return dest


def open_up(path: Path) -> None:
    """Everyone may read ``path`` (and enter it, if a folder); what is below too."""
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | (0o555 if p.is_dir() else 0o444))


def give_away(path: Path) -> None:
    """``path`` and everything below belong to the unprivileged user (root only)."""
    if dropping():
        for p in [path, *path.rglob("*")]:
            os.lchown(p, NOBODY, NOBODY)


def run_cli(site: Path, home: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONPATH": str(site),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TVM_FFI_CACHE_DIR": str(home / ".cache" / "tvm-ffi"),
        "SGLANG_JIT_CACHE_DIR": str(home / ".cache" / "sglang" / "jit"),
    }
    return subprocess.run(
        [interpreter(), "-m", "sglang_dsv4_fix", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
        **_as_user(),  # type: ignore[arg-type]
    )
