"""A kernel folder swapped for a symbolic link while apply and revert run: nothing outside changes.

Realistic when root patches a tree a less privileged user can write: the user replaces the
``deepseek_v4`` folder with a link to a folder of theirs, again and again, hoping one of root's
writes (a temp file, a sidecar, the kernel) lands there. Another process swaps the folder as fast
as it can for a bounded time while this one runs the real ``apply`` and ``revert`` in a loop;
afterwards the outside folder must be byte for byte what it was, and the tree consistent.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main

pytestmark = pytest.mark.slow

KERNEL = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
SECONDS = 8.0
SWAPPER = r"""
import os, sys, time
folder, aside, link, outside, stop = sys.argv[1:6]
os.symlink(outside, link)
n = 0
while not os.path.exists(stop):
    os.rename(folder, aside)    # the real folder steps aside
    os.rename(link, folder)     # a link to the outside folder takes its name
    time.sleep(0.0005 * (n % 3))
    os.rename(folder, link)
    os.rename(aside, folder)
    time.sleep(0.001 * (n % 5))  # the real folder stays a while: runs must get through too
    n += 1
print(n)
"""


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = f"{st.st_mode:o} {data}"
    return out


def quiet(argv: list[str], errors: list[str] | None = None) -> int:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    if errors is not None and code not in (Exit.OK, Exit.REFUSED):
        errors.append(err.getvalue())
    return code


def test_folder_swapped_for_a_link_never_redirects_a_write(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    folder = (root / KERNEL).parent
    outside = tmp_path / "outside"
    tree_factory.installed("0.5.16", tmp_path / "other")
    (tmp_path / "other" / KERNEL).parent.rename(outside)  # a real kernel folder, outside the tree
    before = snapshot(outside)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SWAPPER,
            str(folder),
            str(tmp_path / "aside"),
            str(tmp_path / "link"),
            str(outside),
            str(stop),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    codes: dict[int, int] = {}
    errors: list[str] = []
    runs = 0
    try:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            verb = "apply" if runs % 2 == 0 else "revert"
            code = quiet([verb, "--tree", str(root), "--no-clear-cache"], errors)
            codes[code] = codes.get(code, 0) + 1
            runs += 1
    finally:
        stop.touch()
        swaps = int(swapper.communicate(timeout=30)[0])
    print(f"{runs} runs against {swaps} swaps: exit codes {codes}")
    assert snapshot(outside) == before, (
        f"{runs} runs: a write landed outside the tree: {sorted(set(snapshot(outside)) ^ set(before))}"
    )
    assert swaps > 100 and runs > 20 and codes.get(Exit.OK, 0) > 5, codes
    # Refused, or (mid-swap) no tree, no kernel: never an internal error.
    allowed = {Exit.OK, Exit.REFUSED, Exit.NOT_FOUND, Exit.NOT_APPLICABLE}
    assert set(codes) <= allowed, (codes, errors[:3])
    assert folder.is_dir() and not folder.is_symlink()
    # The tree is whole: a plain revert (after recovery) gives back the release's original.
    assert quiet(["revert", "--tree", str(root), "--no-clear-cache"]) == Exit.OK
    kernel = hashlib.sha256((root / KERNEL).read_bytes()).hexdigest()
    assert kernel == manifest.load().releases["0.5.16"].sha256
    leftovers = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert leftovers == [], json.dumps(leftovers)
