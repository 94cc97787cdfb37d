"""Every real release, installed and as a git checkout: verdict, apply, idempotence, revert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trees import AFFECTED, FIXED, RELEASES, TreeFactory

from sglang_dsv4_fix import manifest
from sglang_dsv4_fix.fsops import sha256_file
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import find_tree


@pytest.fixture(params=["installed", "git"])
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make(tree_factory: TreeFactory, kind: str, version: str, tmp_path: Path) -> Path:
    build = tree_factory.git if kind == "git" else tree_factory.installed
    return build(version, tmp_path / kind)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    capsys.readouterr()  # drop what earlier calls printed
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("version", RELEASES)
def test_release_is_found_and_classified(
    version: str,
    layout: str,
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = make(tree_factory, layout, version, tmp_path)
    code, out = run_json(capsys, "verify", "--tree", str(root))
    entry = manifest.load().releases[version]
    assert (out["release"], out["layout"], out["sha256"]) == (version, entry.layout, entry.sha256)
    assert out["kind"] == layout
    assert out["release_source"] == ("git tag" if layout == "git" else "dist-info")
    assert (code, out["variant"]) == ((1, "racy-init") if version in AFFECTED else (0, "no-init"))


@pytest.mark.parametrize("variant", ["no-init", "barrier"])
@pytest.mark.parametrize("version", AFFECTED)
def test_apply_reaches_manifest_sha_then_reverts(
    version: str,
    variant: str,
    layout: str,
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = make(tree_factory, layout, version, tmp_path)
    kernel = find_tree(root).kernel_path
    assert kernel is not None
    original = kernel.read_bytes()
    want = manifest.load().releases[version].results[variant].sha256

    assert (
        run_json(capsys, "apply", "--tree", str(root), "--variant", variant)[1]["written"] is True
    )
    assert sha256_file(kernel) == want
    assert main(["verify", "--tree", str(root), "--require-variant", variant]) == 0
    code, again = run_json(capsys, "apply", "--tree", str(root), "--variant", variant)
    assert (code, again["written"]) == (0, False)
    assert sha256_file(kernel) == want

    assert main(["revert", "--tree", str(root)]) == 0
    assert kernel.read_bytes() == original
    assert sorted(p.name for p in kernel.parent.iterdir() if p.name.startswith(".c_plan")) == []


@pytest.mark.parametrize("version", FIXED)
def test_fixed_release_apply_is_a_no_op(
    version: str,
    layout: str,
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = make(tree_factory, layout, version, tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and ".git/" not in str(p)}
    for variant in ("no-init", "barrier"):
        code, out = run_json(capsys, "apply", "--tree", str(root), "--variant", variant)
        assert (code, out["written"]) == (0, False)
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and ".git/" not in str(p)}
    assert after == before


def test_not_applicable_release(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_factory.installed("0.5.11", tmp_path / "sp")
    assert main(["verify", "--tree", str(root)]) == 4
    assert main(["verify", "--tree", str(root), "--allow-not-applicable"]) == 0
    assert main(["apply", "--tree", str(root)]) == 4
    assert "no DeepSeek-V4 planner" in capsys.readouterr().err
