"""Forks as first-class trees: on every tree `apply` accepts, the very next `verify` passes.

A property test over generated local edits of the real release kernels: comments, blank lines,
CRLF, extra code outside kernel0, renamed locals inside it, in random combinations (seeded, so a
failure names its seed). The edits are made here, by text, not by the code under test.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import find_tree

BASES = ["0.5.12", "0.5.13", "0.5.15", "0.5.16", "0.5.17"]  # the distinct racy kernels
SEEDS = range(8)
RENAMES = {"warp_id": "fork_warp", "lane_id": "fork_lane", "e_for_max": "emax", "tx": "t_x"}


def kernel0_span(text: str) -> tuple[int, int]:
    """Offsets of kernel0's body braces (a plain brace count: kernel0 has no braces in strings)."""
    start = text.index("{", text.index("void plan_compress_prefill_kernel0"))
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start, i
    raise AssertionError("kernel0 is not closed")


def _at_statement_ends(text: str, rng: random.Random, piece: Callable[[int], str], n: int) -> str:
    lines = text.split("\n")
    ends = [i for i, ln in enumerate(lines) if ln.rstrip().endswith((";", "{", "}"))]
    for k, i in enumerate(sorted(rng.sample(ends, min(n, len(ends))), reverse=True)):
        lines.insert(i + 1, piece(k))
    return "\n".join(lines)


def comments(text: str, rng: random.Random) -> str:
    return _at_statement_ends(text, rng, lambda k: f"  // fork note {k}: reviewed", 6)


def blank_lines(text: str, rng: random.Random) -> str:
    return _at_statement_ends(text, rng, lambda k: "", 6)


def outside_code(text: str, rng: random.Random) -> str:
    n = rng.randrange(1000)
    helper = f"\n__device__ inline int fork_helper_{n}(int x) {{ return x + {n}; }}\n"
    at = text.index("\n", text.index("#include <sgl_kernel/utils.h>")) + 1
    return text[:at] + helper + text[at:]


def renamed_locals(text: str, rng: random.Random) -> str:
    lo, hi = kernel0_span(text)
    body = text[lo:hi]
    for old in rng.sample(sorted(RENAMES), rng.randrange(1, len(RENAMES) + 1)):
        body = re.sub(rf"\b{old}\b", RENAMES[old], body)
    return text[:lo] + body + text[hi:]


EDITS = [comments, blank_lines, outside_code, renamed_locals]


def forked(text: str, seed: int) -> tuple[str, list[str], bool]:
    rng = random.Random(seed)
    chosen = [e for e in EDITS if rng.random() < 0.6] or [rng.choice(EDITS)]
    for e in chosen:
        text = e(text, rng)
    crlf = rng.random() < 0.3
    return text, [e.__name__ for e in chosen], crlf


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("version", BASES)
def test_apply_then_verify_passes_on_a_fork(
    version: str,
    seed: int,
    tree_factory: TreeFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tree_factory.installed(version, tmp_path / "sp")
    kernel = find_tree(root).kernel_path
    assert kernel is not None
    text, edits, crlf = forked(
        kernel.read_text(encoding="utf-8"), seed + 100 * BASES.index(version)
    )
    data = text.encode()
    kernel.write_bytes(data.replace(b"\n", b"\r\n") if crlf else data)
    capsys.readouterr()
    assert main(["verify", "--tree", str(root)]) == 1, edits  # the fork is racy
    capsys.readouterr()
    assert main(["apply", "--tree", str(root), "--json"]) == 0, (edits, capsys.readouterr())
    applied = json.loads(capsys.readouterr().out)
    assert applied["written"], (edits, applied)
    assert main(["verify", "--tree", str(root), "--strict", "--json"]) == 0, edits
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "verified", (edits, out["headline"])
    assert out["pinned_by"] == "the sha256 sglang-dsv4-fix recorded when it wrote this file"
