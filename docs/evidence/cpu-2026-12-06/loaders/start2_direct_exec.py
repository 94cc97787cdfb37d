from __future__ import annotations
import marshal, os, sys
from importlib.machinery import ModuleSpec
from types import ModuleType

ORDER = ("value", "plugin", "manifest", "errors", "fsops", "tree", "state", "verdict", "provenance", "jitroot", "jitnames")

def register() -> None:
    here = os.path.dirname(__file__)
    path = os.path.join(here, "__pycache__", "start.cpython-311.bundle")
    with open(path, "rb") as f:
        data = f.read()
    from importlib.util import MAGIC_NUMBER
    prefix = b"sglang-dsv4-fix start bundle 1\n" + MAGIC_NUMBER
    entries = marshal.loads(data[len(prefix):])
    pkg = sys.modules["sglang_dsv4_fix"]
    for short in ORDER:
        name = "sglang_dsv4_fix." + short
        src, size, mtime, code = entries[name]
        st = os.stat(src)
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            raise RuntimeError("stale")
        spec = ModuleSpec(name, None, origin=src)
        spec.has_location = True
        m = ModuleType(name)
        m.__spec__, m.__file__, m.__package__ = spec, src, "sglang_dsv4_fix"
        sys.modules[name] = m
        exec(marshal.loads(code), m.__dict__)
        setattr(pkg, short, m)
    sys.modules["sglang_dsv4_fix.plugin"].register()
