"""The plugin under SGLang's real ``load_plugins()`` in enforce mode renders the verdict ``verify``
gives: the same exit code and the same headline, state by state (tests/test_verdict.py's table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugin_env import copy_site, install_self, release_site, run_python
from test_verdict import STATES, State

from sglang_dsv4_fix.main import main

pytestmark = pytest.mark.slow

START = """
import types
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.utils as utils
utils.configure_logger(types.SimpleNamespace(log_level="info"), prefix=" TP0")
print("SERVING", flush=True)
"""


@pytest.fixture(scope="module")
def self_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_self(tmp_path_factory.mktemp("self") / "site")


@pytest.mark.parametrize("state", STATES, ids=[s.name for s in STATES])
def test_enforce_agrees_with_verify(
    state: State, self_site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = copy_site(release_site("0.5.16"), tmp_path / "site")
    state.make(site)
    capsys.readouterr()
    code = main(["verify", "--tree", str(site), "--json"])
    said = json.loads(capsys.readouterr().out)
    report = tmp_path / "report.jsonl"
    done = run_python(
        START, self_site, site,
        env={"SGLANG_DSV4_FIX_MODE": "enforce", "SGLANG_DSV4_FIX_REPORT": str(report)},
    )  # fmt: skip
    assert done.returncode == code == state.exit, done.stderr
    assert ("SERVING" in done.stdout) == (code == 0)
    (record,) = [json.loads(line) for line in report.read_text().splitlines()]
    assert (record["exit"], record["headline"]) == (code, said["headline"])
    assert record["state"] == said["state"]
    if code:
        assert said["headline"] in done.stderr.splitlines()[-1]
