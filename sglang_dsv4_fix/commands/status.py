"""status: one screen: tree, release, kernel, variant, preconditions, provenance."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import state
from sglang_dsv4_fix.commands._common import add_tree, command, emit, tree_dict, tree_of
from sglang_dsv4_fix.commands.verify import judge
from sglang_dsv4_fix.errors import Exit


def add_parser(sub: Any) -> None:
    p = command(sub, "status", __doc__)
    add_tree(p)


def run(args: argparse.Namespace) -> int:
    tree = tree_of(args)
    head = [
        f"tree:          {tree.root} ({tree.kind})",
        f"release:       {tree.release or 'unknown'} (from {tree.release_source})",
        f"layout:        {tree.layout or '-'}",
    ]
    if tree.kernel_path is None:
        emit(
            args,
            {**tree_dict(tree), "verdict": "not-applicable"},
            [*head, "kernel:        none (no DeepSeek-V4 planner: not applicable)"],
        )
        return int(Exit.OK)
    current = state.inspect(tree)
    code, summary = judge(current, None)
    from sglang_dsv4_fix.jitcache import status_line

    cache = status_line(tree)
    emit(
        args,
        {**tree_dict(tree), **current.to_dict(), "summary": summary, "jit_cache": cache},
        [*head, *_lines(current), f"jit cache:     {cache}", f"verdict:       {summary}"],
    )
    del code  # status informs; verify is the gate
    return int(Exit.OK)


def _lines(s: state.KernelState) -> list[str]:
    v, d = s.verdict, s.to_dict()
    base = ", ".join(d["known_base"]) or "-"
    produced = ", ".join(d["produced_from"]) or "-"
    out = [
        f"kernel:        {s.tree.kernel_path}",
        f"sha256:        {s.sha256}",
        f"variant:       {v.variant} ({v.reason})",
        "preconditions:",
        *(f"  [{'ok' if p.ok else 'VIOLATED'}] {p.name}: {p.detail}" for p in v.preconditions),
        f"manifest:      original of {base}; fix of {produced}"
        + (f"; {s.drift}" if s.drift else ""),
    ]
    r = s.record
    if r is None:
        out.append("provenance:    none (not patched by sglang-dsv4-fix)")
    else:
        out.append(
            f"provenance:    {r.variant} by sglang-dsv4-fix {r.tool_version} at {r.time} "
            f"({r.method}, base {r.base_release or 'unknown'} {r.base_sha256[:16]}…, {r.state})"
        )
    matches = " (holds the recorded original)" if state.backup_matches(s) else ""
    out.append(f"backup:        {d['backup'] or 'none'}{matches}")
    return out
