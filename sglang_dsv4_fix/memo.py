"""PROTOTYPE, for measurement only (issue 10, part 2): a memo of a tree's start status.

A process that finds an entry whose inputs are unchanged (the kernel's bytes by sha256; the other
files and folders the judgement reads by ``lstat``) takes its status from the entry and imports no
judging module. Not complete: git tags, the kernel's include files and environment variables
other than ``TVM_FFI_CACHE_DIR`` are not in the key. The entries sit in a fixed folder under /tmp.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from sglang_dsv4_fix.fsops import KERNEL_LIMIT, read_regular, sha256_bytes

DIR = "/tmp/sglang-dsv4-fix-memo-prototype"
LIMIT = 64 * 1024


def _entry(package_dir: str, cache_root: str) -> str:
    key = hashlib.sha256(f"{package_dir}\0{cache_root}".encode()).hexdigest()[:24]
    return os.path.join(DIR, f"{key}.json")


def _fingerprint(path: str) -> list[int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def lookup(package_dir: str, cache_root: str) -> dict[str, Any] | None:
    """The memo's status fields, if every input is as it was; else None."""
    try:
        entry = json.loads(
            read_regular(_entry(package_dir, cache_root), LIMIT, "memo", follow=False)
        )
        for path, fingerprint in entry["inputs"]:
            if _fingerprint(path) != fingerprint:
                return None
        fields: dict[str, Any] = entry["status"]
        kernel = fields["kernel"]
        if kernel is None:
            return fields
        same = sha256_bytes(read_regular(kernel, KERNEL_LIMIT, "kernel")) == fields["sha256"]
        return fields if same else None
    except Exception:
        return None


def store(package_dir: str, cache_root: str, fields: dict[str, Any]) -> None:
    inputs = [[p, _fingerprint(p)] for p in _inputs(package_dir, cache_root, fields)]
    os.makedirs(DIR, exist_ok=True)
    path = _entry(package_dir, cache_root)
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w") as f:
        json.dump({"inputs": inputs, "status": fields}, f)
    os.replace(temp, path)


def _inputs(package_dir: str, cache_root: str, fields: dict[str, Any]) -> list[str]:
    parent = os.path.dirname(package_dir)
    found = [package_dir, parent, os.path.join(package_dir, "_version.py"), cache_root]
    found += [
        os.path.join(parent, n, "METADATA")
        for n in os.listdir(parent)
        if n.startswith("sglang-") and n.endswith(".dist-info")
    ]
    kernel = fields["kernel"]
    if kernel is not None:
        folder, name = os.path.split(kernel)
        found += [kernel, folder, os.path.join(folder, f".{name}.sglang-dsv4-fix.json")]
        found.append(os.path.join(folder, f".{name}.sglang-dsv4-fix.orig"))
    if fields["loader_module"]:
        parts = fields["loader_module"].split(".")[1:]
        found.append(os.path.join(package_dir, *parts) + ".py")
    if os.path.isdir(cache_root):
        for name in os.listdir(cache_root):
            if name.startswith("sgl_kernel_jit_dpsk_v4_compress_plan"):
                build = os.path.join(cache_root, name)
                found.append(build)
                if os.path.isdir(build):
                    found += [os.path.join(build, n) for n in os.listdir(build)]
    return found
