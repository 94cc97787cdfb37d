"""The one judgement of a tree. ``verify``, ``status``, ``apply --check``, ``prewarm`` and the
runtime plugin render a :class:`Verdict`; none of them decides on its own.

A kernel is judged by its bytes first (manifest lookup, else the classifier), then by what our
provenance record says about them, then by the JIT cache (a fixed kernel with its racy build still
cached is not fixed for the next server start).

    state           exit  meaning
    verified          0   a safe fix whose sha256 is pinned: a release's fix in the manifest, an
                          upstream-fixed release's own kernel, or the bytes our record wrote
    fixed-unpinned    0   a safe fix we cannot pin (a fork that had the fix; a hand edit); 3 with --strict
    edited-since      0   a safe fix, changed after we wrote it (the record is stale); 3 with --strict
    racy              1   the racy-init kernel0 (sgl-project/sglang#32467)
    unknown           3   kernel0 not recognised
    unsafe            3   a fix whose launch-geometry preconditions do not hold
    not-applicable    4   no DeepSeek-V4 planner (SGLang <= 0.5.11); 0 with --allow-not-applicable
    stale-build       5   the kernel is fixed, but a racy planner build is still in the JIT cache
    wrong-variant    11   fixed, but not the --require-variant
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.value import Value

if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    from sglang_dsv4_fix.state import KernelState
    from sglang_dsv4_fix.tree import Tree

    State: TypeAlias = Literal[
        "verified",
        "fixed-unpinned",
        "edited-since",
        "racy",
        "unknown",
        "unsafe",
        "not-applicable",
        "stale-build",
        "wrong-variant",
    ]

PR = "sgl-project/sglang#32467"
# the subcommands that take --cache-dir: a fixing command repeats the user's (tests check the parser)
CACHE_DIR_COMMANDS = ("apply", "clear-cache", "prewarm", "revert", "status", "verify")


class Options(Value):
    """How strict to be, and how the user named the tree (repeated in every fix command)."""

    __slots__ = (
        "allow_not_applicable",
        "cache_dir",
        "check_cache",
        "require_variant",
        "strict",
        "tree",
    )  # fmt: skip

    def __init__(
        self,
        tree: str | None = None,
        cache_dir: str | None = None,
        strict: bool = False,
        require_variant: str | None = None,
        allow_not_applicable: bool = False,
        check_cache: bool = True,
    ) -> None:
        self.tree, self.cache_dir, self.strict = tree, cache_dir, strict
        self.require_variant, self.allow_not_applicable = require_variant, allow_not_applicable
        self.check_cache = check_cache

    def command(self, name: str, *extra: str) -> str:
        words = ["sglang-dsv4-fix", name, *extra]
        if self.tree is not None:
            words += ["--tree", self.tree]
        if self.cache_dir is not None and name in CACHE_DIR_COMMANDS:
            words += ["--cache-dir", self.cache_dir]
        return shlex.join(words)


class Problem(Value):
    __slots__ = ("fix", "kind", "message")

    def __init__(self, kind: str, message: str, fix: str | None = None) -> None:
        self.kind, self.message = kind, message
        self.fix = fix  # the exact command that fixes it, when one does


class Verdict(Value):
    __slots__ = (
        "exit",
        "headline",
        "notes",
        "pinned_by",
        "problems",
        "sha256",
        "stale_builds",
        "state",
        "variant",
    )  # fmt: skip

    def __init__(
        self,
        state: State,
        exit: int,
        headline: str,
        variant: str,
        sha256: str | None,
        pinned_by: str | None = None,
        problems: tuple[Problem, ...] = (),
        notes: tuple[str, ...] = (),
        stale_builds: tuple[str, ...] = (),
    ) -> None:
        self.state, self.exit, self.variant, self.sha256 = state, exit, variant, sha256
        self.headline = headline  # one line, the same in every rendering
        self.pinned_by = pinned_by  # what the sha256 was matched against
        self.problems = problems
        self.notes = notes  # facts worth saying that fail nothing
        self.stale_builds = stale_builds

    @property
    def ok(self) -> bool:
        return self.exit == Exit.OK

    @property
    def fix(self) -> str | None:
        return next((p.fix for p in self.problems if p.fix), None)


# --------------------------------------------------------------------------- entry points


def assess(
    tree: Tree, opts: Options, current: KernelState | None = None, reads: Reads | None = None
) -> Verdict:
    """Inspect ``tree`` (unless ``current`` is given) and its JIT cache, and judge it; ``reads``
    gets what the cache check read (:func:`inputs`)."""
    from sglang_dsv4_fix import state

    if tree.kernel_path is None:
        return judge(tree, None, None, opts)
    current = state.inspect(tree) if current is None else current
    stale = stale_builds(tree, opts, current, reads) if opts.check_cache and current.safe else None
    return judge(tree, current, stale, opts)


class Reads:
    """The paths a cache check read (its folder's names, the loader files it looked for, each
    planner build and our note in it), or None once it rested on more than paths: a source hash,
    an inventory, an error."""

    __slots__ = ("paths",)

    def __init__(self) -> None:
        self.paths: list[Path] | None = []

    def add(self, *paths: Path) -> None:
        if self.paths is not None:
            self.paths += paths

    def untold(self) -> None:
        self.paths = None


def stale_builds(
    tree: Tree, opts: Options, current: KernelState, reads: Reads | None = None
) -> list[str] | None:
    """Names of racy (or untellable) planner builds in the cache; None if it cannot be told.

    Cheapest first, as this runs in every server process: a cache with no planner entry, or only
    entries our notes prove built from the kernel's current bytes (what ``prewarm`` and a fixed
    tree's first start leave), has none; then entries named by those bytes; only other entries
    are inventoried (jitcache)."""
    from sglang_dsv4_fix import jitroot

    reads = Reads() if reads is None else reads
    root = jitroot.cache_root(opts.cache_dir)
    reads.add(root)
    if not jitroot.has_planner_entry(root):
        return []  # the usual case, told from the names alone
    from sglang_dsv4_fix import jitnames

    reads.add(*(tree.package_dir / f for f in jitnames.LOADER_FILES))
    try:
        if jitnames.modelled_kernel(tree) is None:
            return []
        entries = jitnames.planner_entries(root)
        unnoted = [e for e in entries if not jitnames.noted_current(e, current.sha256)]
        reads.add(*(p for e in entries for p in (Path(e.path), Path(e.path) / jitnames.SIDECAR)))
        if not unnoted:
            return []
        reads.untold()
        if not jitnames.not_named_current(tree, current.data, unnoted):
            return []
        from sglang_dsv4_fix import jitcache

        return [b.name for b in jitcache.racy_builds(tree, opts.cache_dir, current.variant)]
    except Exception:  # no loader to model, an unreadable cache: the kernel verdict stands alone
        reads.untold()
        return None


def inputs(
    tree: Tree, opts: Options, current: KernelState | None, reads: Reads
) -> list[Path] | None:
    """Every path the verdict :func:`assess` gave on ``tree`` with ``reads`` rests on (memo.py
    keeps the plugin's start status on them); None when it rests on more than paths show: a
    release git was asked for where it may read more (``tree.inputs``), or a cache entry told by
    a source hash or an inventory, not by a note."""
    from sglang_dsv4_fix.tree import inputs as tree_inputs
    from sglang_dsv4_fix.tree import record_path

    found = tree_inputs(tree)
    if found is None or current is None:
        return found
    from sglang_dsv4_fix import manifest

    kernel = current.kernel
    found = [kernel, record_path(kernel), manifest.data_dir() / manifest.MANIFEST, *found]
    if not (opts.check_cache and current.safe):
        return found
    return None if reads.paths is None else found + reads.paths


def judge(
    tree: Tree, current: KernelState | None, stale: Sequence[str] | None, opts: Options
) -> Verdict:
    """The verdict on a tree from what was inspected; pure (no file access)."""
    if current is None:
        return _not_applicable(tree, opts)
    v = _kernel_verdict(current, opts)
    notes = (*v.notes, *_record_notes(current))
    if stale is None and opts.check_cache and current.safe:
        notes += ("JIT cache not checked (no cache model for this tree)",)
    v = _with(v, notes=notes)
    if stale and v.state not in ("racy", "unknown", "unsafe"):
        v = _stale(v, stale, opts)
    if opts.require_variant and v.ok and v.variant != opts.require_variant:
        v = _with(v, state="wrong-variant", exit=Exit.WRONG_VARIANT,
                  headline=f"WRONG VARIANT: {v.variant}, required {opts.require_variant}")  # fmt: skip
    return v


# --------------------------------------------------------------------------- the rules


def not_applicable_headline(tree: Tree) -> str:
    """The verdict's words on a tree without the planner (0.5.11 and older), for every surface."""
    return (
        "NOT APPLICABLE: no DeepSeek-V4 planner in this tree "
        f"(release {tree.release or 'unknown'}); not affected"
    )


def _not_applicable(tree: Tree, opts: Options) -> Verdict:
    code = Exit.OK if opts.allow_not_applicable else Exit.NOT_APPLICABLE
    return Verdict("not-applicable", code, not_applicable_headline(tree), "not-applicable", None)


def _kernel_verdict(s: KernelState, opts: Options) -> Verdict:
    variant, sha = s.variant, s.sha256
    short = f"sha256 {sha[:16]}…"
    if variant == "racy-init":
        return _racy(s, opts)
    if variant == "unknown":
        reason = s.classification.reason
        return Verdict("unknown", Exit.UNKNOWN, f"UNKNOWN: kernel0 not recognised ({reason})",
                       variant, sha, problems=(Problem("unknown", reason, None),))  # fmt: skip
    if not s.safe:
        failed = "; ".join(
            f"{p.name} ({p.detail})" for p in s.classification.preconditions if not p.ok
        )
        return Verdict("unsafe", Exit.UNKNOWN,
                       f"UNSAFE: {variant} but preconditions violated: {failed}", variant, sha,
                       problems=(Problem("unsafe", failed, None),))  # fmt: skip
    pin = pinned_by(s)
    if pin is not None:
        return Verdict("verified", Exit.OK, f"VERIFIED: {variant}, {pin} ({short})", variant, sha,
                       pin)  # fmt: skip
    strict = Exit.UNKNOWN if opts.strict else Exit.OK
    if s.record is not None:
        wrote = s.record.result_sha256[:16]
        message = (
            f"changed since sglang-dsv4-fix wrote it (expected sha256 {wrote}…, found {sha[:16]}…)"
        )
        return Verdict("edited-since", strict,
                       f"EDITED SINCE APPLY: still a safe {variant}, but {message}", variant, sha,
                       problems=_strict_problem("edited-since", message, opts))  # fmt: skip
    message = f"{short} is neither a release's fix nor what sglang-dsv4-fix wrote"
    return Verdict("fixed-unpinned", strict,
                   f"FIXED, UNPINNED: safe {variant} kernel0; {message}", variant, sha,
                   problems=_strict_problem("unpinned", message, opts))  # fmt: skip


def pinned_by(s: KernelState) -> str | None:
    """What vouches for these exact bytes: the manifest, or the record of our own write."""
    if s.produced:
        release, variant = s.produced[0]
        return f"the {variant} fix of release {release.version}"
    fixed = [r for r in s.bases if r.fixed_upstream]
    if fixed:
        return f"release {fixed[0].version}'s own kernel (fixed upstream)"
    if s.ours:
        return "the sha256 sglang-dsv4-fix recorded when it wrote this file"
    return None


def _strict_problem(kind: str, message: str, opts: Options) -> tuple[Problem, ...]:
    return (Problem(kind, message, None),) if opts.strict else ()


def _racy(s: KernelState, opts: Options) -> Verdict:
    headline = f"RACY: racy-init kernel0 ({PR})"
    r = s.record
    if r is not None and r.state == "applied" and s.sha256 != r.result_sha256:
        headline += f"; replaced since apply (reinstalled?): the record expected sha256 {r.result_sha256[:16]}…"
    fix = opts.command("apply")
    return Verdict("racy", Exit.VULNERABLE, f"{headline} (run: {fix})", "racy-init", s.sha256,
                   problems=(Problem("racy", "the racy init of warp_max/warp_min", fix),))  # fmt: skip


def _record_notes(s: KernelState) -> tuple[str, ...]:
    out: list[str] = []
    if s.record_damage:
        out.append(f"provenance record damaged, not trusted: {s.record_damage}")
    if s.record is not None and s.record.state == "pending":
        out.append("an interrupted apply/revert left a pending record; the next one finishes it")
    rel = s.expected
    if rel is not None and rel.applicable and not (s.bases or s.produced or s.ours):
        out.append(f"not release {rel.version}'s kernel nor its fix (a fork or a local edit)")
    return tuple(out)


def _stale(v: Verdict, names: Sequence[str], opts: Options) -> Verdict:
    fix = opts.command("clear-cache")
    listed = ", ".join(names)
    message = (
        f"{len(names)} racy (or untellable) planner build(s) remain in the JIT cache: {listed}"
    )
    problems = (*v.problems, Problem("stale-build", message, fix))
    if not v.ok:  # --strict already fails it: keep that verdict, add the cache's problem
        return _with(v, headline=f"{v.headline}; and {message}", problems=problems,
                     stale_builds=tuple(names))  # fmt: skip
    headline = f"STALE BUILD: the kernel is {v.state} ({v.variant}) but {message} (run: {fix})"
    return _with(v, state="stale-build", exit=Exit.STALE_BUILD, headline=headline,
                 problems=problems, stale_builds=tuple(names))  # fmt: skip


def _with(v: Verdict, **changes: Any) -> Verdict:
    return v._replace(**changes)
