"""The plugin's start memo (memo.py) under SGLang's real ``load_plugins()``, on real releases.

A second process on an unchanged tree takes the status the first one stored, importing no judging
module, and says what a process with the memo off says; any change to what the verdict rests on
is seen by the next process; a strange memo folder or entry is never trusted, never hangs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from plugin_env import (
    base_python,
    child_env,
    copy_site,
    install_self,
    never_built_checkout,
    release_site,
    run_python,
)

from sglang_dsv4_fix import jitcache, jitsource, memo
from sglang_dsv4_fix.fsops import sha256_bytes
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import find_tree

pytestmark = pytest.mark.slow

SERVE = """
import sys, types
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.utils as utils
utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP3")
print("OURS", sorted(m for m in sys.modules if m.startswith("sglang_dsv4_fix")))
"""
LINE = re.compile(r"^\[[^\]]* TP3\] (sglang-dsv4-fix: c_plan\.cuh .*)$", re.MULTILINE)
HIT = {"", ".errors", ".fsops", ".jitroot", ".memo", ".plugin", ".value"}  # nothing that judges


@pytest.fixture(scope="session")
def self_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_self(tmp_path_factory.mktemp("self") / "site")


class Start:
    """One process's start: its start line (pid dropped) and our modules it imported."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        assert done.returncode == 0, done.stderr
        lines = LINE.findall(done.stderr)
        assert len(lines) == 1, done.stderr
        self.line = re.sub(r" pid=\d+", "", lines[0])
        ours = re.search(r"^OURS (.*)$", done.stdout, re.MULTILINE)
        assert ours is not None, done.stdout
        self.modules = {m.removeprefix("sglang_dsv4_fix") for m in ast.literal_eval(ours[1])}

    @property
    def hit(self) -> bool:
        return self.modules == HIT


def start(self_site: Path, site: Path, cache: Path, **env: str) -> Start:
    return Start(run_python(SERVE, self_site, site, env={"TVM_FFI_CACHE_DIR": str(cache), **env}))


def judged(self_site: Path, site: Path, cache: Path) -> Start:
    """The same start with the memo off: the verdict every surface renders."""
    s = start(self_site, site, cache, SGLANG_DSV4_FIX_MEMO="off")
    assert not s.hit
    return s


def quiet() -> None:
    """Past the memo's one second: what the test just changed may now be stored."""
    time.sleep(memo.QUIET_NS / 1e9 + 0.1)


def entries(home: Path) -> list[Path]:
    folder = home / ".cache" / "sglang-dsv4-fix" / "start"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def fixed(tmp_path: Path) -> Path:
    site = copy_site(release_site("0.5.16"), tmp_path / "site")
    assert main(["apply", "--tree", str(site)]) == 0
    return site


def noted_build(site: Path, cache: Path) -> Path:
    """The kernel's build as prewarm leaves it: named by its sources, with our note."""
    kernel = find_tree(site / "sglang").kernel_path
    assert kernel is not None
    return build(site, cache, kernel.read_bytes(), noted=True)


def build(site: Path, cache: Path, data: bytes, noted: bool) -> Path:
    """A planner build of the kernel bytes ``data``, named as the tree's loader names it."""
    tree = find_tree(site / "sglang")
    name = jitsource.module_name(tree, data, "content-dir")
    folder = cache / f"{name}__arch_9.0a__tvmffi_0.1.11"
    folder.mkdir(parents=True)
    (folder / f"{name}.so").write_bytes(b"\x7fELF")
    if noted:
        jitcache.write_sidecar(folder, folder / f"{name}.so", {"kernel_sha256": sha256_bytes(data)})
    return folder


@pytest.mark.parametrize("case", ["racy", "fixed, empty cache", "fixed, build noted"])
def test_the_next_process_takes_the_memo_and_says_the_same(
    case: str, self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    cache = tmp_path / "cache"
    site = release_site("0.5.16") if case == "racy" else fixed(tmp_path)
    if case == "fixed, build noted":
        noted_build(site, cache)
    quiet()
    first = start(self_site, site, cache)
    assert not first.hit and ".verdict" in first.modules
    assert ".fswrite" not in first.modules  # stored through fsops.replace_at (docs/plugin.md)
    (entry,) = entries(isolated_home)
    assert entry.stat().st_mode & 0o777 == 0o600
    second = start(self_site, site, cache)
    assert second.hit, second.modules
    assert second.line == first.line == judged(self_site, site, cache).line
    assert ("variant=racy-init" if case == "racy" else "variant=no-init") in second.line


def _edit_kernel(site: Path, cache: Path) -> None:
    kernel = find_tree(site / "sglang").kernel_path
    assert kernel is not None
    kernel.write_bytes(kernel.read_bytes().replace(b"__syncthreads", b"__syncthreads ", 1))


def _revert(site: Path, cache: Path) -> None:
    assert main(["revert", "--tree", str(site)]) == 0


def _drop_record(site: Path, cache: Path) -> None:
    kernel = find_tree(site / "sglang").kernel_path
    assert kernel is not None
    (kernel.parent / f".{kernel.name}.sglang-dsv4-fix.json").unlink()


def _racy_build(site: Path, cache: Path) -> None:
    """The release's racy build, as an SGLang start before the fix leaves it (no note)."""
    kernel = find_tree(release_site("0.5.16") / "sglang").kernel_path
    assert kernel is not None
    build(site, cache, kernel.read_bytes(), noted=False)


def _release(site: Path, cache: Path) -> None:
    (info,) = site.glob("sglang-*.dist-info")
    metadata = info / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.5.16", "Version: 0.5.16.post9"))


def _second_dist_info(site: Path, cache: Path) -> None:
    """Only a listing changes (the release is then read from sglang/_version.py, the same)."""
    (info,) = site.glob("sglang-*.dist-info")
    shutil.copytree(info, site / "sglang-0.5.15.dist-info")


@pytest.mark.parametrize(
    "change",
    [_edit_kernel, _revert, _drop_record, _racy_build, _release, _second_dist_info],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_change_to_what_the_verdict_rests_on_reaches_the_next_process(
    change: object, self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    site = fixed(tmp_path)
    quiet()
    before = start(self_site, site, cache)
    assert entries(isolated_home) and start(self_site, site, cache).hit
    change(site, cache)  # type: ignore[operator]
    after = start(self_site, site, cache)  # at once: within the file system's clock tick too
    assert not after.hit and after.line == judged(self_site, site, cache).line
    assert (after.line == before.line) == (change is _second_dist_info), after.line


def git_checkout(tmp_path: Path, tag: str | None = "v0.5.16") -> Path:
    return never_built_checkout("0.5.16", tmp_path / "checkout", tag)


def git(root: Path, *args: str) -> None:
    subprocess.run(("git", "-C", str(root), *args), check=True, capture_output=True, timeout=60)


@pytest.mark.parametrize(
    ("tag", "change", "release"),
    [
        ("v0.5.16", ("commit", "-q", "--allow-empty", "-m", "next"), "?"),
        ("v0.5.16", ("tag", "v0.5.17"), "?"),  # two release tags: neither is believed
        ("v0.5.16", ("tag", "-d", "v0.5.16"), "?"),
        ("v0.5.16", ("config", "core.abbrev", "12"), "0.5.16"),
        ("v0.5.16", ("pack-refs", "--all"), "0.5.16"),
        ("v0.5.16", ("checkout", "-q", "--detach"), "0.5.16"),
        (None, ("tag", "v0.5.15"), "0.5.15"),  # no tag, then one
    ],
    ids=["commit", "second-tag", "tag-deleted", "config", "refs-packed", "detached", "tag-added"],
)  # fmt: skip
def test_a_release_named_by_git_is_kept_until_git_would_say_otherwise(
    tag: str | None, change: tuple[str, ...], release: str, self_site: Path, tmp_path: Path,
    isolated_home: Path,
) -> None:  # fmt: skip
    cache, site = tmp_path / "cache", git_checkout(tmp_path, tag)
    quiet()
    before = start(self_site, site, cache)
    assert not before.hit and entries(isolated_home)
    assert start(self_site, site, cache).hit
    git(site.parent, *change)
    after = start(self_site, site, cache)  # at once: within the file system's clock tick too
    assert not after.hit and after.line == judged(self_site, site, cache).line
    assert f" release={release} " in after.line, after.line
    quiet()
    start(self_site, site, cache)
    assert start(self_site, site, cache).hit  # kept again once git is quiet


@pytest.mark.parametrize(
    ("variable", "linked"),
    [("GIT_CONFIG_NOSYSTEM", None), (None, ".git"), (None, ".git/refs/tags")],
    ids=["GIT_CONFIG_NOSYSTEM", ".git linked", "refs-tags linked"],
)
def test_git_that_may_read_elsewhere_is_never_kept(
    variable: str | None, linked: str | None, self_site: Path, tmp_path: Path,
    isolated_home: Path,
) -> None:  # fmt: skip
    """A GIT_* variable may point git at another repository or config, a link at another folder:
    not paths of the checkout. Every process judges, and keeps nothing."""
    cache, site = tmp_path / "cache", git_checkout(tmp_path)
    env = {"TVM_FFI_CACHE_DIR": str(cache), **({variable: "1"} if variable else {})}
    if linked:  # moved out of the checkout, a symbolic link left in its place
        (site.parent / linked).rename(tmp_path / "away")
        (site.parent / linked).symlink_to(tmp_path / "away")
    quiet()
    first = Start(run_python(SERVE, self_site, site, env=env))
    assert first.line == judged(self_site, site, cache).line
    assert not Start(run_python(SERVE, self_site, site, env=env)).hit
    assert entries(isolated_home) == []


def test_another_jit_cache_is_another_entry(
    self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    site, empty, warm = fixed(tmp_path), tmp_path / "empty", tmp_path / "warm"
    _racy_build(site, warm)
    quiet()
    assert "STALE BUILD" in start(self_site, site, warm).line
    assert "STALE BUILD" not in start(self_site, site, empty).line
    assert len(entries(isolated_home)) == 1  # a verdict that needed an inventory is not kept
    assert start(self_site, site, empty).hit
    assert "STALE BUILD" in start(self_site, site, warm).line


def test_another_install_of_the_plugin_judges_for_itself(
    self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    """A second copy of this package (on PYTHONPATH beside the tree's own, say) may be other code:
    it never takes the entry the first one stored, and keeps its own beside it."""
    site, cache = release_site("0.5.16"), tmp_path / "cache"
    other = shutil.copytree(self_site, tmp_path / "other", symlinks=True)
    quiet()
    first = start(self_site, site, cache)
    assert not first.hit and start(self_site, site, cache).hit
    theirs = start(other, site, cache)
    assert not theirs.hit and theirs.line == first.line
    assert len(entries(isolated_home)) == 2
    assert start(other, site, cache).hit and start(self_site, site, cache).hit


def test_nothing_is_kept_while_an_input_is_newer_than_a_second(
    self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    """A change within the file system clock's tick could leave an input's times as they were, so
    an input changed in the last second (here: dated a minute ahead) is never kept."""
    site, cache = fixed(tmp_path), tmp_path / "cache"
    quiet()
    kernel = find_tree(site / "sglang").kernel_path
    assert kernel is not None
    ahead = time.time() + 60
    os.utime(kernel, (ahead, ahead))
    assert not start(self_site, site, cache).hit
    assert entries(isolated_home) == []
    assert not start(self_site, site, cache).hit


def test_switched_off_it_writes_nothing(
    self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    judged(self_site, release_site("0.5.16"), tmp_path / "cache")
    judged(self_site, release_site("0.5.16"), tmp_path / "cache")
    assert not (isolated_home / ".cache" / "sglang-dsv4-fix").exists()


def _forge(entry: Path, **status: str) -> None:
    """The entry rewritten to claim other status fields (its inputs left as they are)."""
    body = json.loads(entry.read_bytes())
    body["status"].update(status)
    entry.write_text(json.dumps(body))


def test_an_entry_of_other_bytes_is_not_believed(
    self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    """The kernel's sha256 is checked at every start: an entry claiming a fix for other bytes
    (here: the racy release's, with another digest) is judged again."""
    site, cache = release_site("0.5.16"), tmp_path / "cache"
    quiet()
    racy = start(self_site, site, cache)
    (entry,) = entries(isolated_home)
    _forge(entry, variant="no-init", problem="", sha256="0" * 64)
    again = start(self_site, site, cache)
    assert not again.hit and again.line == racy.line


def _world_writable(entry: Path) -> None:
    entry.parent.chmod(0o777)  # the forged entry is what another user could have written there


def _group_writable(entry: Path) -> None:
    entry.parent.chmod(0o720)


def _fifo(entry: Path) -> None:
    entry.unlink()
    os.mkfifo(entry)


def _link(entry: Path) -> None:
    forged = entry.with_name("elsewhere.json")
    entry.rename(forged)
    entry.symlink_to(forged)


def _garbage(entry: Path) -> None:
    entry.write_bytes(b"\xff{not json")


def _huge(entry: Path) -> None:
    entry.write_bytes(b" " * (memo.LIMIT + 1))


def _folder_link(entry: Path) -> None:
    folder = entry.parent
    folder.rename(folder.with_name("real"))
    folder.symlink_to(folder.with_name("real"))


@pytest.mark.parametrize(
    "spoil",
    [_world_writable, _group_writable, _fifo, _link, _garbage, _huge, _folder_link],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_strange_or_foreign_entry_never_hangs_or_decides(
    spoil: object, self_site: Path, tmp_path: Path, isolated_home: Path
) -> None:
    site, cache = release_site("0.5.16"), tmp_path / "cache"
    quiet()
    racy = start(self_site, site, cache)
    (entry,) = entries(isolated_home)
    _forge(entry, variant="no-init", problem="")
    spoil(entry)  # type: ignore[operator]
    again = start(self_site, site, cache)  # run_python's timeout: a FIFO read would hang here
    assert not again.hit and again.line == racy.line and "variant=racy-init" in again.line


def test_an_unwritable_cache_costs_nothing_but_the_memo(self_site: Path, tmp_path: Path) -> None:
    site, cache = release_site("0.5.16"), tmp_path / "cache"
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    quiet()
    done = run_python(
        SERVE, self_site, site,
        env={"TVM_FFI_CACHE_DIR": str(cache), "XDG_CACHE_HOME": str(blocker)},
    )  # fmt: skip
    s = Start(done)
    assert "variant=racy-init" in s.line and "failed" not in done.stderr
    assert blocker.read_text() == ""


STRACE = shutil.which("strace")
JUDGE = """
import sys
from pathlib import Path
from sglang_dsv4_fix import plugin
status, inputs = plugin._judge(Path(sys.argv[1]), keep=True)
print("INPUTS", [str(p) for p in inputs])
"""
CALL = re.compile(r'^\d+\s+(\w+)\((?:(\w+)<([^>]*)>|AT_FDCWD|-?\d+)?,?\s*"([^"]*)"')


@pytest.mark.skipif(STRACE is None, reason="needs strace")
@pytest.mark.parametrize("case", ["racy", "fixed, empty cache", "fixed, build noted", "git tag"])
def test_every_path_the_judgement_touches_is_an_input(
    case: str, self_site: Path, tmp_path: Path
) -> None:
    """Under strace, every file system call of the judgement (git's too) on a path in the tree or
    the cache names a path of ``verdict.inputs`` (or a file of ours): a new read that the memo's
    key does not cover fails here. Git's objects are left out: a name's bytes never change."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if case == "racy":
        site = release_site("0.5.16")
    elif case == "git tag":
        site = git_checkout(tmp_path)
    else:
        site = fixed(tmp_path)
    if case == "fixed, build noted":
        noted_build(site, cache)
    tree = site.parent if case == "git tag" else site
    trace = tmp_path / "trace"
    done = subprocess.run(
        (str(STRACE), "-f", "-y", "-e", "trace=%file", "-o", str(trace),
         str(base_python()), "-c", JUDGE, str(site / "sglang")),
        capture_output=True, text=True, timeout=120, cwd=self_site,
        env=child_env(self_site, site, env={"TVM_FFI_CACHE_DIR": str(cache)}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = re.search(r"^INPUTS (.*)$", done.stdout, re.MULTILINE)
    assert said is not None, done.stdout
    inputs = {os.path.normpath(p) for p in ast.literal_eval(said[1])}
    touched = set()
    for line in trace.read_text().splitlines():
        m = CALL.match(line)
        if m is None:
            continue
        path = os.path.join(m[3], m[4]) if m[3] else m[4]
        if path.startswith((str(tree), str(cache))) and "/.git/objects/" not in path:
            touched.add(os.path.normpath(path))
    ours = {p for p in touched if "/sglang_dsv4_fix/" in p}
    assert touched - ours, "the trace saw nothing: the pattern no longer reads strace's lines"
    assert touched - ours <= inputs, sorted(touched - ours - inputs)
