"""The plugin's entry point under SGLang's real ``load_plugins()``: its start modules from one
bundle file, and whatever that file turns out to be, the same start line."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_env import install_self, release_site, run_python

from sglang_dsv4_fix import start

pytestmark = pytest.mark.slow

SERVE = """
import sys, types
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.utils as utils
utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP1")
ours = {n: type(m.__loader__).__name__ for n, m in sys.modules.items() if n.startswith("sglang_dsv4_fix")}
print("LOADERS", sorted(ours.items()))
"""
LINE = re.compile(r"sglang-dsv4-fix: c_plan\.cuh (.*) pid=\d+ (.*)$", re.MULTILINE)
TAG = sys.implementation.cache_tag


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_self(tmp_path_factory.mktemp("start") / "site")


@pytest.fixture
def own(installed: Path, tmp_path: Path) -> Path:
    """A private copy of the install (its sources' mtimes kept), with no bundle yet."""
    site = tmp_path / "site"
    shutil.copytree(installed, site, symlinks=True)
    bundle(site).unlink(missing_ok=True)
    return site


def bundle(site: Path) -> Path:
    return site / "sglang_dsv4_fix" / "__pycache__" / f"start.{TAG}.bundle"


def serve(site: Path, **env: str) -> tuple[str, dict[str, str]]:
    """One server process's start: its start line (pid left out) and our modules' loaders."""
    done = run_python(SERVE, site, release_site("0.5.16"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = LINE.findall(done.stderr)
    loaders = re.search(r"^LOADERS (.*)$", done.stdout, re.MULTILINE)
    assert loaders is not None, done.stdout
    return " ".join(line), dict(ast.literal_eval(loaders.group(1)))


def bundled(loaders: dict[str, str]) -> set[str]:
    return {n for n, kind in loaders.items() if kind == "Bundle"}


def test_a_second_start_reads_its_start_modules_from_the_bundle(own: Path) -> None:
    line, loaders = serve(own)
    assert "variant=racy-init" in line and bundled(loaders) == set(), loaders
    written = bundle(own).read_bytes()
    assert written.startswith(start.HEADER)
    again, loaders = serve(own)
    assert again == line
    # everything the start imported but the package and the entry point itself
    assert bundled(loaders) == set(loaders) - {"sglang_dsv4_fix", "sglang_dsv4_fix.start"}
    assert "sglang_dsv4_fix.verdict" in bundled(loaders)
    assert bundle(own).read_bytes() == written  # nothing new to add: not written again


def test_an_edited_module_comes_from_its_source_and_joins_the_bundle(own: Path) -> None:
    line, _ = serve(own)
    verdict = own / "sglang_dsv4_fix" / "verdict.py"
    with verdict.open("a") as f:
        f.write("EDITED = True\n")
    again, loaders = serve(own)
    assert again == line and loaders["sglang_dsv4_fix.verdict"] == "SourceFileLoader"
    assert "sglang_dsv4_fix.plugin" in bundled(loaders)
    entries = start._read(str(bundle(own)))
    assert entries["sglang_dsv4_fix.verdict"][1] == verdict.stat().st_size
    _, loaders = serve(own)
    assert loaders["sglang_dsv4_fix.verdict"] == "Bundle"


def test_a_moved_install_does_not_use_the_old_places_bundle(own: Path, tmp_path: Path) -> None:
    serve(own)
    moved = shutil.copytree(own, tmp_path / "moved", symlinks=True)  # mtimes and bundle kept
    _, loaders = serve(moved)
    assert bundled(loaders) == set(), loaders
    entries = start._read(str(bundle(moved)))
    assert {e[0] for e in entries.values()} <= {str(p) for p in moved.rglob("*.py")}


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(5000))


def _other_python(path: Path) -> None:  # another version's magic number: its code objects differ
    path.write_bytes(start.HEADER + b"\x00\x00\r\n" + b"\x00" * 100)


def _huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(start.MAX_BYTES + 1)


def _folder(path: Path) -> None:
    path.mkdir()


def _not_a_dict(path: Path) -> None:
    import importlib.util
    import marshal

    path.write_bytes(start.HEADER + importlib.util.MAGIC_NUMBER + marshal.dumps([1, 2, 3]))


@pytest.mark.parametrize(
    "make", [_fifo, _garbage, _other_python, _huge, _folder, _not_a_dict], ids=lambda f: f.__name__
)
def test_a_strange_bundle_is_ignored(make: object, own: Path) -> None:
    line, _ = serve(own)
    target = bundle(own)
    target.unlink()
    make(target)  # type: ignore[operator]
    again, loaders = serve(own)  # run_python's timeout: a FIFO that hung the start would fail
    assert again == line and bundled(loaders) == set(), loaders


def test_a_bundle_behind_a_link_is_neither_read_nor_written_through(
    own: Path, tmp_path: Path
) -> None:
    serve(own)
    elsewhere = tmp_path / "elsewhere.bundle"
    bundle(own).rename(elsewhere)
    kept = elsewhere.read_bytes()
    bundle(own).symlink_to(elsewhere)
    _, loaders = serve(own)
    assert bundled(loaders) == set() and elsewhere.read_bytes() == kept
    assert not bundle(own).is_symlink()  # replaced by a bundle of its own


def test_damaged_code_in_a_sound_bundle_is_compiled_from_the_source(own: Path) -> None:
    import importlib.util
    import marshal

    line, _ = serve(own)
    entries = start._read(str(bundle(own)))
    entries = {n: (*e[:3], b"\xff" * 40) for n, e in entries.items()}
    bundle(own).write_bytes(start.HEADER + importlib.util.MAGIC_NUMBER + marshal.dumps(entries))
    again, loaders = serve(own)
    assert again == line and "sglang_dsv4_fix.verdict" in bundled(loaders)


def test_no_bundle_where_python_writes_no_bytecode(own: Path) -> None:
    serve(own, PYTHONDONTWRITEBYTECODE="1")
    assert not bundle(own).exists()


def test_no_bundle_without_a_pycache_folder(own: Path) -> None:
    shutil.rmtree(own / "sglang_dsv4_fix" / "__pycache__")
    (own / "sglang_dsv4_fix" / "__pycache__").write_text("not a folder\n")
    line, loaders = serve(own)
    assert "variant=racy-init" in line and bundled(loaders) == set()
    assert (own / "sglang_dsv4_fix" / "__pycache__").read_text() == "not a folder\n"


def test_the_entry_point_is_the_start_module(installed: Path) -> None:
    done = subprocess.run(
        (sys.executable, "-c", "from importlib.metadata import entry_points as e\n"
         "print([x.value for x in e(group='sglang.srt.plugins', name='sglang_dsv4_fix')])"),
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(installed)},
        cwd=installed, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "['sglang_dsv4_fix.start:register']"
