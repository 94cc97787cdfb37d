"""clear-cache and the apply/revert seam, on cache folders named by the releases' own code."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_jitcache import lay_build, real_dir, variant_tree
from trees import TreeFactory

from sglang_dsv4_fix import jitcache
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import Tree


@pytest.fixture
def laid(tree_factory: TreeFactory, tmp_path: Path) -> tuple[Tree, Path, dict[str, Path]]:
    """A 0.5.16 tree and a cache with its original, no-init and barrier builds, another
    release's build and an unrelated kernel's build."""
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "original")
    root = Path(os.environ["TVM_FFI_CACHE_DIR"])
    builds = {
        v: lay_build(root, *real_dir(tree, v, root)) for v in ("original", "no-init", "barrier")
    }
    builds["foreign"] = lay_build(
        root,
        "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef__arch_9.0a__tvmffi_0.1.11",
        "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef",
    )
    builds["unrelated"] = lay_build(root, "sgl_kernel_jit_fused_rope_0123456789abcdef", "x")
    return tree, root, builds


def present(builds: dict[str, Path]) -> set[str]:
    return {k for k, p in builds.items() if os.path.lexists(p)}


def test_apply_clears_only_this_tree_stale_builds(
    laid: tuple[Tree, Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, root, builds = laid
    assert main(["apply", "--tree", str(tree.root)]) == 0
    assert present(builds) == {"no-init", "foreign", "unrelated"}  # original and barrier went
    assert f"jit cache: removed: {builds['original']}" in capsys.readouterr().err
    assert main(["clear-cache", "--tree", str(tree.root)]) == 0
    assert "nothing to remove" in capsys.readouterr().out
    assert not [p for p in root.iterdir() if p.name.startswith(jitcache.TRASH)]


def test_revert_clears_the_fixed_builds(laid: tuple[Tree, Path, dict[str, Path]]) -> None:
    tree, _, builds = laid
    assert main(["apply", "--tree", str(tree.root), "--no-clear-cache"]) == 0
    assert present(builds) == set(builds)
    assert main(["revert", "--tree", str(tree.root)]) == 0
    assert present(builds) == {"original", "foreign", "unrelated"}


def test_dry_run_and_json(
    laid: tuple[Tree, Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, _, builds = laid
    assert main(["clear-cache", "--tree", str(tree.root), "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["outcome"] for r in out["removals"]} == {"would remove"}
    assert sorted(Path(r["path"]).name for r in out["removals"]) == sorted(
        builds[v].name for v in ("no-init", "barrier")
    )
    assert {b["origin"] for b in out["builds"]} == {"original", "no-init", "barrier", "other"}
    assert present(builds) == set(builds)


def test_all_wipes_every_build_but_nothing_else(laid: tuple[Tree, Path, dict[str, Path]]) -> None:
    _, root, builds = laid
    (root / "notes.txt").write_text("operator's file")
    assert main(["clear-cache", "--all"]) == 0
    assert present(builds) == set()
    assert [p.name for p in root.iterdir()] == ["notes.txt"]


def test_links_are_never_followed(laid: tuple[Tree, Path, dict[str, Path]], tmp_path: Path) -> None:
    tree, root, builds = laid
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    name = builds["no-init"].name
    import shutil

    shutil.rmtree(builds["no-init"])
    (root / name).symlink_to(outside, target_is_directory=True)
    assert main(["apply", "--tree", str(tree.root)]) == 0
    assert main(["clear-cache", "--all"]) == 0
    assert not os.path.lexists(root / name)
    assert (outside / "precious").read_text() == "keep"


def test_a_build_being_compiled_is_left_alone(laid: tuple[Tree, Path, dict[str, Path]]) -> None:
    tree, _, builds = laid
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_WRONLY);"
            "fcntl.flock(fd,fcntl.LOCK_EX);print('held',flush=True);time.sleep(30)",
            str(builds["original"] / "lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["apply", "--tree", str(tree.root)]) == 0  # the write still succeeds
        assert builds["original"].exists()
        assert main(["clear-cache", "--tree", str(tree.root)]) == 6
        assert builds["original"].exists()
    finally:
        holder.kill()
        holder.communicate()
    assert main(["clear-cache", "--tree", str(tree.root)]) == 0
    assert not builds["original"].exists()


def test_a_reader_holding_the_so_keeps_reading(laid: tuple[Tree, Path, dict[str, Path]]) -> None:
    """A loaded .so stays valid: removal unlinks names, it never truncates the file."""
    tree, _, builds = laid
    so = next(builds["original"].glob("*.so"))
    so.write_bytes(b"x" * 1_000_000)
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mmap,sys;f=open(sys.argv[1],'rb');"
            "m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ);print('mapped',flush=True);"
            "sys.stdin.readline();print(m[:]==b'x'*1_000_000,flush=True)",
            str(so),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().strip() == "mapped"
    assert main(["apply", "--tree", str(tree.root)]) == 0
    assert not builds["original"].exists()
    out, _ = reader.communicate("go\n", timeout=30)
    assert out.strip() == "True"


def test_a_loader_waiting_on_the_lock_finds_a_folder(
    laid: tuple[Tree, Path, dict[str, Path]],
) -> None:
    """The placeholder left for half a second at the old name keeps a waiting tvm-ffi build
    from polling a lock path whose folder vanished."""
    _, root, builds = laid
    target = builds["original"]
    fd = os.open(target / "lock", os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)  # released: now remove it while a "loader" recreates its lock meanwhile
    done = jitcache.remove_entries(root, [target])
    assert [r.outcome for r in done] == ["removed"]
    assert not target.exists()  # placeholder removed again: nobody started building into it


@pytest.mark.parametrize("where", ["/", "home", "home-parent"])
def test_refuses_root_and_home(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = Path.home()
    target = {"/": Path("/"), "home": home, "home-parent": home.parent}[where]
    assert main(["clear-cache", "--all", "--cache-dir", str(target)]) == 6
    err = capsys.readouterr().err
    assert err == (
        f"sglang-dsv4-fix: error: refusing to clear {target.resolve()}: that is / or "
        "the home folder\n"
    )


def test_refuses_a_folder_that_is_not_a_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "projects"
    (folder / "src").mkdir(parents=True)
    (folder / "README").write_text("x")
    assert main(["clear-cache", "--all", "--cache-dir", str(folder)]) == 6
    assert "not a TVM-FFI cache" in capsys.readouterr().err
    assert (folder / "README").exists()


def test_missing_cache_is_nothing_to_do(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "original")
    assert (
        main(["clear-cache", "--tree", str(tree.root), "--cache-dir", str(tmp_path / "none")]) == 0
    )
    assert "no cache folder" in capsys.readouterr().out


def test_fixed_release_has_nothing_to_clear(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = variant_tree(tree_factory, "0.5.18", tmp_path / "sp", "original")
    Path(os.environ["TVM_FFI_CACHE_DIR"]).mkdir(parents=True)
    assert main(["clear-cache", "--tree", str(tree.root)]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_verify_fails_on_a_racy_build_of_a_fixed_tree(
    laid: tuple[Tree, Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, _, builds = laid
    assert main(["apply", "--tree", str(tree.root), "--no-clear-cache"]) == 0
    capsys.readouterr()
    assert main(["verify", "--tree", str(tree.root)]) == 5
    out = capsys.readouterr().out
    assert (
        "STALE BUILD: the kernel is verified (no-init) but 1 racy (or untellable) planner build(s)"
        in out
    )
    assert builds["original"].name in out
    assert main(["verify", "--tree", str(tree.root), "--ignore-cache"]) == 0
    assert main(["status", "--tree", str(tree.root)]) == 0
    assert "jit cache:" in capsys.readouterr().out
    assert main(["clear-cache", "--tree", str(tree.root)]) == 0
    assert main(["verify", "--tree", str(tree.root)]) == 0
