"""The plugin's JIT-load side: what the planner .so a process loaded was built from, in the
verdict's words.

The plugin hooks the release's ``_jit_compress_plan_module`` (:func:`hook_loader`) once the
loader's module is imported; on its first call :func:`around_jit_module` logs and records which
.so it loaded. All of it runs in a process about to compile or load the planner, so it is kept
out of the plugin's start path, which every SGLang process pays (docs/plugin.md, "Cost").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_dsv4_fix import events, plugin
from sglang_dsv4_fix.plugin import Status

SO_MARK = "dpsk_v4_compress_plan"  # in every release's planner module (and so .so) name
_hooked = False  # hook_loader ran in this process


def hook_loader(module: str) -> None:
    """AROUND ``<loader>._jit_compress_plan_module`` through SGLang's registry (it keeps the
    loader's ``@cache_once``). Its module walk is paid once, when the loader is imported, in a
    process that is about to compile or load the planner anyway, never at start."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    global _hooked
    if _hooked:
        return
    _hooked = True
    source = HookSource(plugin_name=plugin.ENTRY_POINT, dist_name="sglang-dsv4-fix")
    target = f"{module}.{plugin.JIT_FUNCTION}"
    HookRegistry.register(target, around_jit_module, HookType.AROUND, source=source)
    HookRegistry.apply_hooks()  # applies only targets not yet patched


def around_jit_module(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND ``_jit_compress_plan_module``: on its first call, tell which .so it loaded."""
    p = plugin._current()
    if p is None or p.jit_done:
        return original(*args, **kwargs)
    plugin._log_start()  # a process that never configured logging says it at first use
    p.jit_done = True
    t0, before = time.time(), mapped_planner_objects()
    module = original(*args, **kwargs)
    report: dict[str, Any] = {}
    plugin._guard("JIT-load report", lambda: report.update(_jit_report(p, t0, before)))
    if p.mode in plugin.ENFORCING and report.get("problem"):
        raise RuntimeError(f"{plugin.TAG} refusing the planner build: {report['problem']}")
    return module


def _jit_report(p: plugin._Process, t0: float, before: set[str]) -> dict[str, Any]:
    after = mapped_planner_objects()
    new = sorted(after - before) or sorted(after)
    so = Path(new[0]) if new else None
    built = built_from(p.status, so, t0)
    record = {**events.start_record(p), "event": "jit-load", "so": str(so) if so else None, **built}
    record["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record.update(build_verdict(p.status, built))
    refuses = p.mode in plugin.ENFORCING  # around_jit_module then raises: the build is not served
    record["action"] = ("refused" if refuses else "warned") if record["problem"] else "ok"
    _log_jit(record)
    plugin._guard("report", lambda: events.write_report(record))
    return record


def _log_jit(r: dict[str, Any]) -> None:
    how = {True: "compiled now", False: "from cache", None: "?"}[r.get("compiled_now")]
    line = (
        f"{plugin.TAG} JIT planner loaded so={r['so']} ({how}) "
        f"built-from variant={r['built_variant']} sha256={(r['built_sha256'] or '')[:12]} "
        f"evidence={r['evidence']!r} pid={r['pid']}"
    )
    if r["problem"]:
        plugin.logger.error(f"{line} -- {r['state'].upper()}: {r['problem']}")
    else:
        plugin.logger.info(line)


def mapped_planner_objects() -> set[str]:
    """Planner .so files this process has mapped (/proc/self/maps: what dlopen really took)."""
    found: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            if SO_MARK in line and ".so" in line:
                found.add(line.split(None, 5)[-1].strip())
    return found


def built_from(status: Status, so: Path | None, t0: float) -> dict[str, Any]:
    """What the loaded .so was built from: our sidecar, the cache model, or (a build this call
    caused) the kernel bytes on disk now, in which case we leave a sidecar beside it."""
    if so is None:
        return {"compiled_now": None, "built_from": "unknown", "built_variant": None,
                "built_sha256": None, "evidence": ".so not found in /proc/self/maps"}  # fmt: skip
    compiled_now = so.stat().st_mtime >= t0 - 1.0
    note = _sidecar(so)
    if note is not None:
        return _from_note(note, compiled_now, "sidecar beside the build")
    if compiled_now and status.kernel:
        return _record_build(status, so)
    return _from_cache_model(status, so, compiled_now)


def _from_note(note: dict[str, Any], compiled_now: bool, evidence: str) -> dict[str, Any]:
    return {
        "compiled_now": compiled_now,
        "built_from": note.get("kernel"),
        "built_variant": note.get("variant"),
        "built_sha256": note.get("kernel_sha256"),
        "evidence": evidence,
    }


def _sidecar(so: Path) -> dict[str, Any] | None:
    """Our note beside the loaded .so, if it speaks for that very file."""
    from sglang_dsv4_fix import jitcache

    return jitcache.read_sidecar(so.parent, so.name)


def _record_build(status: Status, so: Path) -> dict[str, Any]:
    from sglang_dsv4_fix import __version__, jitcache
    from sglang_dsv4_fix.fsops import KERNEL_LIMIT, read_regular, sha256_bytes
    from sglang_dsv4_fix.kernel import classify

    assert status.kernel is not None
    data = read_regular(Path(status.kernel), KERNEL_LIMIT, "kernel")
    if not _named_by(status, so.parent.name, data):  # the kernel changed while it compiled
        return _from_cache_model(status, so, True)
    note = {
        "tool": "sglang-dsv4-fix",
        "tool_version": __version__,
        "written_by": "plugin",
        "release": status.release,
        "kernel": status.kernel,
        "kernel_sha256": sha256_bytes(data),
        "variant": classify(data.decode("utf-8", errors="replace")).variant,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    jitcache.write_sidecar(so.parent, so, note)
    return _from_note(note, True, "compiled by this call from the kernel on disk; sidecar written")


def _named_by(status: Status, name: str, data: bytes) -> bool:
    """Whether a build folder's name could come from ``data``: a content-named folder (0.5.13+)
    must carry the loader's hash of it, or the note would vouch for bytes the build never saw
    (and jitnames.not_current believes a note). A 0.5.12 name never tells: only the note can."""
    from sglang_dsv4_fix.jitnames import CONTENT_SCHEMES, parse_name
    from sglang_dsv4_fix.jitsource import source_hash
    from sglang_dsv4_fix.tree import find_tree

    parsed = parse_name(name)
    if parsed is None or parsed[0] not in CONTENT_SCHEMES:
        return True
    scheme, parts = parsed
    return source_hash(find_tree(status.package_dir), data, scheme) == parts["src"]


def _from_cache_model(status: Status, so: Path, compiled_now: bool) -> dict[str, Any]:
    from sglang_dsv4_fix import jitcache
    from sglang_dsv4_fix.tree import find_tree

    tree = find_tree(status.package_dir)
    for build in jitcache.inventory(tree, so.parent.parent):
        if build.path == so.parent:
            return {"compiled_now": compiled_now, "built_from": status.kernel,
                    "built_variant": origin_variant(build.origin, status),
                    "built_sha256": build.origin_sha256, "evidence": build.detail}  # fmt: skip
    return {"compiled_now": compiled_now, "built_from": None, "built_variant": None,
            "built_sha256": None, "evidence": "not a build this tool can name"}  # fmt: skip


def origin_variant(origin: str, status: Status) -> str | None:
    if origin == "original":
        return "racy-init"
    if origin == "current":
        return status.variant
    return origin if origin in ("no-init", "barrier") else None


def build_verdict(status: Status, built: dict[str, Any]) -> dict[str, Any]:
    """The loaded build in the verdict's words (verdict.py): a racy build under a fixed kernel is
    ``stale-build`` (exit 5), under the racy kernel ``racy`` (1), an untellable one ``unknown`` (3)."""
    from sglang_dsv4_fix.errors import Exit
    from sglang_dsv4_fix.kernel import FIXED
    from sglang_dsv4_fix.verdict import PR

    variant = built.get("built_variant")
    if variant in FIXED:
        return {"state": status.state, "exit": status.exit_code, "problem": None}
    if variant == "racy-init":
        state, code = ("racy", Exit.VULNERABLE) if status.variant == "racy-init" else (
            "stale-build", Exit.STALE_BUILD)  # fmt: skip
        message = f"the loaded planner .so was built from the racy kernel ({PR})"
        return {"state": state, "exit": int(code), "problem": message}
    message = f"cannot tell what the loaded planner .so was built from ({built.get('evidence')})"
    return {"state": "unknown", "exit": int(Exit.UNKNOWN), "problem": message}
