"""The cache model against the releases' own naming code (run from the real wheel files)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jitref import release_names
from trees import AFFECTED, TreeFactory, fetch_wheel

from sglang_dsv4_fix import jitcache, jitnames, jitroot, jitsource
from sglang_dsv4_fix.rewrite import rewrite
from sglang_dsv4_fix.tree import Tree, find_tree

SCHEMES = {
    "0.5.12": "tvmffi-default",
    "0.5.13": "content-name",
    "0.5.14": "content-dir",
    "0.5.15": "content-dir",
    "0.5.15.post1": "content-dir",
    "0.5.16": "content-dir",
    "0.5.17": "content-dir",
}


def variant_tree(factory: TreeFactory, version: str, dest: Path, variant: str) -> Tree:
    tree = find_tree(factory.installed(version, dest))
    assert tree.kernel_path is not None
    if variant != "original":
        text = tree.kernel_path.read_text(encoding="utf-8")
        tree.kernel_path.write_text(rewrite(text, variant), encoding="utf-8")  # type: ignore[arg-type]
    return tree


def reference(
    tree: Tree, capability: tuple[int, int] = (9, 0), cache: Path | None = None
) -> dict[str, Any]:
    """What the release's own load_jit does here (release_names): nothing taken from jitcache.

    The tvm-ffi version is the release's pin as its wheel's METADATA requires it."""
    root = cache if cache is not None else Path("/nonexistent-cache")
    return release_names(tree.package_dir, capability, wheel_tvm_ffi_pin(tree.release), root)


def wheel_tvm_ffi_pin(version: str | None) -> str:
    assert version is not None
    with zipfile.ZipFile(fetch_wheel(version)) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        lines = whl.read(meta).decode().splitlines()
    pins = [
        ln.split("==", 1)[1] for ln in lines if ln.startswith("Requires-Dist: apache-tvm-ffi==")
    ]
    assert len(pins) == 1, pins
    return pins[0]


@pytest.mark.parametrize("version", AFFECTED)
@pytest.mark.parametrize("variant", ["original", "no-init", "barrier"])
def test_names_match_the_release_own_code(
    tree_factory: TreeFactory, tmp_path: Path, version: str, variant: str
) -> None:
    tree = variant_tree(tree_factory, version, tmp_path / "sp", variant)
    assert jitnames.scheme_of(tree) == SCHEMES[version]
    ref = reference(tree, cache=tmp_path)
    data = tree.kernel_path.read_bytes()  # type: ignore[union-attr]
    scheme = jitnames.scheme_of(tree)
    assert jitsource.module_name(tree, data, scheme) == ref["module"]
    pin = wheel_tvm_ffi_pin(version)
    call = jitcache.load_call(tree, data, jitcache.arch_for(tree, 9, 0), pin, tmp_path)
    # the flags, sources and include list the release's own load_jit passed to load_inline
    real = ref["call"]
    assert list(call.cuda_sources) == real["cuda_sources"]
    assert real["cpp_sources"] == [] and real["extra_ldflags"] == []
    assert list(call.extra_cflags) == real["extra_cflags"]
    assert list(call.extra_cuda_cflags) == real["extra_cuda_cflags"]
    assert list(call.extra_include_paths) == real["extra_include_paths"]
    assert call.arch.flag == ref["arch_flag"]
    if scheme == "content-dir":
        assert call.build_directory == call.build_dir == tmp_path / ref["dir"]
        assert str(call.build_dir) == real["build_directory"]
    else:
        assert call.build_directory is None and real["build_directory"] is None
        assert call.build_dir == tmp_path / ref["tvm_dir"]


def test_known_real_names(tree_factory: TreeFactory, tmp_path: Path) -> None:
    """The names FACTS.md saw on a real H200 (0.5.16) and a real 0.5.14 cache."""
    for version, expected in [
        ("0.5.14", "sgl_kernel_jit_dpsk_v4_compress_plan_2efe45ca259121f6__arch_9.0__tvmffi_0.1.9"),
        (
            "0.5.16",
            "sgl_kernel_jit_dpsk_v4_compress_plan_d2fa2dab1d672b7c__arch_9.0a__tvmffi_0.1.11",
        ),
    ]:
        tree = find_tree(tree_factory.installed(version, tmp_path / version))
        data = tree.kernel_path.read_bytes()  # type: ignore[union-attr]
        arch = jitcache.arch_for(tree, 9, 0)
        call = jitcache.load_call(tree, data, arch, jitcache.tvm_ffi_pin(version), tmp_path)
        assert call.build_dir.name == expected


@pytest.mark.parametrize("version", AFFECTED)
def test_tvm_ffi_pin_is_the_wheel_requirement(version: str) -> None:
    with zipfile.ZipFile(fetch_wheel(version)) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        lines = whl.read(meta).decode().splitlines()
    assert f"Requires-Dist: apache-tvm-ffi=={jitcache.tvm_ffi_pin(version)}" in lines


@pytest.mark.parametrize(
    ("version", "capability", "target"),
    [
        ("0.5.15", (9, 0), "9.0"),
        ("0.5.16", (9, 0), "9.0a"),
        ("0.5.17", (10, 0), "10.0a"),
        ("0.5.16", (8, 0), "8.0"),
    ],
)
def test_arch_target_matches_release_suffix_rule(
    tree_factory: TreeFactory,
    tmp_path: Path,
    version: str,
    capability: tuple[int, int],
    target: str,
) -> None:
    tree = find_tree(tree_factory.installed(version, tmp_path / "sp"))
    assert jitcache.arch_for(tree, *capability).target == target
    ref = reference(tree, capability)
    assert f"__arch_{target}__" in ref["dir"]


def test_fixed_releases_have_no_tvm_ffi_build(tree_factory: TreeFactory, tmp_path: Path) -> None:
    tree = find_tree(tree_factory.installed("0.5.18", tmp_path / "sp"))
    assert jitnames.scheme_of(tree) == "sglang-ninja"
    assert jitcache.stale_builds(tree) == []


def test_cache_root_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "c"))
    assert jitroot.cache_root() == tmp_path / "c"
    monkeypatch.delenv("TVM_FFI_CACHE_DIR")
    assert jitroot.cache_root() == Path.home() / ".cache" / "tvm-ffi"
    assert jitroot.cache_root("~/x") == Path.home() / "x"


def test_parse_capability() -> None:
    assert [jitcache.parse_capability(a) for a in ("9.0a", "9.0", "sm_90a", "90", "10.0f")] == [
        (9, 0),
        (9, 0),
        (9, 0),
        (9, 0),
        (10, 0),
    ]
    with pytest.raises(ValueError, match="not a CUDA architecture"):
        jitcache.parse_capability("hopper")


# --------------------------------------------------------------------------- inventory


@contextlib.contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@functools.cache
def tvmffi_ninja(module: str) -> str:
    """build.ninja exactly as the installed apache-tvm-ffi generates it for a load_inline of
    ``module`` (its main.cpp + cuda.cu), from tvm-ffi's own generator."""
    from tvm_ffi.cpp.extension import _generate_ninja_build

    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0")
    with scoped_env({"TVM_FFI_CUDA_ARCH_LIST": "9.0a", "CUDA_HOME": cuda}):
        return _generate_ninja_build(
            name=module,
            extra_cflags=["-std=c++20", "-O3"],
            extra_cuda_cflags=["-DSGL_CUDA_ARCH=900", "-std=c++20", "-O3"],
            extra_ldflags=[],
            extra_include_paths=[],
            sources=["main.cpp", "cuda.cu"],
            backend="cuda",
        )


def lay_build(root: Path, name: str, module: str, cuda_cu: str = "") -> Path:
    """A build dir as tvm-ffi and ninja leave it: lock, main.cpp, cuda.cu, tvm-ffi's own
    build.ninja, the objects and depfiles, ninja's log and deps, the .so."""
    d = root / name
    d.mkdir(parents=True)
    for f in ("lock", "main.cpp", "cpp_0.o", "cuda_0.o", "cpp_0.o.d", "cuda_0.o.d"):
        (d / f).write_text("")
    (d / ".ninja_log").write_text("# ninja log v6\n")
    (d / ".ninja_deps").write_bytes(b"# ninjadeps\n")
    (d / "build.ninja").write_text(tvmffi_ninja(module))
    (d / "cuda.cu").write_text(cuda_cu)
    (d / f"{module}.so").write_bytes(b"\x7fELF not really")
    return d


def real_dir(tree: Tree, variant: str, root: Path) -> tuple[str, str]:
    """(dir name, module) the release's own code gives for ``variant`` of this tree's kernel."""
    assert tree.kernel_path is not None
    sources = jitcache.tree_sources(tree)
    saved = tree.kernel_path.read_bytes()
    tree.kernel_path.write_bytes(sources[variant])
    try:
        ref = reference(tree)
    finally:
        tree.kernel_path.write_bytes(saved)
    name = ref.get("dir") or ref["tvm_dir"]
    return name, ref["module"]


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16", "0.5.17"])
def test_inventory_tells_each_build_origin(
    tree_factory: TreeFactory, tmp_path: Path, version: str
) -> None:
    tree = variant_tree(tree_factory, version, tmp_path / "sp", "original")
    root = tmp_path / "cache"
    for variant in ("original", "no-init", "barrier"):
        lay_build(root, *real_dir(tree, variant, root))
    lay_build(
        root,
        "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef__arch_9.0a__tvmffi_0.1.11",
        "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef",
    )
    lay_build(root, "sgl_kernel_jit_other_module_0123456789abcdef", "sgl_kernel_jit_other_module")
    got = {b.origin for b in jitcache.inventory(tree, root)}
    assert got == {"original", "no-init", "barrier", "other"}
    # the racy tree: fixed builds are stale (not its bytes), the original is current
    stale = {b.origin for b in jitcache.stale_builds(tree, root)}
    assert stale == {"no-init", "barrier"}
    assert jitcache.racy_builds(tree, root) == []


def test_racy_build_after_apply_is_reported(tree_factory: TreeFactory, tmp_path: Path) -> None:
    tree = variant_tree(tree_factory, "0.5.16", tmp_path / "sp", "original")
    root = tmp_path / "cache"
    racy = lay_build(root, *real_dir(tree, "original", root))
    fixed = lay_build(root, *real_dir(tree, "no-init", root))
    from sglang_dsv4_fix.main import main

    assert main(["apply", "--tree", str(tmp_path / "sp"), "--no-clear-cache"]) == 0
    assert [b.path for b in jitcache.racy_builds(tree, root)] == [racy]
    assert [b.path for b in jitcache.stale_builds(tree, root)] == [racy]
    assert fixed.exists()


def test_0512_cannot_tell_without_a_sidecar(tree_factory: TreeFactory, tmp_path: Path) -> None:
    tree = variant_tree(tree_factory, "0.5.12", tmp_path / "sp", "no-init")
    root = tmp_path / "cache"
    kernel = tree.kernel_root.resolve() / "csrc" / jitnames.CUDA_FILE
    name, module = real_dir(tree, "no-init", root)
    build = lay_build(root, name, module, f'#include "{kernel}"\n')
    other = lay_build(
        root,
        "sgl_kernel_jit_dpsk_v4_compress_plan_ffffffffffffffff",
        module,
        '#include "/elsewhere/sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"\n',
    )
    by_path = {b.path: b for b in jitcache.inventory(tree, root)}
    assert by_path[build].origin == "cannot tell"
    assert by_path[other].origin == "other"
    assert [b.path for b in jitcache.racy_builds(tree, root)] == [build]
    # a sidecar that matches the .so's bytes and the kernel's tells it
    so = build / f"{module}.so"
    data = tree.kernel_path.read_bytes()  # type: ignore[union-attr]
    jitcache.write_sidecar(build, so, {"kernel_sha256": hashlib.sha256(data).hexdigest()})
    assert {b.path: b.origin for b in jitcache.inventory(tree, root)}[build] == "no-init"
    assert jitcache.racy_builds(tree, root) == []
    so.write_bytes(b"rebuilt by ninja since")  # the note no longer speaks for the .so
    assert {b.path: b.origin for b in jitcache.inventory(tree, root)}[build] == "cannot tell"
    assert json.loads((build / jitcache.SIDECAR).read_text())["so"] == so.name


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16"])
def test_our_sidecar_proves_a_build_current_without_a_source_hash(
    tree_factory: TreeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """sglang-dsv4-fix#10: a build we compiled (prewarm, the plugin) is proven current by its
    sidecar, without hashing 30-odd headers in every server process; a note about other bytes,
    another .so, or one that is not a regular file proves nothing, and the name is checked."""
    tree = variant_tree(tree_factory, version, tmp_path / "sp", "no-init")
    data = tree.kernel_path.read_bytes()  # type: ignore[union-attr]
    sha = hashlib.sha256(data).hexdigest()
    root = tmp_path / "cache"
    name, module = real_dir(tree, "no-init", root)
    build = lay_build(root, name, module)
    hashed: list[str] = []
    real_hash = jitsource.source_hash

    def counted(*a: Any) -> str:
        hashed.append(a[2])
        return real_hash(*a)

    monkeypatch.setattr(jitsource, "source_hash", counted)

    def suspects() -> list[str]:
        return [e.name for e in jitnames.not_current(tree, data, jitnames.planner_entries(root))]

    assert suspects() == [] and len(hashed) == 1  # no note: the name's hash is computed
    jitcache.write_sidecar(build, build / f"{module}.so", {"kernel_sha256": sha})
    hashed.clear()
    assert suspects() == [] and hashed == []  # our note: nothing computed
    # a folder named by other sources that we built from these bytes (headers changed since)
    scheme, parts = jitnames.parse_name(name)  # type: ignore[misc]
    other = name.replace(parts["src"], "0123456789abcdef")
    renamed = lay_build(root, other, module.replace(parts["src"], "0123456789abcdef"))
    so = renamed / f"{jitroot.MODULE}_0123456789abcdef.so"
    jitcache.write_sidecar(renamed, so, {"kernel_sha256": sha})
    assert suspects() == [] and hashed == []
    # ... but a note about other bytes, or about another .so (a folder copied or renamed under
    # this name keeps its old note), proves nothing: the name decides, and it is not current
    jitcache.write_sidecar(renamed, so, {"kernel_sha256": "0" * 64})
    assert suspects() == [other] and hashed == [scheme]
    (renamed / jitcache.SIDECAR).write_bytes((build / jitcache.SIDECAR).read_bytes())
    assert suspects() == [other]
    # a note that is a FIFO, a link to a good note, or not JSON: no hang, nothing proven
    jitcache.write_sidecar(renamed, so, {"kernel_sha256": sha})
    good = tmp_path / "good.json"
    good.write_bytes((renamed / jitcache.SIDECAR).read_bytes())
    for hostile in ("fifo", "link", "garbage"):
        (renamed / jitcache.SIDECAR).unlink()
        if hostile == "fifo":
            os.mkfifo(renamed / jitcache.SIDECAR)
        elif hostile == "link":
            (renamed / jitcache.SIDECAR).symlink_to(good)
        else:
            (renamed / jitcache.SIDECAR).write_bytes(b"{" * 100_000)
        assert suspects() == [other], hostile
    # the build folder itself a link to a proven one: never followed
    (renamed / jitcache.SIDECAR).unlink()
    linked = root / other.replace("0123456789abcdef", "fedcba9876543210")
    linked.symlink_to(build)
    assert linked.name in suspects()


def test_include_scan_finds_what_the_loaders_regex_finds() -> None:
    """jitsource scans includes without the loaders' ``^\\s*`` anchor (for speed); on generated
    text of directive-like pieces it must find exactly what the anchored regex finds."""
    rng = random.Random(32467)
    pieces = [" ", "\t", "\n", "\u00a0", "\x0c", "#", "include", "  include", '"a.h"', '"b/c.cuh"',
              "<sgl_kernel/x.h>", "<other/y.h>", "// ", "x", '"', "<", ">", "#include", "\r\n",
              '""', "<sgl_kernel/>", "<sgl_kernel/", "sgl_kernel/", "\x1c", "\u2028", "# include"]  # fmt: skip
    patterns = [*jitsource._QUOTED.values(), jitsource._ANGLE]
    for _ in range(6000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40)))
        for pattern in patterns:
            assert jitsource._directives(pattern, text) == re.findall(
                r"^\s*" + pattern, text, re.MULTILINE
            ), (pattern, text)
    # a match runs on past a newline (``[^"]+``), and the search goes on after it, not inside
    spanning = '#include "a\n#include "b.h"\n'
    assert jitsource._directives(jitsource._QUOTED["content-dir"], spanning) == ["a\n#include "]


# The loaders' build names as regular expressions: the reference parse_name's string tests match.
NAME_FORMS = {
    "content-dir": r"(?P<src>[0-9a-f]{16})__arch_(?P<arch>[^_/]+)__tvmffi_(?P<tvmffi>[^/]+)",
    "content-name": r"(?P<src>[0-9a-f]{16})_(?P<ffi>[0-9a-f]{16})",
    "tvmffi-default": r"(?P<ffi>[0-9a-f]{16})",
}


def reference_parse(name: str) -> tuple[str, dict[str, str]] | None:
    for scheme, form in NAME_FORMS.items():
        m = re.fullmatch(re.escape(jitroot.MODULE) + "_" + form, name)
        if m:
            return scheme, m.groupdict()
    return None


def test_build_names_parse_as_the_loaders_forms_read() -> None:
    """parse_name (string operations) against the forms as regular expressions, on real names
    and on names made of near-miss pieces: wrong case, short hex, ``_``/``/`` where they cannot
    be, missing or doubled separators, trailing text."""
    real = [
        "sgl_kernel_jit_dpsk_v4_compress_plan_2efe45ca259121f6__arch_9.0__tvmffi_0.1.9",
        "sgl_kernel_jit_dpsk_v4_compress_plan_d2fa2dab1d672b7c__arch_9.0a__tvmffi_0.1.11",
        "sgl_kernel_jit_dpsk_v4_compress_plan_d2fa2dab1d672b7c_0123456789abcdef",
        "sgl_kernel_jit_dpsk_v4_compress_plan_0123456789abcdef",
    ]
    parsed = [jitnames.parse_name(n) for n in real]
    assert [p and p[0] for p in parsed] == ["content-dir", "content-dir", "content-name",
                                          "tvmffi-default"]  # fmt: skip
    assert parsed[1] == ("content-dir", {"src": "d2fa2dab1d672b7c", "arch": "9.0a",
                                         "tvmffi": "0.1.11"})  # fmt: skip
    rng = random.Random(32467)
    hexes = ["0123456789abcdef", "d2fa2dab1d672b7c", "0123456789ABCDEF", "0123456789abcde",
             "0123456789abcdef0", "0123456789abcdeg", ""]  # fmt: skip
    arches, versions = ["9.0a", "9.0", "", "9_0", "9/0", "sm 90"], ["0.1.11", "", "0/1", "0_1"]
    tails = ["", "", "", "\n", "_", "x", "__arch_"]
    prefixes = [
        jitroot.MODULE + "_",
        jitroot.MODULE,
        jitroot.MODULE + "__",
        "x" + jitroot.MODULE,
    ]
    seen = set()
    for _ in range(20000):
        h = rng.choice(hexes)
        body = rng.choice([h, f"{h}_{rng.choice(hexes)}", f"{h}{rng.choice('_x')}{rng.choice(hexes)}",
                           f"{h}__arch_{rng.choice(arches)}__tvmffi_{rng.choice(versions)}"])  # fmt: skip
        name = rng.choice(prefixes) + body + rng.choice(tails)
        expected = reference_parse(name)
        assert jitnames.parse_name(name) == expected, name
        seen.add(expected and expected[0])
    assert seen == {None, *NAME_FORMS}  # the names reached every form, and near misses
    for name in real:
        assert jitnames.parse_name(name) == reference_parse(name) is not None
