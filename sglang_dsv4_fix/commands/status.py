"""status: one screen: tree, release, kernel, variant, preconditions, provenance, verdict."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_dsv4_fix import state, verdict
from sglang_dsv4_fix.commands._common import (
    add_tree,
    command,
    emit,
    options,
    tree_dict,
    tree_of,
    verdict_dict,
)
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.tree import backup_path

HELP = """\
Informational: exits 0 whatever the verdict (use `verify` as a gate); the verdict line and the
JSON's "state", "exit" and "headline" are exactly what `verify` would say."""


def add_parser(sub: Any) -> None:
    p = command(sub, "status", __doc__, HELP)
    add_tree(p)
    p.add_argument("--cache-dir", metavar="DIR", help="TVM-FFI cache (default: as SGLang finds it)")


def run(args: argparse.Namespace) -> int:
    tree = tree_of(args)
    head = [
        f"tree:          {tree.root} ({tree.kind})",
        f"release:       {tree.release or 'unknown'} (from {tree.release_source})",
        f"layout:        {tree.layout or '-'}",
    ]
    if tree.kernel_path is None:
        v = verdict.assess(tree, options(args))
        emit(
            args,
            {**tree_dict(tree), **verdict_dict(v)},
            [*head, "kernel:        none (no DeepSeek-V4 planner)", f"verdict:       {v.headline}"],
        )
        return int(Exit.OK)
    current = state.inspect(tree)
    v = verdict.assess(tree, options(args), current)
    from sglang_dsv4_fix.jitcache import status_line

    cache = status_line(tree, args.cache_dir)
    emit(
        args,
        {**tree_dict(tree), **state_dict(current), **verdict_dict(v), "jit_cache": cache},
        [
            *head,
            *_lines(current),
            f"jit cache:     {cache}",
            f"verdict:       {v.headline}",
            *(f"note:          {n}" for n in v.notes),
        ],
    )
    return int(Exit.OK)


def _lines(s: state.KernelState) -> list[str]:
    c, d = s.classification, state_dict(s)
    base = ", ".join(d["known_base"]) or "-"
    produced = ", ".join(d["produced_from"]) or "-"
    out = [
        f"kernel:        {s.kernel}",
        f"sha256:        {s.sha256}",
        f"variant:       {s.variant} ({c.reason})",
        "preconditions:",
        *(f"  [{'ok' if p.ok else 'VIOLATED'}] {p.name}: {p.detail}" for p in c.preconditions),
        f"manifest:      original of {base}; fix of {produced}",
    ]
    r = s.record
    if r is None:
        how = f"damaged record, not trusted ({s.record_damage})" if s.record_damage else "none"
        out.append(f"provenance:    {how}")
    else:
        now = (
            "in force"
            if s.ours
            else f"not in force: the kernel is no longer the {r.result_sha256[:16]}… it wrote"
        )
        out.append(
            f"provenance:    {r.variant} by sglang-dsv4-fix {r.tool_version} at {r.time} "
            f"({r.method}, base {r.base_release or 'unknown'} {r.base_sha256[:16]}…, {r.state}; {now})"
        )
    matches = " (holds the recorded original)" if d["backup_holds_original"] else ""
    out.append(f"backup:        {d['backup'] or 'none'}{matches}")
    return out


def state_dict(s: state.KernelState) -> dict[str, Any]:
    """The kernel's state as ``status --json`` gives it."""
    c = s.classification
    return {
        "kernel": str(s.kernel),
        "sha256": s.sha256,
        "variant": s.variant,
        "reason": c.reason,
        "safe": s.safe,
        "preconditions": [
            {"name": p.name, "ok": p.ok, "detail": p.detail} for p in c.preconditions
        ],
        "known_base": [r.version for r in s.bases],
        "produced_from": [f"{r.version}:{variant}" for r, variant in s.produced],
        "provenance": None if s.record is None else s.record._asdict(),
        "provenance_damaged": s.record_damage,
        "backup": _backup(s),
        "backup_holds_original": _backup_matches(s),
    }


def _backup(s: state.KernelState) -> str | None:
    path = backup_path(s.kernel)
    return str(path) if path.exists() else None


def _backup_matches(s: state.KernelState) -> bool:
    """The backup beside the kernel holds the original the (validated) record names."""
    from sglang_dsv4_fix.transaction import backup_verdict

    return s.record is not None and backup_verdict(s.kernel, s.record) is None
