"""A real interpreter for the plugin tests: SGLang's plugin loader, imported for real.

``import sglang.srt.plugins`` runs ``sglang/__init__.py``, which pulls numpy, torch, torchvision,
triton and a dozen small packages (found by trying, release by release). BASE holds exactly those,
pinned, in one virtual environment cached under ``~/.cache/sglang-dsv4-fix/venvs/base-<hash>``
(the hash covers the requirements and the Python). torchvision needs the matching CUDA build of
torch (PyPI's torchvision cannot import beside a CPU torch: ``torchvision::nms does not exist``),
so BASE pins torch 2.14.1 + torchvision 0.29.1, which pip takes from the local wheel store.

Each SGLang release is ``pip install --no-deps --target``-ed from its real wheel into
``.../venvs/sglang-<version>-<wheel sha256[:16]>``; this package is pip-installed (``--no-deps``,
so with its entry point) into a per-session folder. A test runs the base interpreter with
``PYTHONPATH=<this package>:<release>``: SGLang's ``importlib.metadata.entry_points()`` finds the
plugin exactly as it would in a site-packages folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from trees import fetch_wheel, wheel_cache

from sglang_dsv4_fix.jitcache import tvm_ffi_pin

BASE = (
    "torch==2.14.1",
    "torchvision==0.29.1",
    "numpy==2.4.6",
    "orjson==3.13.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "requests==2.34.2",
    "packaging==26.4",
    "pillow==13.0.0",
    "starlette==1.10.0",
    "tqdm==4.70.1",
    "ipython==9.18.1",
    "pydantic==2.14.4",
    "aiohttp==3.14.5",
    "msgspec==0.23.0",  # 0.5.23
    "pyzmq==27.3.0",  # 0.5.23
    "huggingface_hub==2.4.0",  # configure_logger, 0.5.21+
    "prometheus_client==0.26.0",  # /metrics (SGLang 0.5.16 requires >= 0.20.0)
    "httpx==0.29.0",  # Starlette's TestClient, to read /metrics through SGLang's own app
)
# What ``import sglang.srt.server_args`` needs beyond BASE (0.5.16, found by trying; every server
# process has it loaded before load_plugins() resolves anything): for the startup benchmark.
SERVER = (
    "transformers==5.12.1",
    "tokenizers==0.22.2",
    "huggingface_hub==1.33.0",
    "safetensors==0.8.0",
    "regex==2026.11.19",
    "pyyaml==6.0.4",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "hf_xet==1.8.0",
    "typer==0.29.2",
    "click==8.5.1",
    "shellingham==1.5.4",
    "rich==15.0.0",
    "markdown_it_py==4.3.0",
    "mdurl==0.1.2",
    "pygments==2.21.0",
    "dill==0.4.1",
    "openai==2.6.1",
    "jiter==0.19.0",
    "distro==1.9.0",
    "sniffio==1.3.1",
    "partial_json_parser==0.2.1.1.post7",
    "xgrammar==0.2.1",
    "sentencepiece==0.2.3",
    "sympy==1.14.0",
    "mpmath==1.3.0",
    "networkx==3.6.1",
    "jinja2==3.1.6",
    "markupsafe==3.0.4",
)
REPO = Path(__file__).resolve().parent.parent


# Resolved at import, before the tests point HOME at tmp: the one cache tests share (with wheels).
_DEFAULT_CACHE = Path.home() / ".cache" / "sglang-dsv4-fix" / "venvs"


def venv_cache() -> Path:
    return Path(os.environ.get("SGLANG_DSV4_FIX_VENV_CACHE", _DEFAULT_CACHE))


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@contextmanager
def _locked(name: str) -> Iterator[Path]:
    cache = venv_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield cache


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def base_python() -> Path:
    """The cached interpreter holding SGLang's plugin-loader import chain (built on first use)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    name = f"base-py{version}-{_key(sys.version, *BASE)}"
    with _locked(name) as cache:
        done = cache / name
        if not (done / ".complete").exists():
            _build_base(done)
    return done / "bin" / "python"


def _build_base(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    start = time.monotonic()
    _run(sys.executable, "-m", "venv", str(dest))
    python = str(dest / "bin" / "python")
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *BASE)
    (dest / ".complete").write_text(f"built in {time.monotonic() - start:.0f} s\n")


def release_site(version: str) -> Path:
    """A cached folder holding the real SGLang ``version`` and the apache-tvm-ffi it pins (its
    JIT loader's one import beyond BASE), laid out by pip (no deps)."""
    wheel = fetch_wheel(version)
    pin = tvm_ffi_pin(version)
    extra = (f"apache-tvm-ffi=={pin}",) if pin else ()
    digest = _key(hashlib.sha256(wheel.read_bytes()).hexdigest(), *extra)
    name = f"sglang-{version}-{digest}"
    with _locked(name) as cache:
        done = cache / name
        if not (done / ".complete").exists():
            shutil.rmtree(done, ignore_errors=True)
            _pip_target(done, "--find-links", str(wheel_cache()), str(wheel), *extra)
            (done / ".complete").write_text(str(wheel.name) + "\n")
    return done


def server_site() -> Path:
    """A cached folder with SERVER (no deps): with a release folder and BASE, enough to import
    ``sglang.srt.server_args`` as a server process has it."""
    name = f"server-{_key(sys.version, *SERVER)}"
    with _locked(name) as cache:
        done = cache / name
        if not (done / ".complete").exists():
            shutil.rmtree(done, ignore_errors=True)
            _pip_target(done, *SERVER)
            (done / ".complete").write_text("ok\n")
    return done


def _pip_target(dest: Path, *what: str) -> None:
    _run(str(base_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-deps", "--no-compile", "--target", str(dest), *what)  # fmt: skip


def install_self(dest: Path) -> Path:
    """This working tree, pip-installed (with its entry point) into ``dest``."""
    _run(str(base_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--target", str(dest), str(REPO))  # fmt: skip
    return dest


def copy_site(site: Path, dest: Path) -> Path:
    """A private copy of a cached release folder, for tests that patch the kernel."""
    shutil.copytree(site, dest, symlinks=True, ignore=shutil.ignore_patterns(".complete"))
    return dest


def never_built_checkout(version: str, root: Path, tag: str | None) -> Path:
    """The real release as a source checkout never built or pip-installed (``python/sglang``, no
    dist-info, no ``sglang/_version.py``), in a fresh git repository with ``tag`` on HEAD: only
    git can name its release. Its ``python/`` folder. (The files are left untracked: git is asked
    for the tag alone.)"""
    skip = shutil.ignore_patterns(".complete", "sglang-*.dist-info", "_version.py")
    shutil.copytree(release_site(version), root / "python", symlinks=True, ignore=skip)
    git = ("git", "-C", str(root), "-c", "user.name=test", "-c", "user.email=test@example.invalid")
    steps = [("init", "-q", "-b", "main"), ("commit", "-q", "--allow-empty", "-m", version)]
    for args in steps + ([("tag", tag)] if tag else []):
        subprocess.run((*git, *args), check=True, capture_output=True, timeout=60)
    return root / "python"


def run_python(
    code: str, *path: Path, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh base interpreter with ``path`` first on sys.path.

    It runs from the first ``path`` folder: ``python -c`` puts the working directory on
    sys.path, and from the repository root that would import this checkout's source instead of
    the installed package under test (which has its patches/ data where the wheel puts it).
    """
    return subprocess.run(
        (str(base_python()), "-c", code),
        capture_output=True,
        text=True,
        env=child_env(*path, env=env),
        timeout=timeout,
        cwd=path[0] if path else None,
    )


def child_env(*path: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a test's child interpreter: ours without SGLANG_* and PYTHON* (the
    test's own mode, plugins and paths), then ``env``, with ``path`` as its PYTHONPATH."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return full
