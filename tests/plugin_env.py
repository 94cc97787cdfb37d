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


def run_python(
    code: str, *path: Path, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh base interpreter with ``path`` first on sys.path.

    It runs from the first ``path`` folder: ``python -c`` puts the working directory on
    sys.path, and from the repository root that would import this checkout's source instead of
    the installed package under test (which has its patches/ data where the wheel puts it).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run(
        (str(base_python()), "-c", code),
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        cwd=path[0] if path else None,
    )
