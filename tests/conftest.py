from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from trees import TreeFactory, wheel_cache


@pytest.fixture(scope="session")
def tree_factory(tmp_path_factory: pytest.TempPathFactory) -> TreeFactory:
    return TreeFactory(tmp_path_factory.mktemp("templates"))


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No test touches the real home or cache: every default points into tmp."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SGLANG_DSV4_FIX_WHEEL_CACHE", str(wheel_cache()))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(home / ".cache" / "tvm-ffi"))
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(home / ".cache" / "sglang" / "jit"))
    for name in (
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
    ):
        monkeypatch.setenv(name, "test" if "NAME" in name else "test@example.invalid")
    monkeypatch.delenv("SGLANG_DSV4_FIX_MODE", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    yield home
