"""SGLang plugin: every process says which planner kernel it runs, and can refuse a racy one.

Registered as the entry point ``sglang_dsv4_fix`` in the group ``sglang.srt.plugins``. SGLang's
``load_plugins()`` calls :func:`register` once in the launcher/engine and in every scheduler (TP
rank) process. It runs before SGLang configures logging, so the start line is logged right AFTER
``configure_logger`` (the ranks come from its prefix, the GPU from ``configure_scheduler_process``);
a process that never configures logging gets it at its first planner load or at exit. A problem is
logged at ERROR (seen under the offline Engine's default ``log_level="error"``), a healthy tree at
INFO. The JIT-load report comes from a hook AROUND the release's ``_jit_compress_plan_module``
(sgl-project/sglang#32467 lives in the kernel it compiles).

Environment: ``SGLANG_DSV4_FIX_MODE`` = ``warn`` (default) | ``enforce`` | ``heal`` | ``off``;
``SGLANG_DSV4_FIX_REPORT`` = a JSON-lines file that gets one record per event (docs/plugin.md);
``PROMETHEUS_MULTIPROC_DIR`` (SGLang's ``--enable-metrics``): one gauge per process (metrics.py).
In warn mode nothing here can stop SGLang: every failure is caught and logged.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sglang_dsv4_fix.value import Value

if TYPE_CHECKING:
    from sglang_dsv4_fix.state import KernelState
    from sglang_dsv4_fix.tree import Tree
    from sglang_dsv4_fix.verdict import Verdict

logger = logging.getLogger(__name__)

ENTRY_POINT = "sglang_dsv4_fix"
MODE_ENV = "SGLANG_DSV4_FIX_MODE"
REPORT_ENV = "SGLANG_DSV4_FIX_REPORT"  # events.py writes it
MODES = ("warn", "enforce", "heal", "off")
ENFORCING = ("enforce", "heal")  # heal refuses what it cannot heal, as enforce does
TAG = "sglang-dsv4-fix:"
# SGLang's configure_logger (every release) sets up logging through logging.basicConfig; in a
# scheduler process it is called by configure_scheduler_process(server_args, gpu_id, ...).
LOGGER_FUNCTION, SCHEDULER_FUNCTION = "configure_logger", "configure_scheduler_process"
JIT_FUNCTION = "_jit_compress_plan_module"


class Status(Value):
    """What this process's SGLang tree holds, as told once at start."""

    __slots__ = (
        "exit_code",
        "fix",
        "headline",
        "healed",
        "kernel",
        "layout",
        "loader_module",
        "package_dir",
        "patched_by",
        "preconditions",
        "problem",
        "release",
        "sha256",
        "state",
        "tree_arg",
        "variant",
    )  # fmt: skip

    def __init__(
        self,
        package_dir: str,
        release: str | None = None,
        layout: str | None = None,
        kernel: str | None = None,
        variant: str = "not-applicable",
        sha256: str | None = None,
        preconditions: str = "-",
        patched_by: str = "none",
        problem: str | None = None,
        fix: str | None = None,
        exit_code: int = 0,
        loader_module: str | None = None,
        tree_arg: str = "",
        state: str = "not-applicable",
        headline: str = "",
        healed: str | None = None,
    ) -> None:
        self.package_dir, self.release, self.layout = package_dir, release, layout
        self.kernel = kernel  # c_plan.cuh's path; None: no DeepSeek-V4 planner (<= 0.5.11)
        self.variant, self.sha256, self.state = variant, sha256, state  # the verdict's
        self.preconditions = preconditions  # "ok", or the names of the failed ones
        self.patched_by, self.loader_module, self.tree_arg = patched_by, loader_module, tree_arg
        self.problem, self.fix, self.exit_code, self.headline = problem, fix, exit_code, headline
        self.healed = healed  # heal mode: what this process healed (its ERROR line)


class _Process:
    """This process: its mode and status, and what it has said so far (plain slots, not a
    dataclass: the plugin's module is imported in every SGLang process, docs/plugin.md "Cost")."""

    __slots__ = ("gpu", "jit_done", "logged", "mode", "pid", "rank", "started", "status")

    def __init__(
        self,
        mode: str,
        status: Status,
        started: float,
        gpu: str | None = None,
        rank: str | None = None,
    ) -> None:
        self.mode, self.status, self.started = mode, status, started
        self.gpu, self.rank = gpu, rank
        self.logged = self.jit_done = False
        self.pid = os.getpid()

    @property
    def role(self) -> str:
        return "scheduler" if self.gpu is not None else "main"


_process: _Process | None = None
_registered = False


def register() -> None:
    """SGLang's entry point: zero-argument, idempotent, never raises in warn mode."""
    global _registered, _process
    if _registered:
        return
    _registered = True
    mode = _mode()
    if mode == "off":
        return
    try:
        status = _start_status(_sglang_package(), mode)
    except Exception as e:  # the plugin must never take serving down in warn mode
        if mode in ENFORCING:  # enforce serves only what it has seen to be safe
            _exit(f"{TAG} refusing to start: cannot inspect the SGLang tree ({e})", 3)
        logger.error("%s could not inspect the SGLang tree (%s); serving continues", TAG, e)
        return
    _process = _Process(mode, status, time.time())
    if mode in ENFORCING and status.problem:
        _refuse(_process)
    _guard("hooks", _install_hooks)


def _mode() -> str:
    raw = os.environ.get(MODE_ENV, "warn").strip().lower() or "warn"
    if raw in MODES:
        return raw
    logger.warning(
        "%s unknown %s=%r (use warn, enforce, heal, off); using warn", TAG, MODE_ENV, raw
    )
    return "warn"


def _guard(what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as e:
        logger.warning("%s %s failed (%s: %s); serving continues", TAG, what, type(e).__name__, e)


def _sglang_package() -> Path:
    """The folder of the ``sglang`` this process imported (no search, no import)."""
    module = sys.modules.get("sglang")
    spec = getattr(module, "__spec__", None)
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if not locations:
        raise RuntimeError("sglang is not imported in this process")
    return Path(locations[0])


# --------------------------------------------------------------------------- the tree's state


def _start_status(package_dir: Path, mode: str) -> Status:
    """The tree's status: as an earlier process on this host judged it, when nothing that rests
    on has changed since (memo.py), else judged now and kept for the next process."""
    if mode == "heal":  # heal acts on what it finds now
        from sglang_dsv4_fix import heal

        return heal.at_start(inspect_tree(package_dir), inspect_tree)
    from sglang_dsv4_fix import memo

    fields = memo.lookup(str(package_dir))
    if fields is not None:
        with contextlib.suppress(TypeError):  # an entry of other fields: judge again
            return Status(**fields)
    judged_ns = time.time_ns()
    status, inputs = _judge(package_dir, keep=memo.enabled())
    if inputs is not None:
        with contextlib.suppress(Exception):  # a faster next start, never a failed one
            memo.store(str(package_dir), status._asdict(), inputs, judged_ns)
    return status


def inspect_tree(package_dir: Path) -> Status:
    """The tree's verdict (the one ``verify`` gives), rendered into this process's status."""
    return _judge(package_dir)[0]


def _judge(package_dir: Path, keep: bool = False) -> tuple[Status, list[Path] | None]:
    """The status, and with ``keep`` the paths its verdict rests on (``verdict.inputs``), for
    memo.py (None: the verdict rests on more than paths, or they could not be told)."""
    from sglang_dsv4_fix import state, verdict
    from sglang_dsv4_fix.tree import find_tree

    tree = find_tree(package_dir)
    tree_arg = str(tree.git_root or tree.package_dir.parent)
    current = None if tree.kernel_path is None else state.inspect(tree)
    # a tree without the planner is not affected: it serves (verify --allow-not-applicable)
    opts = verdict.Options(tree=tree_arg, allow_not_applicable=True)
    reads = verdict.Reads()
    v = verdict.assess(tree, opts, current, reads)
    inputs = None
    if keep:
        with contextlib.suppress(Exception):
            inputs = verdict.inputs(tree, opts, current, reads)
    return _status(tree, tree_arg, v, current), inputs


def _status(tree: Tree, tree_arg: str, v: Verdict, current: KernelState | None) -> Status:
    status = Status(
        str(tree.package_dir),
        tree.release,
        tree.layout,
        variant=v.variant,
        sha256=v.sha256,
        state=v.state,
        headline=v.headline,
        problem=None if v.ok else v.headline,
        fix=v.fix,  # None when the verdict is ok: it then has no problems
        exit_code=int(v.exit),
        tree_arg=tree_arg,
    )
    if current is None:
        return status
    return status._replace(
        kernel=str(tree.kernel_path),
        loader_module=tree.loader_module,
        preconditions=_preconditions(current),
        patched_by=_patched_by(current),
    )


def _preconditions(current: Any) -> str:
    """ "ok" or the failed ones' names; a release's known bytes (original or fix, checked when
    the manifest was generated) are not parsed again."""
    if current.produced or current.bases:
        return "ok"
    failed = [p.name for p in current.classification.preconditions if not p.ok]
    if not current.classification.preconditions:
        return "-"
    return "ok" if not failed else ",".join(failed)


def _patched_by(current: Any) -> str:
    r = current.record
    if r is None:
        return "damaged-record" if current.record_damage else "none"
    return f"sglang-dsv4-fix/{r.tool_version}" + ("" if current.ours else "(edited-since)")


# --------------------------------------------------------------------------- what is said


def start_line(p: _Process) -> str:
    """One line of ``key=value`` fields (logfmt: a value with a space, a quote or an ``=`` is
    quoted, so a log pipeline splits it into the fields written), then, after `` -- ``, the
    problem in words."""
    s = p.status
    where = _where(p)
    if s.kernel is None:  # the same fields as a kernel's, then the verdict's own words
        return (f"{TAG} c_plan.cuh {_kv('variant', s.variant)} {_kv('release', s.release or '?')} "
                f"{where} {_kv('mode', p.mode)} -- {s.headline}")  # fmt: skip
    line = " ".join((
        f"{TAG} c_plan.cuh",
        _kv("variant", s.variant),
        _kv("sha256", (s.sha256 or "")[:12]),
        _kv("release", s.release or "?"),
        _kv("layout", s.layout),
        _kv("patched-by", s.patched_by),
        where,
        _kv("preconditions", s.preconditions),
        _kv("mode", p.mode),
    ))  # fmt: skip
    if s.problem:
        line += f" -- {s.problem}; serving continues"
    return line


def _where(p: _Process) -> str:
    parts = [_kv("process", p.role)]
    if p.rank:
        parts.append(_kv("rank", p.rank))
    if p.gpu is not None:
        parts.append(_kv("gpu", p.gpu))
    parts.append(f"pid={os.getpid()}")
    return " ".join(parts)


def _kv(key: str, value: object) -> str:
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return f"{key}={text}"
    return f"{key}={json.dumps(text)}"  # one line, its quotes and backslashes escaped


def refuse_line(s: Status) -> str:
    return f"{TAG} refusing to start: {s.problem} ({s.kernel}) (or set {MODE_ENV}=warn to serve anyway)"


def _refuse(p: _Process) -> None:
    """enforce: one line on stderr (logging is not configured yet), a report record, exit."""
    s = p.status
    with contextlib.suppress(Exception):
        from sglang_dsv4_fix import events

        events.write_report({**events.start_record(p), "action": "refused"})
    _exit(refuse_line(s), s.exit_code)


def _exit(line: str, code: int) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


# --------------------------------------------------------------------------- hooks


def _install_hooks() -> None:
    """Hook SGLang's logging set-up (the start line follows it) and, once its module is imported,
    the planner's loader; the start line is logged at exit if nothing configures logging or loads
    the planner before then."""
    atexit.register(_log_start)
    _hook_basic_config()
    loader = _process.status.loader_module if _process else None
    if loader:
        _when_imported(loader, lambda: _hook_loader(loader))
    if logging.getLogger().handlers:  # logging is configured already: say it now
        _log_start()


def _hook_basic_config() -> None:
    """AFTER ``logging.basicConfig`` when SGLang's ``configure_logger`` is the caller.

    One attribute of the ``logging`` module is replaced, and SGLang calls it through that
    attribute in every release. Wrapping ``configure_logger`` itself would mean re-pointing each
    module that imported it by name: a walk over the ~4,000 modules a server process has loaded,
    1-3 ms per process (docs/plugin.md, "Cost"). Other callers of ``basicConfig`` pass through."""
    original = logging.basicConfig
    if getattr(original, "__sglang_dsv4_fix__", False):
        return

    @functools.wraps(original)
    def basicConfig(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        caller = sys._getframe(1)
        if caller.f_code.co_name == LOGGER_FUNCTION:
            _guard("start line", lambda: _after_configure_logger(caller))

    basicConfig.__sglang_dsv4_fix__ = True  # type: ignore[attr-defined]
    logging.basicConfig = basicConfig


def _current() -> _Process | None:
    """This process's state; a forked child (SGLang's load_plugins() is then a no-op there, the
    hooks are inherited) starts its own: its own start line, record and JIT report."""
    global _process
    p = _process
    if p is not None and p.pid != os.getpid():
        status = p.status._replace(healed=None)  # the parent healed, not this child
        p = _process = _Process(p.mode, status, time.time(), gpu=p.gpu, rank=p.rank)
    return p


def _after_configure_logger(frame: types.FrameType) -> None:
    """Logging works now. SGLang's rank prefix (`` TP3``) is ``configure_logger``'s own
    ``prefix`` argument; in a scheduler its caller, ``configure_scheduler_process``, holds the
    ``gpu_id`` (0.5.12 - 0.5.23)."""
    p = _current()
    if p is not None:
        prefix = frame.f_locals.get("prefix")
        if isinstance(prefix, str) and prefix.strip():
            p.rank = ",".join(prefix.split()).lower()
        outer = frame.f_back
        if outer is not None and outer.f_code.co_name == SCHEDULER_FUNCTION:
            gpu = outer.f_locals.get("gpu_id")
            p.gpu = None if gpu is None else str(gpu)
    _log_start()


def _log_start() -> None:
    """The start line, once per process: ERROR for a problem (visible at every SGLang log level;
    with logging unconfigured, Python's last-resort handler still prints it on stderr), INFO for
    a healthy tree; then the report record and the /metrics gauge."""
    p = _current()
    if p is None or p.logged:
        return
    p.logged = True
    if p.status.healed:
        logger.error(f"{TAG} {p.status.healed} pid={os.getpid()}")
        logger.info(f"{TAG} after healing: {p.status.headline}")
    # the line is the message itself, no arguments: a first LogRecord with one argument costs an
    # ABC check (is it a Mapping?) of ~0.2 ms in every process (docs/plugin.md, "Cost")
    logger.log(logging.ERROR if p.status.problem else logging.INFO, start_line(p))
    if os.environ.get(REPORT_ENV):
        _guard("report", lambda: _report_start(p))
    _guard("metrics", lambda: _export_metrics(p))


def _report_start(p: _Process) -> None:
    from sglang_dsv4_fix import events

    events.write_report(events.start_record(p))


def _export_metrics(p: _Process) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # else prometheus_client is never imported
        from sglang_dsv4_fix import events, metrics

        s = p.status
        metrics.export(variant=s.variant, verdict=s.state, sha256=(s.sha256 or "")[:12],
                       release=s.release or "", process=p.role, rank=p.rank or "",
                       action=events.action(s))  # fmt: skip


# --------------------------------------------------------------------------- JIT load


def _when_imported(module: str, then: Callable[[], None]) -> None:
    """Run ``then`` now if ``module`` is imported, else the moment it is (importing it here would
    cost every process its import chain: the planner's loader pulls transformers)."""
    if module in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _ImportWatch(module, then))


def _hook_loader(module: str) -> None:
    from sglang_dsv4_fix import jitload  # the JIT-load side: kept off the start path

    jitload.hook_loader(module)


class _ImportWatch:
    """A meta-path finder that runs ``then`` right after one module has executed."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = cast(Any, _ThenLoader(spec.loader, self.then))
        return spec


class _ThenLoader:
    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _guard("JIT-load hook", self._then)
