"""SIGKILL apply and revert at every file-system step they take, then check the tree and recover.

A forked child runs the real ``main([...])`` under a ``sys.setprofile`` hook that counts the
file-system calls it makes (open, read, write, flush, fchmod, fsync, replace, unlink, flock,
close ...: every C-level call on an ``os``/``posix``/``fcntl``/``_io`` function or a file object)
and SIGKILLs itself right before call number N. A first, unkilled run counts the steps; then N
goes over all of them. After each kill the kernel must be byte-identical to the original or to a
patched result, the provenance record and the backup must agree with it, and a later ``apply``
and a later ``revert`` must finish the job exactly (kernel sha256, sidecars, nothing else left).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import manifest
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main

pytestmark = pytest.mark.slow

FS_MODULES = frozenset({"posix", "os", "fcntl", "_io", "io"})
RECORD = ".c_plan.cuh.sglang-dsv4-fix.json"
BACKUP = ".c_plan.cuh.sglang-dsv4-fix.orig"


# Frames whose file-system calls count: ours and the stdlib helpers we call (not the import
# system's reads of .py files, not gitpython's pipes to `git`).
COUNTED_FILES = ("/sglang_dsv4_fix/", "/pathlib.py", "/tempfile.py", "/shutil.py", "<frozen os>")


def _is_fs_call(frame: types.FrameType, fn: object) -> bool:
    name = frame.f_code.co_filename
    if not any(part in name for part in COUNTED_FILES):
        return False
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__ in FS_MODULES
    return isinstance(owner, io.IOBase)


def run_killed(argv: list[str], kill_at: int | None) -> tuple[bool, int, int]:
    """(killed, steps taken, step of the first flock) of ``main(argv)`` in a forked child,
    SIGKILLed right before step ``kill_at``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 99
        try:
            os.close(r)
            steps, locked = 0, 0

            def hook(frame: types.FrameType, event: str, arg: object) -> None:
                nonlocal steps, locked
                if event == "c_call" and _is_fs_call(frame, arg):
                    steps += 1
                    if not locked and getattr(arg, "__name__", "") == "flock":
                        locked = steps
                    if steps == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)

            with (
                open(os.devnull, "w") as null,
                contextlib.redirect_stdout(null),
                contextlib.redirect_stderr(null),
            ):
                sys.setprofile(hook)
                code = main(argv)
                sys.setprofile(None)
            os.write(w, f"{steps} {locked}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True, kill_at or 0, 0
    assert os.WEXITSTATUS(status) == 0, f"{argv} exited {os.WEXITSTATUS(status)}"
    steps, locked = map(int, out.split())
    return False, steps, locked


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): sha(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(root).parts[:1]
    }


def quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


@dataclass
class Scenario:
    name: str
    kind: str  # "installed" or "git"
    version: str
    prepare: list[list[str]]  # commands run (unkilled) before the killed one, relative to --tree
    killed: list[str]
    read_stride: int = 10  # before the lock (reading, planning): every n-th step
    write_stride: int = 1  # from the lock on (the write path): every n-th step
    switch: bool = False  # a variant switch: the racy original must never be on disk


SCENARIOS = [
    Scenario("apply no-init 0.5.16", "installed", "0.5.16", [], ["apply"], 10, 2),
    Scenario(
        "apply barrier 0.5.12", "installed", "0.5.12", [], ["apply", "--variant", "barrier"], 10, 3
    ),
    Scenario(
        "switch no-init->barrier 0.5.17",
        "installed",
        "0.5.17",
        [["apply"]],
        ["apply", "--variant", "barrier"],
        10,
        3,
        switch=True,
    ),
    Scenario(
        "switch barrier->no-init 0.5.16",
        "installed",
        "0.5.16",
        [["apply", "--variant", "barrier"]],
        ["apply", "--variant", "no-init"],
        10,
        1,
        switch=True,
    ),
    Scenario("revert no-init 0.5.16", "installed", "0.5.16", [["apply"]], ["revert"]),
    Scenario(
        "revert barrier 0.5.13",
        "installed",
        "0.5.13",
        [["apply", "--variant", "barrier"]],
        ["revert"],
        10,
        3,
    ),
    Scenario("apply no-init git 0.5.15", "git", "0.5.15", [], ["apply"], 20, 4),
]


class Trials:
    """One scenario's tree, reset between trials by restoring the kernel's folder."""

    def __init__(self, factory: TreeFactory, scenario: Scenario, tmp: Path) -> None:
        self.s = scenario
        make = factory.installed if scenario.kind == "installed" else factory.git
        self.root = make(scenario.version, tmp / "tree")
        self.pristine_tree = snapshot(self.root)
        self.tree = str(self.root)
        rel = manifest.load().release(scenario.version)
        assert rel is not None
        prefix = "python/" if scenario.kind == "git" else ""
        self.kernel = self.root / prefix / rel.path
        self.folder = self.kernel.parent
        self.template = tmp / "kernel-folder"
        shutil.copytree(self.folder, self.template)
        self.original = self.kernel.read_bytes()
        self.results = {v: r.sha256 for v, r in rel.results.items()}

    def reset(self) -> None:
        shutil.rmtree(self.folder)
        shutil.copytree(self.template, self.folder)
        for argv in self.s.prepare:
            assert quiet([*argv, "--tree", self.tree]) == Exit.OK

    def argv(self) -> list[str]:
        return [*self.s.killed, "--tree", self.tree]

    def check_torn(self) -> list[str]:
        """What is wrong with the state a kill left (empty: consistent)."""
        kernel = sha(self.kernel.read_bytes())
        allowed = {sha(self.original), *self.results.values()}
        if kernel not in allowed:
            return [f"kernel is neither the original nor a patched result: {kernel[:16]}"]
        record_path, backup_path = self.folder / RECORD, self.folder / BACKUP
        record = json.loads(record_path.read_text()) if record_path.exists() else None
        backup = sha(backup_path.read_bytes()) if backup_path.exists() else None
        problems = []
        if backup is not None and backup != sha(self.original):
            problems.append("backup is not the original")
        if self.s.switch and kernel == sha(self.original):
            problems.append("a killed variant switch left the racy original on disk")
        if kernel == sha(self.original):
            if record is not None and record["base_sha256"] != kernel:
                problems.append("record's base is not the original")
        else:
            if record is None:
                problems.append("patched kernel without a provenance record")
            elif record["result_sha256"] != kernel and record["state"] != "pending":
                problems.append("applied record does not name the kernel's bytes")
            if backup is None:
                problems.append("patched kernel without a backup")
        return problems

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.name.endswith(".tmp"))

    def check_apply_recovers(self, variant: str) -> list[str]:
        code = quiet(["apply", "--variant", variant, "--tree", self.tree])
        problems = [] if code == Exit.OK else [f"later apply exited {code}"]
        if sha(self.kernel.read_bytes()) != self.results[variant]:
            problems.append("later apply did not reach the manifest's sha256")
        record = json.loads((self.folder / RECORD).read_text())
        if (record["state"], record["result_sha256"]) != ("applied", self.results[variant]):
            problems.append(f"record after a later apply: {record['state']}")
        if sha((self.folder / BACKUP).read_bytes()) != sha(self.original):
            problems.append("backup after a later apply is not the original")
        if quiet(["verify", "--tree", self.tree]) != Exit.OK:
            problems.append("verify fails after a later apply")
        if self.leftovers():
            problems.append(f"temp files left after a later apply: {self.leftovers()}")
        return problems

    def check_revert_recovers(self) -> list[str]:
        code = quiet(["revert", "--tree", self.tree])
        problems = [] if code == Exit.OK else [f"later revert exited {code}"]
        now = snapshot(self.root)
        if now != self.pristine_tree:
            extra = sorted(set(now) - set(self.pristine_tree))
            changed = sorted(k for k in self.pristine_tree if now.get(k) != self.pristine_tree[k])
            problems.append(
                f"tree not pristine after a later revert: extra {extra}, changed {changed}"
            )
        return problems


def test_sigkill_at_every_step_of_apply_and_revert(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    warm = tree_factory.git("0.5.16", tmp_path / "warm")  # import every lazy module before forking
    for argv in (["apply"], ["apply", "--variant", "barrier"], ["verify"], ["revert"]):
        assert quiet([*argv, "--tree", str(warm)]) == Exit.OK
    total, counts = 0, []
    failures: dict[str, list[str]] = {}
    for i, scenario in enumerate(SCENARIOS):
        t = Trials(tree_factory, scenario, tmp_path / f"s{i}")
        t.reset()
        killed, steps, locked = run_killed(t.argv(), None)
        assert not killed and 10 < locked < steps, scenario.name
        target = (
            scenario.killed[scenario.killed.index("--variant") + 1]
            if "--variant" in scenario.killed
            else "no-init"
        )
        points = [
            *range(1, locked, scenario.read_stride),
            *range(locked, steps + 1, scenario.write_stride),
        ]
        for n in points:
            t.reset()
            killed, _, _ = run_killed(t.argv(), n)
            assert killed, f"{scenario.name}: step {n} of {steps} was not reached"
            total += 1
            where = f"{scenario.name} @ step {n}/{steps}"
            problems = t.check_torn()  # temp files a kill leaves are fine; recovery must drop them
            # Recover both ways: every other trial re-runs apply first; all end with revert.
            if n % 2 == 0 and not problems:
                problems += t.check_apply_recovers(target)
            if not problems:
                problems += t.check_revert_recovers()
            for p in problems:
                failures.setdefault(p.split(":")[0], []).append(where)
        counts.append(f"{scenario.name}: {len(points)} kills over {steps} steps (lock at {locked})")
        t.reset()
        assert quiet(["revert", "--tree", t.tree]) == Exit.OK
        assert snapshot(t.root) == t.pristine_tree, (
            f"{scenario.name}: tree changed outside the kernel"
        )
    print("\n".join(counts))
    assert total >= 200
    summary = {k: f"{len(v)} trials, e.g. {v[:3]}" for k, v in failures.items()}
    assert not failures, f"{total} kills: " + json.dumps(summary, indent=1)
