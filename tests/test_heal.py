"""``SGLANG_DSV4_FIX_MODE=heal`` under SGLang's real ``load_plugins()``, in fresh interpreters.

Each server process is a new base interpreter (tests/plugin_env.py) with the real SGLang 0.5.16
and this package on its path. It imports SGLang's plugin machinery, waits on a start gate (one
byte on stdin, so eight of them reach the tree together), runs ``load_plugins()`` and SGLang's own
``configure_logger``, then enters the release's real ``_jit_compress_plan_module`` (through the
plugin's AROUND hook) with the loader's ``load_jit`` swapped for a probe that records the kernel's
bytes, its provenance record and any temp file at that moment, and stops (no compiler here).
The JIT cache holds the racy build and a prewarmed no-init build, under the names the release's
own naming code gives (tests/test_jitcache.py's helpers).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from plugin_env import base_python, copy_site, install_self, release_site, run_python
from test_jitcache import lay_build, real_dir
from test_plugin import SCRAPE, SERIES
from trees import TreeFactory

from sglang_dsv4_fix import manifest, verdict
from sglang_dsv4_fix.cacheclean import TRASH
from sglang_dsv4_fix.plugin import Status
from sglang_dsv4_fix.tree import Tree, find_tree

pytestmark = pytest.mark.slow

VERSION = "0.5.16"
RECORD = ".c_plan.cuh.sglang-dsv4-fix.json"
BACKUP = ".c_plan.cuh.sglang-dsv4-fix.orig"
START = r"""
import hashlib, json, os, sys, types
import sglang.srt.plugins  # SGLang's import chain (torch ...) before the gate
KERNEL = sys.argv[1]
os.read(0, 1)
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.utils as utils
utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP0")
"""
PROBE = r"""
try:
    import sglang.jit_kernel.dsv4.compress
except ImportError:  # its package goes on to import transformers; the loader module has run
    pass
compress = sys.modules["sglang.jit_kernel.dsv4.compress"]
folder = os.path.dirname(KERNEL)
class Probe(Exception):
    pass
def load_jit(*args, **kwargs):
    with open(os.path.join(folder, ".c_plan.cuh.sglang-dsv4-fix.json")) as f:
        record = json.load(f)
    with open(KERNEL, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    seen = {"sha256": sha, "record": record["state"], "cuda_files": kwargs.get("cuda_files"),
            "tmp": sorted(n for n in os.listdir(folder) if n.endswith(".tmp")),
            "hooked": getattr(compress._jit_compress_plan_module, "__wrapped__", None) is not None}
    print("JIT-ENTRY " + json.dumps(seen), flush=True)
    raise Probe
compress.load_jit = load_jit
try:
    compress._jit_compress_plan_module()
except Probe:
    pass
print("SERVING", flush=True)
"""


@pytest.fixture(scope="session")
def self_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This package with its entry point, plus unidiff (heal patches: apply's dependency)."""
    site = install_self(tmp_path_factory.mktemp("self") / "site")
    pip = (str(base_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check")
    subprocess.run((*pip, "--no-deps", "--target", str(site), "unidiff==1.0.1"), check=True)
    return site


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fixed_sha() -> str:
    rel = manifest.load().release(VERSION)
    assert rel is not None
    return rel.results["no-init"].sha256


def env_for(*path: Path, **extra: str) -> dict[str, str]:
    """What plugin_env.run_python gives a child: no SGLANG_/PYTHON variables but ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return env


def start(
    code: str, kernel: Path, paths: tuple[Path, ...], env: Mapping[str, str], *wrap: str
) -> subprocess.Popen[bytes]:
    argv = (*wrap, str(base_python()), "-c", code, str(kernel))
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=paths[0],
    )


def release(procs: list[subprocess.Popen[bytes]]) -> list[tuple[int, str, str]]:
    """Open the gate for every process at once, then collect (exit, stdout, stderr)."""
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"x")
        p.stdin.flush()
    out = []
    for p in procs:
        o, e = p.communicate(timeout=600)
        out.append((p.returncode, o.decode(), e.decode()))
    return out


class Site:
    """A private copy of the real 0.5.16 release (racy), with a JIT cache beside it."""

    def __init__(self, tmp: Path, self_site: Path) -> None:
        self.site = copy_site(release_site(VERSION), tmp / "site")
        self.paths = (self_site, self.site)
        self.tree: Tree = find_tree(self.site)
        assert self.tree.kernel_path is not None
        self.kernel = self.tree.kernel_path
        self.folder = self.kernel.parent
        self.original = sha(self.kernel)
        self.cache = Path(os.environ["TVM_FFI_CACHE_DIR"])
        self.report = tmp / "report.jsonl"

    def seed_cache(self) -> tuple[Path, Path]:
        racy = lay_build(self.cache, *real_dir(self.tree, "original", self.cache))
        prewarmed = lay_build(self.cache, *real_dir(self.tree, "no-init", self.cache))
        return racy, prewarmed

    def env(self, mode: str = "heal", **extra: str) -> dict[str, str]:
        return env_for(
            *self.paths, SGLANG_DSV4_FIX_MODE=mode, SGLANG_DSV4_FIX_REPORT=str(self.report), **extra
        )

    def records(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.report.read_text().splitlines()]

    def snapshot(self) -> dict[str, str]:
        return {str(p): sha(p) for p in sorted(self.folder.rglob("*")) if p.is_file()}

    def headline(self) -> str:
        return verdict.assess(find_tree(self.site), verdict.Options(tree=str(self.site))).headline


def test_eight_ranks_heal_once_and_none_loads_before_the_file_is_final(
    self_site: Path, tmp_path: Path
) -> None:
    s = Site(tmp_path, self_site)
    racy, prewarmed = s.seed_cache()
    prom = tmp_path / "prom"  # SGLang's --enable-metrics folder
    prom.mkdir()
    env = s.env(PROMETHEUS_MULTIPROC_DIR=str(prom))
    procs = [start(START + PROBE, s.kernel, s.paths, env) for _ in range(8)]
    results = release(procs)
    assert [r[0] for r in results] == [0] * 8, [r[2] for r in results]
    assert all("SERVING" in out for _, out, _ in results)
    fixed = fixed_sha()
    # the kernel is the manifest's fix, written once, by the plugin, through apply's transaction
    assert sha(s.kernel) == fixed
    record = json.loads((s.folder / RECORD).read_text())
    assert (record["state"], record["written_by"], record["result_sha256"]) == (
        "applied",
        "plugin",
        fixed,
    )
    assert sha(s.folder / BACKUP) == s.original
    assert not racy.exists() and prewarmed.is_dir()  # the racy build went, the prewarmed one stays
    # every process entered the real loader only once the file was final
    for _, out, err in results:
        (entry,) = re.findall(r"^JIT-ENTRY (.*)$", out, re.MULTILINE)
        assert json.loads(entry) == {
            "sha256": fixed,
            "record": "applied",
            "cuda_files": ["deepseek_v4/c_plan.cuh"],
            "tmp": [],
            "hooked": True,
        }, err
    # one ERROR line says what was healed, one INFO line the new verdict; nobody else heals
    healed = [
        line
        for _, _, err in results
        for line in err.splitlines()
        if "sglang-dsv4-fix: HEALED:" in line
    ]
    assert len(healed) == 1, healed
    assert re.fullmatch(
        rf"\[[^\]]* TP0\] sglang-dsv4-fix: HEALED: {re.escape(str(s.kernel))} was racy-init "
        rf"\(sha256 {s.original[:12]}, sgl-project/sglang#32467\); wrote the no-init fix through "
        rf"apply's transaction: known base \(release 0\.5\.16\); no-init -> sha256 {fixed[:16]}…; "
        r"provenance written_by=plugin, original kept for `sglang-dsv4-fix revert`; stale planner "
        rf"builds removed from the JIT cache: {re.escape(racy.name)} pid=\d+",
        healed[0],
    ), healed[0]
    after = [line for _, _, err in results for line in err.splitlines() if "after healing:" in line]
    assert len(after) == 1 and after[0].endswith(f"sglang-dsv4-fix: after healing: {s.headline()}")
    assert s.headline().startswith("VERIFIED: no-init, the no-init fix of release 0.5.16 (")
    starts = [r for r in s.records() if r["event"] == "start"]
    assert len(starts) == 8
    assert {(r["state"], r["sha256"], r["variant"], r["mode"]) for r in starts} == {
        ("verified", fixed, "no-init", "heal")
    }
    assert (
        sorted((r["action"], r["healed"]) for r in starts)
        == [("healed", True)] + [("ok", False)] * 7
    )
    # SGLang's own /metrics app shows all eight ranks, one of them as the healer
    scraped = run_python(SCRAPE, release_site(VERSION), env={"PROMETHEUS_MULTIPROC_DIR": str(prom)})
    assert scraped.returncode == 0, scraped.stderr
    series = [dict(kv.split("=", 1) for kv in m.split(",")) for m in SERIES.findall(scraped.stdout)]
    assert (
        sorted((d["verdict"], d["action"]) for d in series)
        == [('"verified"', '"healed"')] + [('"verified"', '"ok"')] * 7
    ), scraped.stdout


def test_a_child_forked_after_a_heal_does_not_claim_it(self_site: Path, tmp_path: Path) -> None:
    """A process forked after load_plugins() healed the tree logs its own start line: the fixed
    verdict, no HEALED line, action "ok" (the parent wrote, not the child)."""
    s = Site(tmp_path, self_site)
    fork = START.replace(
        "import sglang.srt.utils as utils\n",
        "import sglang.srt.utils as utils\nchild = os.fork()\nif child:\n    os.waitpid(child, 0)\n",
    )
    assert fork != START
    code, out, err = run_once_code(s, fork + PROBE)
    assert code == 0 and out.count("SERVING") == 2, err
    assert err.count("sglang-dsv4-fix: HEALED: ") == 1, err
    starts = [r for r in s.records() if r["event"] == "start"]
    assert sorted((r["action"], r["state"]) for r in starts) == [
        ("healed", "verified"),
        ("ok", "verified"),
    ]
    assert len({r["pid"] for r in starts}) == 2


def run_once(s: Site, mode: str, *wrap: str) -> tuple[int, str, str]:
    return run_once_code(s, START + PROBE, mode, *wrap)


def run_once_code(s: Site, code: str, mode: str = "heal", *wrap: str) -> tuple[int, str, str]:
    (result,) = release([start(code, s.kernel, s.paths, s.env(mode), *wrap)])
    return result


def refuse_line(s: Site, why: str) -> str:
    return (
        f"sglang-dsv4-fix: refusing to start: {s.headline()}; not healed: {why} ({s.kernel}) "
        "(or set SGLANG_DSV4_FIX_MODE=warn to serve anyway)"
    )


def read_only(folder: Path) -> tuple[str, ...]:
    """Run the command in a private mount namespace where ``folder`` is a read-only bind mount
    (what a read-only image layer looks like to a process: EROFS, even for root)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(folder))


def test_a_read_only_tree_refuses_with_enforces_exit_code(self_site: Path, tmp_path: Path) -> None:
    s = Site(tmp_path, self_site)
    before = s.snapshot()
    code, out, err = run_once(s, "heal", *read_only(s.folder))
    enforce_code, _, _ = run_once(s, "enforce", *read_only(s.folder))
    assert code == enforce_code == 1
    assert "SERVING" not in out
    assert err.splitlines()[-1] == refuse_line(
        s, f"{s.folder} is not writable by this process (a read-only image layer or mount?)"
    )
    assert s.snapshot() == before
    assert [r["action"] for r in s.records()] == ["refused", "refused"]


def test_an_unknown_kernel_refuses_with_enforces_exit_code(self_site: Path, tmp_path: Path) -> None:
    s = Site(tmp_path, self_site)
    text = s.kernel.read_text().replace("plan_compress_prefill_kernel0", "plan_prefill_kernel_x")
    s.kernel.write_text(text)
    before = s.snapshot()
    code, _, err = run_once(s, "heal")
    assert code == 3
    assert s.headline().startswith("UNKNOWN: kernel0 not recognised (")
    assert err.splitlines()[-1] == refuse_line(
        s,
        "heal rewrites only a racy-init kernel, this one is unknown "
        f"(inspect: sglang-dsv4-fix status --tree {s.site})",
    )
    assert s.snapshot() == before


def test_heal_logs_its_line_at_error_level(self_site: Path, tmp_path: Path) -> None:
    """At SGLang's --log-level error only the HEALED line is left: it is an ERROR record."""
    s = Site(tmp_path, self_site)
    code, out, err = run_once(s, "heal")
    assert code == 0 and "SERVING" in out
    s2 = Site(tmp_path / "again", self_site)
    quiet = START.replace('log_level="info"', 'log_level="error"')
    (result,) = release([start(quiet + PROBE, s2.kernel, s2.paths, s2.env())])
    lines = [line for line in result[2].splitlines() if "sglang-dsv4-fix" in line]
    assert len(lines) == 1 and "sglang-dsv4-fix: HEALED: " in lines[0], result[2]
    assert "sglang-dsv4-fix: after healing: VERIFIED" in err


# --------------------------------------------------------------------------- SIGKILL at every step

# One interpreter imports SGLang's plugin machinery once, then per trial forks a server start
# (real load_plugins(), heal mode) that SIGKILLs itself right before its N-th file-system call
# (counted as tests/test_crash_consistency.py counts them), then forks the next, unkilled start,
# and prints what the tree looked like after each.
DRIVER = r"""
import hashlib, io, json, os, shutil, signal, sys, types
import sglang.srt.plugins
import sglang_dsv4_fix.plugin, sglang_dsv4_fix.heal  # loaded once, before any fork
spec = json.loads(sys.argv[1])
kernel, template, cache, cache_template = spec["kernel"], spec["template"], spec["cache"], spec["cache_template"]
folder = os.path.dirname(kernel)
FS = frozenset({"posix", "os", "fcntl", "_io", "io"})
COUNTED = ("/sglang_dsv4_fix/", "/pathlib.py", "/tempfile.py", "/shutil.py", "<frozen os>")
MUTATING = frozenset({"open", "write", "fchmod", "fsync", "replace", "rename", "unlink", "rmdir",
                      "mkdir", "flock"})

def is_fs(frame, fn):
    if not any(p in frame.f_code.co_filename for p in COUNTED):
        return False
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__ in FS
    return isinstance(owner, io.IOBase)

def start(kill_at):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            names = []
            def hook(frame, event, arg):
                if event == "c_call" and is_fs(frame, arg):
                    names.append(getattr(arg, "__name__", "?"))
                    if len(names) == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
            sys.setprofile(hook)
            try:
                from sglang.srt.plugins import load_plugins
                load_plugins()
                code = 0
            except SystemExit as e:
                code = e.code
            sys.setprofile(None)
            os.write(w, json.dumps(names).encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"killed": True}
    return {"killed": False, "exit": os.WEXITSTATUS(status), "calls": json.loads(out or "[]")}

def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

def facts():
    rec = os.path.join(folder, ".c_plan.cuh.sglang-dsv4-fix.json")
    bak = os.path.join(folder, ".c_plan.cuh.sglang-dsv4-fix.orig")
    names = os.listdir(cache) if os.path.isdir(cache) else []
    empty = lambda n: os.path.isdir(os.path.join(cache, n)) and not os.listdir(os.path.join(cache, n))
    record = None
    if os.path.exists(rec):
        with open(rec) as f:
            record = json.load(f)
    return {"kernel": sha(kernel), "record": record,
            "backup": sha(bak) if os.path.exists(bak) else None,
            "tmp": sorted(n for n in os.listdir(folder) if n.endswith(".tmp")),
            "cache": sorted(n for n in names if not empty(n)),
            "placeholders": sorted(n for n in names if empty(n))}

def reset():
    for dst, src in ((folder, template), (cache, cache_template)):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)

reset()
count = start(None)
calls = count.pop("calls")
count["steps"] = len(calls)
# The tree changes only at a mutating call, all of them under the lock: a kill right before each
# one from the first flock to the last write gives every state a kill can leave; the read-only
# steps (judging, reading headers, hashing) every stride-th.
first = calls.index("flock")
last = max(i for i, c in enumerate(calls) if c in MUTATING and c != "open")
points = [i + 1 for i, c in enumerate(calls)
          if (first <= i <= last and c in MUTATING) or i % spec["stride"] == 0]
count.update(first_lock=first + 1, last_write=last + 1, kills=len(points))
print(json.dumps({"count": count, "after": facts()}), flush=True)
for n in points:
    reset()
    killed = start(n)
    torn = facts()
    nxt = start(None)
    nxt.pop("calls", None)
    print(json.dumps({"n": n, "call": calls[n - 1], "killed": killed, "torn": torn, "next": nxt,
                      "after": facts()}), flush=True)
"""


def test_sigkill_at_every_step_of_a_heal_leaves_a_tree_the_next_start_heals(
    self_site: Path, tmp_path: Path
) -> None:
    s = Site(tmp_path, self_site)
    _, prewarmed = s.seed_cache()
    template, cache_template = tmp_path / "kernel-folder", tmp_path / "cache-template"
    shutil.copytree(s.folder, template)
    shutil.copytree(s.cache, cache_template)
    spec = {"kernel": str(s.kernel), "template": str(template), "cache": str(s.cache),
            "cache_template": str(cache_template), "stride": 40}  # fmt: skip
    env = env_for(*s.paths, SGLANG_DSV4_FIX_MODE="heal")
    done = subprocess.run(
        (str(base_python()), "-c", DRIVER, json.dumps(spec)),
        capture_output=True, text=True, env=env, cwd=s.paths[0], timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, *trials = [json.loads(line) for line in done.stdout.splitlines()]
    fixed, original = fixed_sha(), s.original
    count = first["count"]
    steps, locked, last = count["steps"], count["first_lock"], count["last_write"]
    assert count["exit"] == 0 and 20 < locked < last < steps, count
    healed = {"kernel": fixed, "backup": original, "tmp": [], "cache": [prewarmed.name]}
    problems: list[str] = []
    # A kill mid-removal can leave the renamed-aside racy build or the empty placeholder at its
    # old name (cacheclean.py's steps 2-4): inert, and the next removal there finishes them.
    leftovers = 0
    for t in [first, *trials]:
        after = t["after"]
        record = after.pop("record")
        placeholders = after.pop("placeholders")
        kept = [n for n in after["cache"] if not n.startswith(TRASH)]
        leftovers += kept != after["cache"] or bool(placeholders)
        after["cache"] = kept
        where = f"step {t.get('n')}/{steps} ({t.get('call')})"
        if after != healed:
            problems.append(f"{where}: after the next start {after}")
        if (record["state"], record["written_by"], record["result_sha256"]) != (
            "applied",
            "plugin",
            fixed,
        ):
            problems.append(f"{where}: record after the next start {record}")
        if "n" not in t:
            continue
        if not t["killed"]["killed"]:
            problems.append(f"{where}: not reached")
        if t["torn"]["kernel"] not in (original, fixed):
            problems.append(f"{where}: the kill left a kernel that is neither original nor fixed")
        if t["next"] != {"killed": False, "exit": 0}:
            problems.append(f"{where}: the next start {t['next']}")
    assert len(trials) == count["kills"] > 100
    print(f"{len(trials)} kills over {steps} steps (lock at {locked}, last write at {last}); "
          f"{leftovers} left a renamed-aside build or a placeholder in the cache")  # fmt: skip
    assert not problems, f"{len(problems)} problems in {len(trials)} kills: {problems[:5]}"


# --------------------------------------------------------------------------- the heal module itself


def _heal_at_start(package: Path) -> tuple[Status, Status]:
    """The status a process starts with, and what heal mode makes of it (in this process)."""
    from sglang_dsv4_fix import heal, plugin

    status = plugin.inspect_tree(package)
    return status, heal.at_start(status, plugin.inspect_tree)


def test_a_foreign_edit_in_a_git_checkout_is_not_healed(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.git(VERSION, tmp_path / "repo")
    kernel = root / "python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    kernel.write_bytes(kernel.read_bytes() + b"// a local note\n")
    before = kernel.read_bytes()
    status, after = _heal_at_start(root / "python/sglang")
    assert status.state == "racy"
    assert (after.exit_code, after.healed) == (1, None)
    assert after.problem == (
        f"RACY: racy-init kernel0 (sgl-project/sglang#32467) (run: sglang-dsv4-fix apply --tree "
        f"{root}); not healed: python/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh has "
        "uncommitted changes not made by sglang-dsv4-fix; commit or stash them, or run: "
        f"sglang-dsv4-fix apply --force --tree {root}"
    )
    assert kernel.read_bytes() == before
    assert sorted(p.name for p in kernel.parent.iterdir() if p.name.startswith(".")) == []


def test_apply_records_cli_and_old_records_read_as_cli(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    from sglang_dsv4_fix import provenance
    from sglang_dsv4_fix.main import main

    root = tree_factory.installed(VERSION, tmp_path / "site")
    assert main(["apply", "--tree", str(root)]) == 0
    kernel = root / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    record = provenance.read(kernel)
    assert record is not None and record.written_by == "cli"
    path = provenance.record_path(kernel)
    raw = json.loads(path.read_text())
    del raw["written_by"]  # a record written before the field existed
    path.write_text(json.dumps(raw))
    assert provenance.read(kernel) == record
    assert main(["verify", "--tree", str(root)]) == 0


def test_an_unsafe_kernel_is_not_healed(tree_factory: TreeFactory, tmp_path: Path) -> None:
    """A fixed kernel launched outside its preconditions: heal rewrites only a racy one."""
    from test_verdict import edit, second_launch

    from sglang_dsv4_fix.rewrite import rewrite

    root = tree_factory.installed(VERSION, tmp_path / "sp")
    edit(root, lambda t: second_launch(rewrite(t, "no-init"), "512"))
    kernel = root / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    before = kernel.read_bytes()
    status, after = _heal_at_start(root / "sglang")
    assert (status.state, status.exit_code) == ("unsafe", 3)
    assert (after.exit_code, after.healed) == (3, None)
    assert after.problem == (
        f"{status.headline}; not healed: heal rewrites only a racy-init kernel, this one is "
        f"unsafe (inspect: sglang-dsv4-fix status --tree {root})"
    )
    assert kernel.read_bytes() == before


def test_a_kernel_linked_from_elsewhere_is_not_healed_through_the_link(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    """The kernel a symlink to a file outside the tree: heal writes nothing there (apply's own
    refusal of a symlinked kernel, said on the start line) and the file outside stays."""
    root = tree_factory.installed(VERSION, tmp_path / "sp")
    kernel = root / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    outside = tmp_path / "elsewhere.cuh"
    racy = kernel.read_bytes()
    outside.write_bytes(racy)
    kernel.unlink()
    kernel.symlink_to(outside)
    status, after = _heal_at_start(root / "sglang")
    assert (status.state, status.exit_code) == ("racy", 1)
    assert (after.exit_code, after.healed) == (1, None)
    assert after.problem == (
        f"{status.headline}; not healed: {kernel}: is a symbolic link; refusing to write through it"
    )
    assert outside.read_bytes() == racy
    assert kernel.is_symlink() and kernel.resolve() == outside
