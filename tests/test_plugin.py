"""The plugin under SGLang's real ``load_plugins()``, in fresh interpreters, on real releases.

Each case is a new process (load_plugins() runs once per process): the release's own
``sglang.srt.plugins.load_plugins()`` finds our entry point, runs ``register()``, applies the hooks;
then SGLang's own ``configure_logger`` (reached through ``sglang.srt.utils``, the re-export the
engine imports, so the registry's rebinding is exercised too) configures logging as the engine and
every scheduler do, and the start line appears. ``configure_logger`` reads only
``server_args.log_level``, so a namespace carries it instead of a full ServerArgs (whose module
imports transformers and the model zoo).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_env import copy_site, install_self, release_site, run_python, server_site

from sglang_dsv4_fix import jitcache, jitsource
from sglang_dsv4_fix.fsops import sha256_bytes
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.tree import find_tree

pytestmark = pytest.mark.slow

SERVE = """
import os, types
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.utils as utils
level = os.environ.get("TEST_LOG_LEVEL", "info")
utils.configure_logger(types.SimpleNamespace(log_level=level), prefix=" TP3")
print("SERVING", flush=True)
"""
LINE = re.compile(r"^\[[^\]]* TP3\] sglang-dsv4-fix: c_plan\.cuh .*$", re.MULTILINE)


@pytest.fixture(scope="session")
def self_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_self(tmp_path_factory.mktemp("self") / "site")


def serve(
    site: Path, self_site: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = run_python(SERVE, self_site, site, env=env)
    return done, LINE.findall(done.stderr)


def patched(version: str, tmp_path: Path, variant: str = "no-init") -> Path:
    site = copy_site(release_site(version), tmp_path / "site")
    assert main(["apply", "--tree", str(site), "--variant", variant]) == 0
    return site


@pytest.mark.parametrize(
    ("version", "layout"),
    [("0.5.12", "pre-refactor"), ("0.5.16", "pre-refactor"), ("0.5.17", "post-refactor")],
)
def test_unpatched_release_warns_and_serves(
    version: str, layout: str, self_site: Path, tmp_path: Path
) -> None:
    site = release_site(version)
    report = tmp_path / "fleet.jsonl"
    done, lines = serve(site, self_site, SGLANG_DSV4_FIX_REPORT=str(report))
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert "variant=racy-init sha256=" in line
    assert f"release={version} layout={layout} patched-by=none process=main rank=tp3 " in line
    assert "pid=" in line and "preconditions=ok mode=warn" in line
    assert line.endswith(
        "-- RACY: racy-init kernel0 (sgl-project/sglang#32467) "
        f"(run: sglang-dsv4-fix apply --tree {site}); serving continues"
    )
    (record,) = [json.loads(r) for r in report.read_text().splitlines()]
    assert record["event"] == "start" and record["action"] == "warned"
    assert record["variant"] == "racy-init" and record["release"] == version
    assert record["fix"] == f"sglang-dsv4-fix apply --tree {site}"
    assert record["state"] == "racy" and record["rank"] == "tp3" and record["process"] == "main"


def test_racy_line_is_an_error_seen_under_log_level_error(self_site: Path) -> None:
    """The offline Engine's default log level is "error": the racy line must still show."""
    done, lines = serve(release_site("0.5.16"), self_site, TEST_LOG_LEVEL="error")
    assert done.returncode == 0, done.stderr
    (line,) = lines
    assert "variant=racy-init" in line and line.endswith("; serving continues")


def test_healthy_line_is_info_hidden_under_log_level_error(self_site: Path) -> None:
    done, lines = serve(release_site("0.5.21"), self_site, TEST_LOG_LEVEL="error")
    assert done.returncode == 0, done.stderr
    assert lines == [] and "sglang-dsv4-fix" not in done.stderr


def test_a_process_that_never_configures_logging_still_says_it_once(self_site: Path) -> None:
    """A bare load_plugins(): the racy line comes at exit, on stderr through Python's last-resort
    handler (logging is unconfigured), exactly once."""
    code = "from sglang.srt.plugins import load_plugins\nload_plugins()\nprint('DONE')\n"
    site = release_site("0.5.16")
    done = run_python(code, self_site, site)
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr
    said = [x for x in done.stderr.splitlines() if x.startswith("sglang-dsv4-fix: c_plan.cuh ")]
    assert len(said) == 1, done.stderr
    assert said[0].startswith("sglang-dsv4-fix: c_plan.cuh variant=racy-init ")
    assert said[0].endswith(f"(run: sglang-dsv4-fix apply --tree {site}); serving continues")


def test_no_module_walk_at_start(self_site: Path) -> None:
    """At start the plugin replaces one attribute, ``logging.basicConfig``: SGLang's HookRegistry
    patches nothing (its module walk cost ~57 ms per target) and ``configure_logger`` is SGLang's
    own function wherever it was imported (re-pointing those imports is a walk too)."""
    code = SERVE + (
        "import logging\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "import sglang.srt.utils.common as common\n"
        "print('PATCHED', sorted(HookRegistry._patched))\n"
        "print('OURS', utils.configure_logger is common.configure_logger, "
        "hasattr(common.configure_logger, '__wrapped__'), "
        "getattr(logging.basicConfig, '__sglang_dsv4_fix__', False))\n"
    )
    done = run_python(code, self_site, release_site("0.5.16"))
    assert "PATCHED []" in done.stdout and "OURS True False True" in done.stdout, done.stderr


# What a server process imports of this package at start (docs/plugin.md, "Cost": each module is
# 0.1-0.4 ms there). Not the patches package (its data is read beside the module), nor the kernel
# parser, the cache inventory or anything that writes; the build names (jitnames) only for a cache
# that holds a planner entry, and the loaders' source hash (jitsource) only for a build no
# sidecar of ours speaks for.
# what a process that judges its tree imports (the start memo off; memo.py imports jitroot for
# the environment that names the cache): tests/test_memo.py has what the memo's taker imports
START_PATH = {"", ".errors", ".fsops", ".jitroot", ".manifest", ".memo", ".plugin", ".state",
              ".tree", ".value", ".verdict"}  # fmt: skip
FIXED = {".provenance"}  # our record beside the kernel
EXTRA = {
    "racy": set(),  # no record to read; no cache check (no fix a build could be stale against)
    "fixed, empty cache": FIXED,
    "fixed, build cached": FIXED | {".jitnames", ".jitsource"},
    "fixed, build prewarmed": FIXED | {".jitnames"},
}


@pytest.mark.parametrize("tree", list(EXTRA))
def test_the_start_path_imports_only_what_the_verdict_needs(
    tree: str, self_site: Path, tmp_path: Path
) -> None:
    site = release_site("0.5.16") if tree == "racy" else patched("0.5.16", tmp_path)
    cache = tmp_path / "cache"
    if "build" in tree:  # a build named by the fixed kernel's sources, as its first start leaves
        tree_ = find_tree(site / "sglang")
        data = tree_.kernel_path.read_bytes()  # type: ignore[union-attr]
        name = jitsource.module_name(tree_, data, "content-dir")
        build = cache / f"{name}__arch_9.0a__tvmffi_0.1.11"
        build.mkdir(parents=True)
        if tree == "fixed, build prewarmed":  # with the note prewarm or the plugin leaves
            (build / f"{name}.so").write_bytes(b"\x7fELF")
            jitcache.write_sidecar(
                build, build / f"{name}.so", {"kernel_sha256": sha256_bytes(data)}
            )
    code = SERVE + (
        "import sys\n"
        "from sglang_dsv4_fix import manifest\n"
        "print('OURS', sorted(m for m in sys.modules if m.startswith('sglang_dsv4_fix')))\n"
        "print('DATA', manifest.data_dir())\n"
    )
    env = {"TVM_FFI_CACHE_DIR": str(cache), "SGLANG_DSV4_FIX_MEMO": "off"}
    done = run_python(code, self_site, site, env=env)
    assert done.returncode == 0, done.stderr
    ours = re.search(r"^OURS (.*)$", done.stdout, re.MULTILINE)
    assert ours is not None, done.stdout
    expected = START_PATH | EXTRA[tree]
    assert set(ast.literal_eval(ours.group(1))) == {f"sglang_dsv4_fix{m}" for m in expected}
    assert f"DATA {self_site / 'sglang_dsv4_fix' / 'patches'}\n" in done.stdout
    (line,) = LINE.findall(done.stderr)  # the cached build was judged current
    assert ("variant=racy-init" if tree == "racy" else "variant=no-init") in line
    assert "STALE" not in line, line


@pytest.mark.parametrize("version", ["0.5.16", "0.5.17"])
def test_patched_release_reports_no_init_and_provenance(
    version: str, self_site: Path, tmp_path: Path
) -> None:
    site = patched(version, tmp_path)
    done, lines = serve(site, self_site)
    assert done.returncode == 0, done.stderr
    (line,) = lines
    assert "variant=no-init" in line
    assert "patched-by=sglang-dsv4-fix/0.1.0 " in line
    assert "preconditions=ok mode=warn" in line
    assert "WARNING" not in line


def test_fixed_release_is_quiet_and_ok(self_site: Path, tmp_path: Path) -> None:
    done, lines = serve(release_site("0.5.21"), self_site)
    assert done.returncode == 0, done.stderr
    (line,) = lines
    assert "variant=no-init" in line and "release=0.5.21 layout=post-refactor" in line
    assert "patched-by=none" in line and "WARNING" not in line


def test_enforce_stops_an_unpatched_tree_with_one_line(self_site: Path, tmp_path: Path) -> None:
    site = release_site("0.5.16")
    report = tmp_path / "r.jsonl"
    done, _ = serve(
        site, self_site, SGLANG_DSV4_FIX_MODE="enforce", SGLANG_DSV4_FIX_REPORT=str(report)
    )
    assert done.returncode == 1
    assert "SERVING" not in done.stdout
    kernel = site / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    assert done.stderr.splitlines()[-1] == (
        "sglang-dsv4-fix: refusing to start: RACY: racy-init kernel0 (sgl-project/sglang#32467) "
        f"(run: sglang-dsv4-fix apply --tree {site}) ({kernel}) "
        "(or set SGLANG_DSV4_FIX_MODE=warn to serve anyway)"
    )
    (record,) = [json.loads(r) for r in report.read_text().splitlines()]
    assert record["action"] == "refused" and record["mode"] == "enforce"


def test_enforce_lets_a_patched_tree_serve(self_site: Path, tmp_path: Path) -> None:
    done, lines = serve(patched("0.5.16", tmp_path), self_site, SGLANG_DSV4_FIX_MODE="enforce")
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    assert "mode=enforce" in lines[0]


def test_sglang_plugins_without_us_keeps_it_silent(self_site: Path) -> None:
    done, lines = serve(
        release_site("0.5.16"),
        self_site,
        SGLANG_PLUGINS="someone_else",
        SGLANG_DSV4_FIX_MODE="enforce",
    )
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    assert "sglang-dsv4-fix" not in done.stderr and lines == []


def test_sglang_plugins_naming_us_loads_it(self_site: Path) -> None:
    done, lines = serve(release_site("0.5.16"), self_site, SGLANG_PLUGINS="x,sglang_dsv4_fix")
    assert done.returncode == 0, done.stderr
    assert len(lines) == 1


def test_mode_off_is_silent(self_site: Path) -> None:
    done, _lines = serve(release_site("0.5.16"), self_site, SGLANG_DSV4_FIX_MODE="off")
    assert done.returncode == 0 and "SERVING" in done.stdout
    assert "sglang-dsv4-fix" not in done.stderr


def test_a_damaged_record_is_reported_not_trusted(self_site: Path, tmp_path: Path) -> None:
    """The record is damaged, the kernel's bytes are still the manifest's fix: serve, and say so."""
    site = patched("0.5.16", tmp_path)
    record = site / "sglang/jit_kernel/csrc/deepseek_v4/.c_plan.cuh.sglang-dsv4-fix.json"
    record.write_text("{not json")
    done, lines = serve(site, self_site, SGLANG_DSV4_FIX_MODE="enforce")
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    (line,) = lines
    assert "variant=no-init" in line and "patched-by=damaged-record " in line


def test_a_plugin_failure_does_not_propagate(self_site: Path, tmp_path: Path) -> None:
    site = patched("0.5.16", tmp_path)
    kernel = site / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    kernel.unlink()
    kernel.mkdir()
    done, lines = serve(site, self_site)
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    assert lines == []
    assert (
        f"sglang-dsv4-fix: could not inspect the SGLang tree ({kernel}: cannot read the kernel "
        "(Is a directory)); serving continues" in done.stderr
    )


def test_a_report_failure_does_not_propagate(self_site: Path, tmp_path: Path) -> None:
    report = tmp_path / "a-folder"
    report.mkdir()
    done, lines = serve(release_site("0.5.21"), self_site, SGLANG_DSV4_FIX_REPORT=str(report))
    assert done.returncode == 0 and "SERVING" in done.stdout
    assert (
        f"sglang-dsv4-fix: report failed (IsADirectoryError: [Errno 21] Is a directory: "
        f"'{report}'); serving continues"
    ) in done.stderr
    assert len(lines) == 1


def test_enforce_refuses_when_it_cannot_inspect(self_site: Path, tmp_path: Path) -> None:
    site = patched("0.5.16", tmp_path)
    kernel = site / "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"
    kernel.unlink()
    kernel.mkdir()
    done, _ = serve(site, self_site, SGLANG_DSV4_FIX_MODE="enforce")
    assert done.returncode == 3
    assert done.stderr.splitlines()[-1].startswith(
        "sglang-dsv4-fix: refusing to start: cannot inspect the SGLang tree ("
    )


def test_the_jit_hook_sits_on_sglangs_internal_callers(self_site: Path, tmp_path: Path) -> None:
    """The registry hooks ``_jit_compress_plan_module`` the moment the loader module is imported,
    and SGLang's own caller (``CompressorDecodePlan.generate``) goes through it: with no
    compiler reachable the load fails, and the traceback shows our AROUND frame right under
    SGLang's caller (the full report needs a GPU: gpu/plugin_check.sh).

    Here ``sglang/jit_kernel/dsv4/__init__.py`` goes on to import ``gemm.py``, whose chain
    needs transformers (not in this environment); Python keeps the already executed
    ``compress`` module in sys.modules, and that real module is what is called."""
    code = SERVE + (
        "import sys, traceback\n"
        "try:\n"
        "    import sglang.jit_kernel.dsv4.compress\n"
        "except ImportError as e:\n"
        "    print('PACKAGE', e)\n"
        "compress = sys.modules['sglang.jit_kernel.dsv4.compress']\n"
        "print('WRAPPED', compress._jit_compress_plan_module.__wrapped__ is not None)\n"
        "try:\n"
        "    compress.CompressorDecodePlan.generate(4, None, None, None, None, 256, 128)\n"
        "except BaseException:\n"
        "    traceback.print_exc()\n"
    )
    env = {"PATH": "/nonexistent", "CUDA_HOME": "/nonexistent"}
    done = run_python(code, self_site, release_site("0.5.16"), env=env)
    assert "WRAPPED True" in done.stdout, done.stderr
    frames = re.findall(r'File "[^"]*/([^/"]+)", line \d+, in (\w+)', done.stderr)
    names = [f"{file}:{fn}" for file, fn in frames]
    assert "compress.py:generate" in names, done.stderr
    i = names.index("compress.py:generate")
    assert names[i + 1 : i + 3] == ["hook_registry.py:wrapper", "jitload.py:around_jit_module"]


def test_a_fifo_report_does_not_hang_the_plugin(self_site: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    done = run_python(SERVE, self_site, release_site("0.5.21"), env={"SGLANG_DSV4_FIX_REPORT": str(fifo)},
                      timeout=120)  # fmt: skip
    assert done.returncode == 0 and "SERVING" in done.stdout, done.stderr
    assert (
        f"sglang-dsv4-fix: report failed (OSError: [Errno 6] No such device or address: "
        f"'{fifo}'); serving continues"
    ) in done.stderr


def test_a_fifo_with_a_reader_is_refused_not_written(tmp_path: Path) -> None:
    from sglang_dsv4_fix import events

    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.environ[events.REPORT_ENV] = str(fifo)
        with pytest.raises(OSError) as e:
            events.write_report({"event": "start"})
        assert (
            str(e.value) == f"{fifo} is not a regular file (a FIFO or a device?); nothing written"
        )
        assert os.read(reader, 100) == b""
    finally:
        os.environ.pop(events.REPORT_ENV, None)
        os.close(reader)


def test_a_short_write_leaves_whole_records_only(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the kernel write only part of the record: it is cut back off."""
    report = tmp_path / "r.jsonl"
    report.write_text('{"event": "start"}\n')
    code = (
        "import os, resource\n"
        "from sglang_dsv4_fix.events import write_report\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
        "try:\n"
        "    write_report({'pad': 'x' * 3000})\n"
        "except OSError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {**os.environ, "SGLANG_DSV4_FIX_REPORT": str(report)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == (
        f"ERR short write to {report} (81 of 3012 bytes); record dropped"
    ), done.stderr
    assert report.read_text() == '{"event": "start"}\n'


def test_report_lines_from_many_processes_never_interleave(tmp_path: Path) -> None:
    from sglang_dsv4_fix import events

    report = tmp_path / "r.jsonl"
    big = "x" * 3000
    code = (
        "import os, sys\n"
        "from sglang_dsv4_fix.events import write_report\n"
        "for i in range(200):\n"
        f"    write_report({{'pid': os.getpid(), 'i': i, 'pad': {big!r}}})\n"
    )
    env = {**os.environ, events.REPORT_ENV: str(report)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(6)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    records = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(records) == 1200
    assert all(r["pad"] == big for r in records)


def test_a_forked_child_reports_itself(self_site: Path, tmp_path: Path) -> None:
    """Forked after load_plugins() (SGLang's loader is then a no-op in the child, the hooks are
    inherited): the child still logs its own start line and writes its own record."""
    code = SERVE.replace(
        "import sglang.srt.utils as utils\n",
        "import os\nimport sglang.srt.utils as utils\nchild = os.fork()\n"
        "if child:\n    os.waitpid(child, 0)\n",
    )
    report = tmp_path / "r.jsonl"
    done = run_python(
        code, self_site, release_site("0.5.21"), env={"SGLANG_DSV4_FIX_REPORT": str(report)}
    )
    assert done.returncode == 0, done.stderr
    pids = re.findall(r"sglang-dsv4-fix: c_plan\.cuh .* pid=(\d+) ", done.stderr)
    assert len(pids) == 2 and pids[0] != pids[1], done.stderr
    records = [json.loads(r) for r in report.read_text().splitlines()]
    assert sorted(str(r["pid"]) for r in records) == sorted(pids)


METRICS = (
    SERVE
    + """
import sys
print("PROM", "prometheus_client" in sys.modules, flush=True)
"""
)
SCRAPE = """
import sys
from starlette.applications import Starlette
from starlette.testclient import TestClient
from sglang.srt.utils.common import add_prometheus_middleware
app = Starlette()
add_prometheus_middleware(app)
print(TestClient(app).get("/metrics").text)
"""
SERIES = re.compile(r"^sglang_dsv4_fix_planner_kernel\{([^}]*)\} 1\.0$", re.MULTILINE)


def test_metrics_every_process_shows_on_sglangs_own_metrics_endpoint(
    self_site: Path, tmp_path: Path
) -> None:
    """Two processes (a racy main, a fixed TP3 rank) write into one multiprocess folder; SGLang's
    own add_prometheus_middleware app serves both series on /metrics."""
    prom = tmp_path / "prom"
    prom.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(prom)}
    racy = run_python(METRICS.replace('prefix=" TP3"', 'prefix=""'), self_site,
                      release_site("0.5.16"), env=env)  # fmt: skip
    fixed = run_python(METRICS, self_site, release_site("0.5.21"), env=env)
    assert racy.returncode == 0 and fixed.returncode == 0, racy.stderr + fixed.stderr
    scraped = run_python(SCRAPE, release_site("0.5.16"), env=env)
    assert scraped.returncode == 0, scraped.stderr
    labels = [dict(kv.split("=", 1) for kv in m.split(",")) for m in SERIES.findall(scraped.stdout)]
    got = sorted(
        (d["verdict"], d["variant"], d["release"], d["rank"], d["process"]) for d in labels
    )
    assert got == [
        ('"racy"', '"racy-init"', '"0.5.16"', '""', '"main"'),
        ('"verified"', '"no-init"', '"0.5.21"', '"tp3"', '"main"'),
    ], scraped.stdout
    assert {d["pid"] for d in labels} != {'""'} and len({d["pid"] for d in labels}) == 2
    assert "PROM True" in racy.stdout


def test_metrics_without_the_variable_import_and_write_nothing(
    self_site: Path, tmp_path: Path
) -> None:
    done = run_python(METRICS, self_site, release_site("0.5.16"))
    assert done.returncode == 0 and "PROM False" in done.stdout, done.stderr
    missing = tmp_path / "not-there"
    done = run_python(METRICS, self_site, release_site("0.5.16"),
                      env={"PROMETHEUS_MULTIPROC_DIR": str(missing)})  # fmt: skip
    assert done.returncode == 0 and "SERVING" in done.stdout, done.stderr
    assert not missing.exists() and "PROM False" in done.stdout


def test_the_benchmarks_none_arm_really_runs_without_the_plugin(
    self_site: Path, tmp_path: Path
) -> None:
    """benchmarks/plugin_startup.py's probe: the "none" arm passes without the plugin and fails
    (AssertionError) when the plugin is reachable, as it was from the checkout's *.egg-info."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from plugin_startup import empty_plugin, measure

    site, server = release_site("0.5.16"), server_site()
    empty = empty_plugin(tmp_path / "empty")
    none = measure("none", tmp_path, site, server)  # (wall, CPU, plugins' own, logger) ms, modules
    assert min(none[:2]) > 0 and none[2] == 0 and none[3] > 0 and none[4] == 0, none
    empty_arm = measure("empty", tmp_path, empty, site, server)
    assert min(empty_arm[:4]) > 0 and empty_arm[4] == 0, empty_arm
    cache = tmp_path / "cache"
    first = measure("first", cache, self_site, site, server)  # an empty start memo: judged
    assert min(first[:4]) > 0 and first[4] > 7, first
    ours = [measure("plugin", cache, self_site, site, server) for _ in range(2)]
    assert min(ours[0][:4]) > 0 and ours[0][4] > 7, ours  # judged, and the memo kept
    assert ours[1][4] == 7, ours  # the memo taken: tests/test_memo.py's seven modules
    with pytest.raises(AssertionError):
        measure("none", tmp_path, self_site, site, server)
    with pytest.raises(AssertionError):  # the empty plugin's arm without the empty plugin
        measure("empty", tmp_path, site, server)
    with pytest.raises(AssertionError):  # ... or with ours beside it
        measure("empty", tmp_path, self_site, empty, site, server)
    with pytest.raises(AssertionError):  # --baseline's arm must load the plugin, as "plugin" does
        measure("baseline", tmp_path, site, server)


def test_the_import_benchmark_counts_only_its_arms_install(self_site: Path, tmp_path: Path) -> None:
    """benchmarks/start_imports.py's probe sums our modules' -X importtime self-times, and fails
    when the package it imported is not the install its arm names (first on the path)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from start_imports import probe

    site, server = release_site("0.5.16"), server_site()
    total, names = probe(self_site, site, server, cache=tmp_path)
    assert total > 0 and "sglang_dsv4_fix.verdict" in names, names
    (tmp_path / "other").mkdir()
    with pytest.raises(AssertionError):  # ours came from self_site, not the arm's own folder
        probe(tmp_path / "other", self_site, site, server, cache=tmp_path)


def test_the_fix_hint_is_shell_quoted(tmp_path: Path) -> None:
    import shlex

    from sglang_dsv4_fix import plugin

    site = copy_site(release_site("0.5.16"), tmp_path / "my site; rm -rf x")
    status = plugin.inspect_tree(site / "sglang")
    assert status.fix == f"sglang-dsv4-fix apply --tree {shlex.quote(str(site))}"
    assert shlex.split(status.fix or "")[-1] == str(site)


def test_the_anatomy_benchmark_loads_exactly_the_start_modules(
    self_site: Path, tmp_path: Path
) -> None:
    """benchmarks/start_anatomy.py learns the start modules from the real import, loads exactly
    those step by step, and fails when register() imports one it left out or when ours did not
    come from the install under test (first on the path)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from start_anatomy import probe, start_modules

    site = release_site("0.5.16")
    names = start_modules(self_site, site, cache=tmp_path)
    assert set(names) == {f"sglang_dsv4_fix{m}" for m in START_PATH}, names
    assert names.index("sglang_dsv4_fix.value") < names.index("sglang_dsv4_fix.plugin")
    rows, work, _ = probe(self_site, site, cache=tmp_path, names=names)
    assert [r[0] for r in rows] == names and all(r[1] > 0 for r in rows) and work > 0, rows
    with pytest.raises(AssertionError):  # register() imports the verdict the probe left out
        probe(
            self_site, site, cache=tmp_path, names=[n for n in names if not n.endswith("verdict")]
        )
    (tmp_path / "other").mkdir()
    with pytest.raises(AssertionError):  # ours came from self_site, not the arm's own folder
        probe(tmp_path / "other", self_site, site, cache=tmp_path, names=names)
