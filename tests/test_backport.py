"""The shipped patches: plain `git apply` accepts each in a checkout of its release; check mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest
from sglang_dsv4_fix.fsops import sha256_file

REPO = Path(__file__).resolve().parent.parent


def _patches() -> list[tuple[str, str]]:
    m = manifest.load()
    seen: dict[str, tuple[str, str]] = {}
    for version, rel in m.releases.items():
        for variant, result in rel.results.items():
            seen.setdefault(result.patch, (version, variant))
    return sorted(seen.values())


@pytest.mark.parametrize(("version", "variant"), _patches())
def test_git_apply_accepts_the_patch(
    version: str, variant: str, tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.git(version, tmp_path / "co")
    release = manifest.load().releases[version]
    patch = (
        Path(str(__import__("importlib.resources").resources.files("sglang_dsv4_fix.patches")))
        / release.results[variant].patch
    )
    subprocess.run(["git", "-C", str(root), "apply", "--check", str(patch)], check=True)
    subprocess.run(["git", "-C", str(root), "apply", str(patch)], check=True)
    assert sha256_file(root / "python" / str(release.path)) == release.results[variant].sha256


def test_manifest_covers_every_affected_release() -> None:
    m = manifest.load()
    racy = sorted(v for v, r in m.releases.items() if r.variant == "racy-init")
    assert racy == [
        "0.5.12",
        "0.5.12.post1",
        "0.5.13",
        "0.5.13.post1",
        "0.5.14",
        "0.5.15",
        "0.5.15.post1",
        "0.5.16",
        "0.5.17",
    ]
    assert m.releases["0.5.11"].variant == "not-applicable"
    assert all(set(m.releases[v].results) == {"no-init", "barrier"} for v in racy)


def test_check_mode_passes_on_the_committed_patches() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "backport" / "backport.py"), "check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "patches/ is up to date"


def test_check_mode_catches_a_stale_patch(tmp_path: Path) -> None:
    from importlib import util

    spec = util.spec_from_file_location("backport", REPO / "backport" / "backport.py")
    assert spec and spec.loader
    backport = util.module_from_spec(spec)
    spec.loader.exec_module(backport)
    backport.REPO = tmp_path
    (tmp_path / "patches").mkdir()
    backport.generate(tmp_path / "patches", backport.wheel_cache(None))
    stale = tmp_path / "patches" / "no-init" / "0.5.16-pre-refactor.diff"
    stale.write_text(stale.read_text().replace("-  }\n", "-  } \n", 1))
    assert backport.check(backport.wheel_cache(None)) == 1


def test_wheel_ships_manifest_and_patches(tmp_path: Path) -> None:
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    names = zipfile.ZipFile(next(tmp_path.glob("sglang_dsv4_fix-*.whl"))).namelist()
    assert "sglang_dsv4_fix/patches/manifest.json" in names
    assert "sglang_dsv4_fix/patches/no-init/0.5.16-pre-refactor.diff" in names
    assert "sglang_dsv4_fix/patches/barrier/0.5.17-post-refactor.diff" in names
