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
from plugin_env import copy_site, install_self, release_site, run_python

from sglang_dsv4_fix import start
from sglang_dsv4_fix.main import main

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


def serve(site: Path, tree: Path | None = None, **env: str) -> tuple[str, dict[str, str]]:
    """One server process's start on ``tree`` (0.5.16 as released by default): its start line
    (pid left out) and our modules' loaders."""
    tree = tree or release_site("0.5.16")
    done = run_python(SERVE, site, tree, env=env, timeout=120)
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


def test_a_tree_that_needs_more_modules_adds_them_to_the_bundle(own: Path, tmp_path: Path) -> None:
    """A racy tree's start needs no record and no cache check; a fixed tree's does. The modules
    the bundle lacks are imported as usual and join it; from then on a fixed start runs them from
    the bundle when it asks for them, and a racy start, which does not, never runs them."""
    serve(own)
    racy = set(start._read(str(bundle(own))))
    fixed = copy_site(release_site("0.5.16"), tmp_path / "fixed")
    assert main(["apply", "--tree", str(fixed)]) == 0
    cache = {"TVM_FFI_CACHE_DIR": str(tmp_path / "empty-cache")}  # no build: no build names
    line, loaders = serve(own, fixed, **cache)
    assert "variant=no-init" in line
    extra = {"sglang_dsv4_fix.provenance", "sglang_dsv4_fix.jitroot"}
    assert extra <= set(loaders) - bundled(loaders) and extra.isdisjoint(racy)
    assert bundled(loaders) == racy, loaders
    assert set(start._read(str(bundle(own)))) == racy | extra
    _, loaders = serve(own, fixed, **cache)
    assert bundled(loaders) == set(loaders) - {"sglang_dsv4_fix", "sglang_dsv4_fix.start"}
    again, loaders = serve(own)
    assert "variant=racy-init" in again and bundled(loaders) == racy
    assert extra.isdisjoint(loaders) and set(start.LAZY) >= extra


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


def write_bundle(site: Path, entries: dict[str, start.Entry]) -> None:
    import importlib.util
    import marshal

    bundle(site).write_bytes(start.HEADER + importlib.util.MAGIC_NUMBER + marshal.dumps(entries))


def test_damaged_code_in_a_sound_bundle_is_imported_as_usual_and_rewritten(own: Path) -> None:
    line, _ = serve(own)
    entries = start._read(str(bundle(own)))
    write_bundle(own, {n: (*e[:3], b"\xff" * 40) for n, e in entries.items()})
    again, loaders = serve(own)
    assert again == line and bundled(loaders) == set(), loaders
    assert start._read(str(bundle(own))) == entries  # compiled again from the same sources
    _, loaders = serve(own)
    assert "sglang_dsv4_fix.verdict" in bundled(loaders)


def test_only_this_installs_start_modules_are_ever_run_from_a_bundle(
    own: Path, tmp_path: Path
) -> None:
    """A bundle naming another module of ours, or code compiled from a file elsewhere whose size
    and mtime it states truly, runs none of it."""
    line, _ = serve(own)
    entries = start._read(str(bundle(own)))
    planted = tmp_path / "planted.py"
    planted.write_text("print('PLANTED')\n")
    st = planted.stat()
    code = __import__("marshal").dumps(compile(planted.read_text(), str(planted), "exec"))
    forged = {**entries, "sglang_dsv4_fix.heal": (str(planted), st.st_size, st.st_mtime_ns, code)}
    forged["sglang_dsv4_fix.verdict"] = (str(planted), st.st_size, st.st_mtime_ns, code)
    write_bundle(own, forged)
    done = run_python(SERVE, own, release_site("0.5.16"), timeout=120)
    assert done.returncode == 0 and "PLANTED" not in done.stdout + done.stderr, done.stderr
    again, loaders = serve(own)
    assert again == line and "sglang_dsv4_fix.plugin" in bundled(loaders)


def test_the_modules_run_in_an_order_that_needs_no_plain_import() -> None:
    """Each module's imports of ours at its top (not those inside functions) name only modules
    before it in ``start.MODULES``; and ``MODULES`` is what a start on a fixed tree with its build
    cached imports (tests/test_plugin.py), less the package and this entry module."""
    from test_plugin import FIXED, START_PATH

    seen = {"sglang_dsv4_fix"}
    for name in start.MODULES:
        tree = ast.parse(Path(start.DIRECTORY, name.rpartition(".")[2] + ".py").read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "sglang_dsv4_fix"
            ):
                wanted = {node.module} if node.module != "sglang_dsv4_fix" else {
                    f"sglang_dsv4_fix.{a.name}" for a in node.names}  # fmt: skip
                assert wanted <= seen, (name, wanted - seen)
        seen.add(name)
    start_path = {f"sglang_dsv4_fix{m}" for m in START_PATH | FIXED | {".jitnames"}}
    assert set(start.MODULES) == start_path - {"sglang_dsv4_fix", "sglang_dsv4_fix.start"}


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
