"""Whole-process wall time of the read-only commands against the floor, as ratios, in one run.

    python benchmarks/cli_bench.py [--release 0.5.16] [--runs 30] [--trees 10] [--python PY]

Installs the tool as operators get it (a wheel built from the checkout's tracked files, into a
fresh venv; ``--python`` to time another interpreter's install instead), builds installed-layout trees of the release from its real wheel (tests/trees.py) in a temporary
folder, fixes one copy with the tool itself, and from that folder (outside the repository: the
commands cannot pick up the checkout through the working directory) times, as fresh processes,
interleaved:

- the floor: this Python, ``import hashlib``, read and hash the tree's kernel (what any checker of
  one file's sha256 costs); ``python -c pass``; ``git apply --check`` of the release's patch;
- ``verify``, ``status`` and ``apply --check`` on the racy and on the fixed tree;
- ``verify`` given ``--trees`` trees at once, for the cost of each extra tree.

Every baseline is checked before timing: the floor must print the kernel's real sha256,
``git apply --check`` must accept the patch on the racy tree and refuse it on the fixed one, and
each command must exit with the code its verdict documents. The JIT cache and the home folder
point at empty temporary folders, so no real cache is read.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trees import make_installed_tree

REPO = Path(__file__).resolve().parent.parent

FLOOR = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"
Cmd = tuple[str, ...]


PY = sys.executable  # the interpreter under test: set by main() to the install's


def tool() -> Cmd:
    """The console script next to that Python (what operators run), else ``python -m``."""
    script = Path(PY).parent / "sglang-dsv4-fix"
    return (str(script),) if script.is_file() else (PY, "-m", "sglang_dsv4_fix")


def install(work: Path) -> str:
    """A wheel of the checkout's tracked files in a fresh venv; returns its python."""
    src, dist, venv = work / "src", work / "dist", work / "venv"
    files = subprocess.run(("git", "-C", str(REPO), "ls-files", "-z"), capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    pip = (sys.executable, "-m", "pip")
    subprocess.run((*pip, "wheel", "-q", "--no-deps", "-w", str(dist), str(src)), check=True)
    subprocess.run((sys.executable, "-m", "venv", "--without-pip", str(venv)), check=True)
    wheel = str(next(dist.glob("sglang_dsv4_fix-*.whl")))
    subprocess.run(
        (*pip, "--python", str(venv / "bin" / "python"), "install", "-q", wheel), check=True
    )
    return str(venv / "bin" / "python")


def kernel_of(site: Path) -> Path:
    return site / "sglang" / "jit_kernel" / "csrc" / "deepseek_v4" / "c_plan.cuh"


def patch_of(release: str) -> Path:
    from sglang_dsv4_fix import manifest

    return manifest.data_dir() / manifest.load().releases[release].results["no-init"].patch


def run(cmd: Cmd, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def expect(name: str, cmd: Cmd, code: int, cwd: Path, env: dict[str, str], out: str = "") -> None:
    """Refuse to time a command that does not do what its row claims."""
    r = run(cmd, cwd, env)
    if r.returncode != code or out not in r.stdout:
        raise SystemExit(
            f"baseline check failed: {name}: exit {r.returncode} (want {code}), "
            f"stdout {r.stdout.strip()[:200]!r} (want {out!r}); stderr {r.stderr.strip()[:200]!r}"
        )


def rows(
    work: Path, racy: Path, fixed: Path, many: list[Path], release: str
) -> list[tuple[str, Cmd, int, str]]:
    t = tool()
    kernel = kernel_of(racy)
    sha = hashlib.sha256(kernel.read_bytes()).hexdigest()
    patch = str(patch_of(release))
    # git apply paths: the patch names python/sglang/...; the installed tree holds sglang/...
    git = ("git", "apply", "--check", "-p2")
    out: list[tuple[str, Cmd, int, str]] = [
        (
            "floor: python + hashlib + read/hash kernel",
            (sys.executable, "-c", FLOOR, str(kernel)),
            0,
            sha,
        ),
        ("python -c pass", (sys.executable, "-c", "pass"), 0, ""),
        ("git apply --check (racy tree)", (*git, f"--directory={racy.name}", patch), 0, ""),
    ]
    for label, tree, vcode in (("racy", racy, 1), ("fixed", fixed, 0)):
        where = ("--tree", str(tree))
        out += [
            (f"verify ({label})", (*t, "verify", *where), vcode, ""),
            (f"status ({label})", (*t, "status", *where), 0, "verdict:"),
            (f"apply --check ({label})", (*t, "apply", "--check", *where), 0, ""),
        ]
    if len(many) > 1:
        trees = [w for tree in many for w in ("--tree", str(tree))]
        out.append((f"verify x{len(many)} trees", (*t, "verify", *trees), 1, ""))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", default="0.5.16")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--trees", type=int, default=10, help="trees in the many-trees row (< 2: no such row)"
    )
    parser.add_argument(
        "--python", help="time this interpreter's install (default: a fresh wheel venv)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if REPO in work.resolve().parents:
            raise SystemExit("run with TMPDIR outside the repository")
        env = {**os.environ, "HOME": str(work / "home"), "TVM_FFI_CACHE_DIR": str(work / "cache")}
        env.pop("PYTHONPATH", None)
        (work / "home").mkdir()
        (work / "cache").mkdir()
        global PY
        PY = args.python or install(work)
        where = run(
            (PY, "-c", "import sglang_dsv4_fix; print(sglang_dsv4_fix.__file__)"), work, env
        )
        if REPO in Path(where.stdout.strip()).resolve().parents and not args.python:
            raise SystemExit(f"the tool under test is the checkout, not the wheel: {where.stdout}")
        racy = make_installed_tree(args.release, work / "racy")
        fixed = work / "fixed"
        shutil.copytree(racy, fixed)
        expect("apply", (*tool(), "apply", "--tree", str(fixed)), 0, work, env, "wrote")
        expect("git apply --check refuses the fixed tree",
               ("git", "apply", "--check", "-p2", "--directory=fixed", str(patch_of(args.release))),
               1, work, env)  # fmt: skip
        many = [racy if i % 2 == 0 else fixed for i in range(args.trees)]
        table = rows(work, racy, fixed, many, args.release)
        label = " ".join(tool())
        for name, cmd, code, out in table:
            expect(name, cmd, code, work, env, out)  # also warms the page cache
        samples: dict[str, list[float]] = {name: [] for name, *_ in table}
        for _ in range(args.runs):
            for name, cmd, _code, _out in table:
                start = time.perf_counter()
                subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)  # fmt: skip
                samples[name].append((time.perf_counter() - start) * 1000)
    report(args, samples, label)
    return 0


def report(args: argparse.Namespace, samples: dict[str, list[float]], label: str) -> None:
    med = {name: statistics.median(v) for name, v in samples.items()}
    floor = next(iter(med.values()))
    print(f"release {args.release}, installed-layout trees, {args.runs} runs each, interleaved; "
          f"tool: {label}")  # fmt: skip
    print(f"{'command':<44} {'median ms':>10} {'p90 ms':>8} {'x floor':>8}")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:<44} {med[name]:10.1f} {p90:8.1f} {med[name] / floor:8.2f}")
    if args.trees < 2:
        return
    one = statistics.mean([med["verify (racy)"], med["verify (fixed)"]])
    many = med[f"verify x{args.trees} trees"]
    print(f"cost per extra tree: {(many - one) / (args.trees - 1):.1f} ms "
          f"((verify x{args.trees} - mean of one racy and one fixed) / {args.trees - 1})")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
