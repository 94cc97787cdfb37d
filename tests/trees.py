"""Real SGLang test trees, built from real release wheels downloaded from PyPI (and cached).

Two layouts per release: an installed package (``site-packages/sglang`` plus its dist-info) and a
git source checkout (``python/sglang/...``, ``git init``, tag ``vX.Y.Z``) as in the lmsysorg images.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

AFFECTED = ["0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17"]
FIXED = ["0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
RELEASES = AFFECTED + FIXED

# What the tool reads from a tree; extracting whole wheels for every test would be slow.
DEFAULT_PREFIXES = (
    "sglang/jit_kernel/",
    "sglang/kernels/jit/",
    "sglang/kernels/ops/attention/dsv4/",
    "sglang/__init__.py",
    "sglang/version.py",
    "sglang/_version.py",
    "sglang/srt/plugins/",
)


def wheel_cache() -> Path:
    default = Path.home() / ".cache" / "sglang-dsv4-fix" / "wheels"
    return Path(os.environ.get("SGLANG_DSV4_FIX_WHEEL_CACHE", default))


def fetch_wheel(version: str, project: str = "sglang") -> Path:
    """The cached wheel of ``project==version``; downloaded from PyPI on first use."""
    cache = wheel_cache()
    stem = project.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*cmd, "-d", str(cache), f"{project}=={version}"], check=True)
    return sorted(cache.glob(f"{stem}-{version}-*.whl"))[0]


def _wanted(name: str, prefixes: tuple[str, ...] | None) -> bool:
    if prefixes is None or ".dist-info/" in name:
        return True
    return name.startswith(prefixes)


def extract(version: str, dest: Path, prefixes: tuple[str, ...] | None = DEFAULT_PREFIXES) -> Path:
    """Unpack (part of) the wheel into ``dest``, as pip lays it into site-packages."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(fetch_wheel(version)) as wheel:
        for info in wheel.infolist():
            if _wanted(info.filename, prefixes) and not info.is_dir():
                wheel.extract(info, dest)
    return dest


def make_installed_tree(version: str, dest: Path) -> Path:
    """``dest`` becomes a site-packages folder holding the release; returns it."""
    return extract(version, dest)


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, **GIT_IDENTITY}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def make_git_tree(version: str, dest: Path) -> Path:
    """``dest`` becomes a source checkout (``python/sglang``) at tag ``v<version>``; returns it."""
    staging = extract(version, dest / "python")
    shutil.rmtree(next(staging.glob("sglang-*.dist-info")))
    (staging / "sglang" / "_version.py").unlink(missing_ok=True)  # generated at build time
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", f"sglang {version}")
    _git(dest, "tag", f"v{version}")
    return dest


class TreeFactory:
    """Copies a per-session template so each test gets a fresh tree cheaply."""

    def __init__(self, templates: Path) -> None:
        self.templates = templates

    def _template(self, kind: str, version: str) -> Path:
        path = self.templates / f"{kind}-{version}"
        if not path.exists():
            building = self.templates / f".{kind}-{version}.tmp"
            shutil.rmtree(building, ignore_errors=True)
            (make_git_tree if kind == "git" else make_installed_tree)(version, building)
            building.rename(path)
        return path

    def installed(self, version: str, dest: Path) -> Path:
        shutil.copytree(self._template("installed", version), dest, symlinks=True)
        return dest

    def git(self, version: str, dest: Path) -> Path:
        shutil.copytree(self._template("git", version), dest, symlinks=True)
        return dest
