"""Maintainer tool: regenerate (or check) patches/ from the real SGLang release wheels on PyPI.

    python backport/backport.py generate   # download wheels, classify, write patches/
    python backport/backport.py check      # exit 1 unless patches/ is exactly what generate gives
    python backport/backport.py discover   # list PyPI releases newer than RELEASES

Run from the repository with the package installed (``pip install -e .``). Wheels are cached in
``--wheel-cache`` (default ``$SGLANG_DSV4_FIX_WHEEL_CACHE`` or ~/.cache/sglang-dsv4-fix/wheels).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from sglang_dsv4_fix import patching
from sglang_dsv4_fix.fsops import sha256_bytes
from sglang_dsv4_fix.kernel import classify
from sglang_dsv4_fix.rewrite import rewrite
from sglang_dsv4_fix.tree import KERNEL_IN_ROOT, KERNEL_ROOTS

# Every release from the last one without the planner to the newest checked; extend, then generate.
RELEASES = (
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
TARGETS = ("no-init", "barrier")
FIX = {"pr": "sgl-project/sglang#32467", "commit": "8549cce11b878d2fbf814d5e27bcc5e626890e70"}
REPO = Path(__file__).resolve().parent.parent


def wheel_cache(arg: str | None) -> Path:
    default = Path.home() / ".cache" / "sglang-dsv4-fix" / "wheels"
    return Path(arg or os.environ.get("SGLANG_DSV4_FIX_WHEEL_CACHE", default))


def fetch(version: str, cache: Path) -> Path:
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading sglang=={version}", file=sys.stderr)
        pip = (sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:")
        subprocess.run((*pip, "-d", str(cache), f"sglang=={version}"), check=True)
        found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    return found[0]


def kernel_in_wheel(wheel: Path) -> tuple[str | None, str | None, bytes | None]:
    """(layout, path inside the package tree, bytes) of the planner kernel, or Nones."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for layout, root in KERNEL_ROOTS.items():
            path = f"sglang/{root}/{KERNEL_IN_ROOT}"
            if path in names:
                return layout, path, z.read(path)
    return None, None, None


def generate(out: Path, cache: Path) -> None:
    """Write manifest.json and the per-base patches into ``out``."""
    releases: dict[str, dict[str, object]] = {}
    groups: dict[tuple[str, str], str] = {}  # (sha, layout) -> first release with those bytes
    for version in RELEASES:
        releases[version] = describe(version, fetch(version, cache), groups, out)
    manifest = {
        "schema": 1,
        "generated_by": "backport/backport.py",
        "fix": FIX,
        "releases": releases,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def describe(
    version: str, wheel: Path, groups: dict[tuple[str, str], str], out: Path
) -> dict[str, object]:
    layout, path, data = kernel_in_wheel(wheel)
    if layout is None or path is None or data is None:
        return {"layout": None, "variant": "not-applicable"}
    text, sha = data.decode("utf-8"), sha256_bytes(data)
    verdict = classify(text)
    entry: dict[str, object] = {
        "layout": layout,
        "path": path,
        "sha256": sha,
        "variant": verdict.variant,
    }
    print(f"{version:>13}  {layout:13}  {sha[:16]}  {verdict.variant}", file=sys.stderr)
    if verdict.variant == "racy-init":
        first = groups.setdefault((sha, layout), version)
        entry["results"] = {
            t: write_patch(text, t, f"{first}-{layout}", path, out) for t in TARGETS
        }
    return entry


def write_patch(text: str, target: str, stem: str, path: str, out: Path) -> dict[str, str]:
    fixed = rewrite(text, target)  # type: ignore[arg-type]
    git_path = f"python/{path}"
    diff = patching.make(text, fixed, git_path)
    if patching.apply(text, diff, git_path) != fixed:  # read back through unidiff
        raise SystemExit(f"internal: the {target} patch for {stem} does not reproduce the rewrite")
    name = f"{target}/{stem}.diff"
    (out / target).mkdir(parents=True, exist_ok=True)
    (out / name).write_text(diff, encoding="utf-8")
    return {"sha256": sha256_bytes(fixed.encode("utf-8")), "patch": name}


def generated_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (p.suffix in (".diff", ".json"))
    }


def check(cache: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), cache)
        want, have = generated_files(Path(tmp)), generated_files(REPO / "patches")
    stale = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
    for name in stale:
        print(f"patches/{name}: differs from regeneration", file=sys.stderr)
    print("patches/ is up to date" if not stale else "run: python backport/backport.py generate")
    return 1 if stale else 0


def discover() -> int:
    out = subprocess.run(
        (sys.executable, "-m", "pip", "index", "versions", "sglang"), capture_output=True, text=True
    ).stdout
    listed = [
        v.strip()
        for line in out.splitlines()
        if "Available" in line
        for v in line.split(":")[1].split(",")
    ]
    newer = [v for v in listed if _key(v) > _key(RELEASES[-1])]
    print("\n".join(newer) if newer else f"no release newer than {RELEASES[-1]}")
    return 0


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p.replace("post", "")) for p in version.split("."))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backport", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("generate", "check", "discover"))
    parser.add_argument("--wheel-cache", help="folder of cached sglang wheels")
    args = parser.parse_args(argv)
    cache = wheel_cache(args.wheel_cache)
    if args.mode == "generate":
        generate(REPO / "patches", cache)
        return 0
    return check(cache) if args.mode == "check" else discover()


if __name__ == "__main__":
    raise SystemExit(main())
