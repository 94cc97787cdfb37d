"""clear-cache and the apply/revert seam, on cache folders named by the releases' own code."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_jitcache import lay_build, real_dir, variant_tree
from trees import TreeFactory

from sglang_dsv4_fix import cacheclean, jitcache, jitnames, jitroot, jitsource
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
    builds["unrelated"] = lay_build(
        root, "sgl_kernel_jit_fused_rope_0123456789abcdef", "sgl_kernel_jit_fused_rope"
    )
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
    assert not [p for p in root.iterdir() if p.name.startswith(cacheclean.TRASH)]


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


def test_a_link_to_a_folder_that_is_no_build_stays(
    laid: tuple[Tree, Path, dict[str, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, _, builds = laid
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    link = builds["no-init"]
    shutil.rmtree(link)
    link.symlink_to(outside, target_is_directory=True)
    assert main(["apply", "--tree", str(tree.root)]) == 0  # the write still succeeds
    capsys.readouterr()
    assert main(["clear-cache", "--all"]) == 6
    assert (
        f"  left: {link.name} (a link to something that is not a tvm-ffi build (holds "
        "'precious', which tvm-ffi does not write))\n"
    ) in capsys.readouterr().out
    assert link.is_symlink() and (outside / "precious").read_text() == "keep"
    assert [p.name for p in outside.iterdir()] == ["precious"]


def test_a_link_to_a_build_goes_but_not_its_target(
    laid: tuple[Tree, Path, dict[str, Path]], tmp_path: Path
) -> None:
    tree, _, builds = laid
    racy = builds["original"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = racy.rename(elsewhere / racy.name)
    racy.symlink_to(target, target_is_directory=True)
    before = sorted(p.name for p in target.iterdir())
    assert main(["apply", "--tree", str(tree.root)]) == 0
    assert main(["clear-cache", "--all"]) == 0
    assert not os.path.lexists(racy)
    assert sorted(p.name for p in target.iterdir()) == before


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
    done = cacheclean.remove_entries(root, [target])
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


# --------------------------------------------------------------------------- never what is not ours


def snapshot(folder: Path) -> list[tuple[str, str]]:
    """Every path under ``folder`` with what it is (a link's target, a file's bytes' hash)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out.append((rel, f"-> {os.readlink(p)}"))
            elif p.is_file():
                out.append((rel, hashlib.sha256(p.read_bytes()).hexdigest()))
            else:
                out.append((rel, "dir"))
    return sorted(out)


def project_folder(base: Path) -> Path:
    """A C++/Python project: a CMake build/ with a lock and a .so, an extension package, and a
    folder named like a tvm-ffi build that is none."""
    project = base / "project"
    build = project / "build"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text("# generated by CMake\nninja_required_version = 1.5\n")
    (build / "lock").write_text("")
    (build / "libproject.so").write_bytes(b"\x7fELF")
    package = project / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("from ._ext import f\n")
    (package / "_ext.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (project / "src").mkdir()
    (project / "src" / "main.cpp").write_text("int main() {}\n")
    named = project / "results_0123456789abcdef"
    named.mkdir()
    (named / "lock").write_text("")
    (named / "data.csv").write_text("1,2\n")
    (project / "build-latest").symlink_to("build", target_is_directory=True)
    (project / "README.md").write_text("# project\n")
    return project


NOT_A_CACHE = (
    "refusing to clear {}: not a TVM-FFI cache (no entry is a tvm-ffi build by its name and files)"
)


def test_empty_cache_variable_in_a_project_folder_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """sglang-dsv4-fix#13.1: TVM_FFI_CACHE_DIR= in a project folder removed build/ and mypkg/."""
    project = project_folder(tmp_path)
    before = snapshot(project)
    monkeypatch.chdir(project)
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", "")
    assert main(["clear-cache", "--all"]) == 6
    assert capsys.readouterr().err == f"sglang-dsv4-fix: error: {cacheclean.EMPTY_VAR}\n"
    assert main(["clear-cache", "--all", "--cache-dir", "."]) == 6
    assert capsys.readouterr().err == f"sglang-dsv4-fix: error: {NOT_A_CACHE.format('.')}\n"
    assert snapshot(project) == before


def test_empty_cache_variable_is_the_current_folder_as_in_tvm_ffi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tvm-ffi's build_inline/load_inline: ``os.environ.get("TVM_FFI_CACHE_DIR", default)``,
    then ``Path(cache_dir).expanduser() / name``: an empty value is the current folder."""
    from tvm_ffi.cpp import extension

    monkeypatch.setenv("TVM_FFI_CACHE_DIR", "")
    assert jitroot.cache_root() == Path(".")
    source = Path(extension.__file__).read_text()
    assert 'cache_dir = os.environ.get("TVM_FFI_CACHE_DIR", str(Path("~/.cache/tvm-ffi")' in source
    assert 'build_dir = Path(cache_dir).expanduser() / f"{name}_{source_hash}"' in source


def test_a_copy_of_site_packages_with_compiled_packages_is_refused(
    tree_factory: TreeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sglang-dsv4-fix#13.1: pointed at a copy of dist-packages it removed Python packages."""
    site = tree_factory.installed("0.5.16", tmp_path / "site")
    real = Path(extension_site())
    for name in ("tvm_ffi", "librt"):
        shutil.copytree(real / name, site / name, symlinks=True)
    for info in real.glob("apache_tvm_ffi-*.dist-info"):
        shutil.copytree(info, site / info.name)
    for so in real.glob("*__mypyc.cpython-*.so"):
        shutil.copy2(so, site / so.name)
    (site / "tvm_ffi_link").symlink_to("tvm_ffi", target_is_directory=True)
    before = snapshot(site)
    for argv in (["--all"], ["--tree", str(site)]):
        assert main(["clear-cache", *argv, "--cache-dir", str(site)]) == 6
        assert capsys.readouterr().err == f"sglang-dsv4-fix: error: {NOT_A_CACHE.format(site)}\n"
    assert main(["apply", "--tree", str(site), "--cache-dir", str(site)]) == 0
    assert capsys.readouterr().err == (
        f"sglang-dsv4-fix: warning: JIT cache not cleared: {NOT_A_CACHE.format(site)}\n"
    )
    after = [e for e in snapshot(site) if "deepseek_v4" not in e[0]]  # the patched kernel
    assert after == [e for e in before if "deepseek_v4" not in e[0]]


def extension_site() -> str:
    import tvm_ffi

    return str(Path(tvm_ffi.__file__).parent.parent)


def test_all_in_a_real_cache_takes_only_builds(
    laid: tuple[Tree, Path, dict[str, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache that holds builds and things named like builds that are not: only builds go."""
    _, root, builds = laid
    odd = root / "results_0123456789abcdef"
    odd.mkdir()
    (odd / "data.csv").write_text("1,2\n")
    extra = builds["foreign"] / "notes.txt"
    extra.write_text("an operator's note inside a build")
    keep = {p: snapshot(p) for p in (odd, builds["foreign"])}
    assert main(["clear-cache", "--all"]) == 6
    out = capsys.readouterr().out
    assert (
        f"  left: {odd.name} (not a tvm-ffi build: holds 'data.csv', which tvm-ffi does not "
        "write)\n" in out
    )
    assert (
        f"  left: {builds['foreign'].name} (not a tvm-ffi build: holds 'notes.txt', which "
        "tvm-ffi does not write)\n" in out
    )
    assert present(builds) == {"foreign"}
    assert {p: snapshot(p) for p in keep} == keep


# --------------------------------------------------------------------------- hostile files


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI in its own process, so that a hang fails the test instead of hanging it."""
    return subprocess.run(
        [sys.executable, "-m", "sglang_dsv4_fix", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fixed_tree_with(
    tree_factory: TreeFactory, tmp_path: Path, version: str
) -> tuple[Tree, Path, Path]:
    """A fixed tree of ``version`` and its cache holding the racy original's build."""
    tree = variant_tree(tree_factory, version, tmp_path / "sp", "original")
    root = Path(os.environ["TVM_FFI_CACHE_DIR"])
    kernel = tree.kernel_root.resolve() / "csrc" / jitnames.CUDA_FILE
    racy = lay_build(root, *real_dir(tree, "original", root), f'#include "{kernel}"\n')
    lay_build(root, "sgl_kernel_jit_fused_rope_0123456789abcdef", "sgl_kernel_jit_fused_rope")
    assert main(["apply", "--tree", str(tree.root), "--no-clear-cache"]) == 0
    return tree, root, racy


def swap_for_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("version", "fifo", "why"),
    [
        ("0.5.12", "cuda.cu", "not a tvm-ffi build: its 'cuda.cu' is not a regular file"),
        ("0.5.16", "lock", "not a tvm-ffi build: its 'lock' is not a regular file"),
        (
            "0.5.12",
            jitcache.SIDECAR,
            "not a tvm-ffi build: its '.sglang-dsv4-fix.json' is not a regular file",
        ),
    ],
)
def test_a_fifo_in_a_build_never_hangs(
    tree_factory: TreeFactory, tmp_path: Path, version: str, fifo: str, why: str
) -> None:
    """sglang-dsv4-fix#13.6: a FIFO inside a 0.5.12 entry or as a stale build's lock hung
    status/verify/clear-cache/apply. Now: 5 (still racy, or cannot tell), 6 with the reason."""
    tree, _, racy = fixed_tree_with(tree_factory, tmp_path, version)
    swap_for_fifo(racy / fifo)
    t = str(tree.root)
    verify = cli("verify", "--tree", t)
    assert verify.returncode == 5, verify.stderr
    headline = "STALE BUILD: the kernel is verified (no-init) but 1 racy (or untellable) planner"
    assert f"{headline} build(s) remain in the JIT cache: {racy.name} " in verify.stdout
    assert cli("status", "--tree", t).returncode == 0
    clear = cli("clear-cache", "--tree", t)
    assert clear.returncode == 6, clear.stderr
    assert f"  left: {racy.name} ({why})\n" in clear.stdout
    assert cli("revert", "--tree", t).returncode == 0
    apply = cli("apply", "--tree", t)  # a write: the seam reports, never fails it
    assert apply.returncode == 0, apply.stderr
    assert f"jit cache: left: {racy} ({why})\n" in apply.stderr
    assert stat.S_ISFIFO(os.lstat(racy / fifo).st_mode)


def test_a_file_named_like_a_build_and_a_link_loop(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """sglang-dsv4-fix#13.8: a regular file named like a build gave exit 70. Neither it nor a
    link loop can hand a loader a .so: verify passes, clear-cache leaves both and says why."""
    tree, root, racy = fixed_tree_with(tree_factory, tmp_path, "0.5.16")
    shutil.rmtree(racy)
    racy.write_text("not a build")
    loop = root / "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef__arch_9.0a__tvmffi_0.1.11"
    loop.symlink_to(loop.name)
    t = str(tree.root)
    assert cli("verify", "--tree", t).returncode == 0
    status = cli("status", "--tree", t)
    assert (
        status.returncode == 0 and "planner builds of this tree: cannot tell x2\n" in status.stdout
    )
    clear = cli("clear-cache", "--tree", t)
    assert clear.returncode == 0 and "  nothing to remove\n" in clear.stdout
    wipe = cli("clear-cache", "--all")
    assert wipe.returncode == 6, wipe.stderr
    assert (
        f"  left: {loop.name} (a link to something that is not a tvm-ffi build (cannot list it "
        "(Too many levels of symbolic links)))\n" in wipe.stdout
    )
    assert racy.read_text() == "not a build" and loop.is_symlink()


def test_a_fifo_as_the_cache_folder(tree_factory: TreeFactory, tmp_path: Path) -> None:
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "no-init")
    fifo = tmp_path / "cache-fifo"
    os.mkfifo(fifo)
    t = str(tree.root)
    assert cli("verify", "--tree", t, "--cache-dir", str(fifo)).returncode == 0
    clear = cli("clear-cache", "--tree", t, "--cache-dir", str(fifo))
    assert (clear.returncode, clear.stderr) == (
        6,
        f"sglang-dsv4-fix: error: refusing to clear {fifo}: not a folder\n",
    )


# --------------------------------------------------------------------------- killed removals


def leave_killed_removal(build: Path) -> Path:
    """What a clear-cache SIGKILLed in its placeholder window leaves (step 3 of cacheclean):
    the build renamed aside, an empty folder at its name."""
    trash = build.with_name(f"{cacheclean.TRASH}{build.name}-0123abcd")
    build.rename(trash)
    build.mkdir()
    return trash


def test_a_killed_removal_is_recognised_and_finished(
    laid: tuple[Tree, Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """sglang-dsv4-fix#13.5: the leftovers made every clear-cache refuse (exit 6) and verify
    exit 5 forever. Now verify passes (an empty folder holds no .so) and the next run finishes."""
    tree, root, builds = laid
    assert main(["apply", "--tree", str(tree.root), "--no-clear-cache"]) == 0
    for name in ("no-init", "foreign", "unrelated"):
        shutil.rmtree(builds[name])
    trash = leave_killed_removal(builds["original"])
    shutil.rmtree(builds["barrier"])
    assert [p.name for p in root.iterdir()] != []
    capsys.readouterr()
    assert main(["verify", "--tree", str(tree.root)]) == 0
    assert main(["clear-cache", "--tree", str(tree.root)]) == 0
    out = capsys.readouterr().out
    assert f"  removed: {builds['original'].name} (finished an interrupted removal)\n" in out
    assert list(root.iterdir()) == []
    assert not trash.exists()


def test_a_placeholder_is_never_taken_for_ours_without_its_trash(
    laid: tuple[Tree, Path, dict[str, Path]],
) -> None:
    """An empty folder named like a build with no trash beside it may be a loader's fresh mkdir
    (tvm-ffi creates the folder, then its lock): it is left alone."""
    _, root, builds = laid
    shutil.rmtree(builds["original"])
    builds["original"].mkdir()
    assert cacheclean.remove_entries(root, []) == []
    assert builds["original"].is_dir()


def test_a_loader_polling_the_lock_finds_the_placeholder(
    laid: tuple[Tree, Path, dict[str, Path]],
) -> None:
    """sglang-dsv4-fix#15: observe what a waiting loader sees. tvm-ffi's FileLock (the real one)
    polls ``open(<build>/lock, O_CREAT)``; from the moment the build is renamed aside it must find
    a folder at the old name and build there, and its build must survive the removal."""
    from tvm_ffi.utils import FileLock

    _, root, builds = laid
    target = builds["original"]
    seen: dict[str, object] = {}

    def loader() -> None:
        deadline = time.monotonic() + 10
        while not any(p.name.startswith(cacheclean.TRASH) for p in root.iterdir()):
            if time.monotonic() > deadline:
                return
        lock = FileLock(str(target / "lock"))
        try:
            seen["acquired"] = lock.blocking_acquire(timeout=1.0, poll_interval=0.1)
        except TimeoutError:
            seen["acquired"] = False
            return
        (target / "build.ninja").write_text("the waiting loader's build\n")
        lock.release()

    watcher = threading.Thread(target=loader)
    watcher.start()
    done = cacheclean.remove_entries(root, [target])
    watcher.join(timeout=15)
    assert seen == {"acquired": True}
    assert [r.outcome for r in done] == ["removed"]
    assert sorted(p.name for p in target.iterdir()) == ["build.ninja", "lock"]
    assert (target / "build.ninja").read_text() == "the waiting loader's build\n"
    assert not [p for p in root.iterdir() if p.name.startswith(cacheclean.TRASH)]


# --------------------------------------------------------------------------- cheap


def test_the_cache_is_listed_before_any_source_is_computed(
    tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sglang-dsv4-fix#10/#11: an empty cache, or one without planner builds, costs a listing;
    one holding only the current kernel's build costs one source hash."""
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "no-init")
    root = tmp_path / "cache"
    fixed = real_dir(tree, "no-init", root)  # the name the release's own code gives the fix
    originals = {"tree_sources": jitcache.tree_sources, "source_hash": jitsource.source_hash}
    armed = set(originals)

    def guard(name: str) -> Callable[..., Any]:
        def call(*a: Any) -> Any:
            if name in armed:
                raise AssertionError(f"{name} computed before the cache was listed")
            return originals[name](*a)

        return call

    for name in originals:
        monkeypatch.setattr(jitcache, name, guard(name))
    monkeypatch.setattr(jitsource, "source_hash", guard("source_hash"))  # not_current's
    for _ in range(2):  # no folder; then a cache holding another module's build only
        assert jitcache.racy_builds(tree, root) == []
        assert jitcache.stale_builds(tree, root) == []
        assert jitcache.inventory(tree, root) == []
        if not root.exists():
            lay_build(root, "sgl_kernel_jit_rope_0123456789abcdef", "sgl_kernel_jit_rope")
    lay_build(root, *fixed)  # as after prewarm: its name is the current bytes' hash
    armed.discard("source_hash")
    assert jitcache.racy_builds(tree, root) == []
    assert jitcache.stale_builds(tree, root) == []
    lay_build(root, "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef", jitroot.MODULE)
    with pytest.raises(AssertionError, match="tree_sources computed before"):
        jitcache.racy_builds(tree, root)  # a planner entry of unknown bytes: sources needed


# --------------------------------------------------------------------------- the kill loop


FILE_HELPERS = ("/sglang_dsv4_fix/fsops.py", "/sglang_dsv4_fix/fswrite.py")


def _counted(frame: types.FrameType | None) -> bool:
    """A call made by the removal itself (cacheclean, and fsops/fswrite on its behalf). The
    reads it makes through jitcache/jitnames (and fsops for them) change nothing on disk: a kill
    there equals one before the next step."""
    while frame is not None and frame.f_code.co_filename.endswith(FILE_HELPERS):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.endswith("/sglang_dsv4_fix/cacheclean.py")


def _fs_call(fn: object) -> bool:
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__ in ("posix", "os", "fcntl")
    return isinstance(owner, io.IOBase)


def run_killed(argv: list[str], kill_at: int | None) -> tuple[bool, int]:
    """(killed, steps) of ``main(argv)`` in a forked child that SIGKILLs itself right before
    its file-system call number ``kill_at`` inside the removal (every os/fcntl/io call)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 99
        try:
            os.close(r)
            steps = 0

            def hook(frame: types.FrameType, event: str, arg: object) -> None:
                nonlocal steps
                if event == "c_call" and _fs_call(arg) and _counted(frame):
                    steps += 1
                    if steps == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)

            with (
                open(os.devnull, "w") as null,
                contextlib.redirect_stdout(null),
                contextlib.redirect_stderr(null),
            ):
                sys.setprofile(hook)
                code = main(argv)
                sys.setprofile(None)
            os.write(w, str(steps).encode())
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        reported = f.read()
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True, -1
    assert os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
    return False, int(reported)


@pytest.mark.slow
def test_clear_cache_killed_at_every_step(
    laid: tuple[Tree, Path, dict[str, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """sglang-dsv4-fix#13.5: SIGKILL clear-cache before each of its file-system steps. After every
    kill verify says 0 or 5 (never wedged on leftovers), the next clear-cache exits 0 and leaves
    exactly the builds that are not stale, nothing of ours, and a passing verify."""
    tree, root, builds = laid
    monkeypatch.setattr(cacheclean, "PLACEHOLDER_SECONDS", 0.02)  # the window, not its length
    assert main(["apply", "--tree", str(tree.root), "--no-clear-cache"]) == 0
    template = tmp_path / "template"
    shutil.copytree(root, template, symlinks=True)
    kept = {k: snapshot(builds[k]) for k in ("no-init", "foreign", "unrelated")}
    argv = ["clear-cache", "--tree", str(tree.root)]
    killed, steps = run_killed(argv, None)
    assert not killed and 20 < steps < 200, steps
    start = time.monotonic()
    for n in range(1, steps + 1):
        shutil.rmtree(root)
        shutil.copytree(template, root, symlinks=True)
        assert run_killed(argv, n)[0], n
        assert main(["verify", "--tree", str(tree.root)]) in (0, 5), n
        assert main(argv) == 0, (n, capsys.readouterr())
        assert present(builds) == set(kept), n
        assert {k: snapshot(builds[k]) for k in kept} == kept, n
        assert sorted(p.name for p in root.iterdir()) == sorted(builds[k].name for k in kept), n
        assert main(["verify", "--tree", str(tree.root)]) == 0, n
        capsys.readouterr()
    assert time.monotonic() - start < 240


def test_one_remover_at_a_time(
    laid: tuple[Tree, Path, dict[str, Path]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, root, builds = laid
    monkeypatch.setattr(cacheclean, "ROOT_LOCK_SECONDS", 0.2)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert main(["clear-cache", "--all"]) == 6
        assert capsys.readouterr().err == (
            f"sglang-dsv4-fix: error: {root}: another sglang-dsv4-fix is clearing this cache; "
            "try again\n"
        )
        assert present(builds) == set(builds)
    finally:
        os.close(fd)
    assert main(["clear-cache", "--all"]) == 0
    assert present(builds) == set()
