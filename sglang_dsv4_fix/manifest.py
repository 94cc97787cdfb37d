"""The release manifest (patches/manifest.json, package data written by backport/).

Read on every ``verify``, so read by path (``data_dir``), not ``importlib.resources``, whose import
(with ``zipfile``) costs more than the whole manifest lookup.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from sglang_dsv4_fix.value import Value

MANIFEST = "manifest.json"


class Result(Value):
    __slots__ = ("patch", "sha256")

    def __init__(self, sha256: str, patch: str) -> None:
        self.sha256 = sha256
        self.patch = (
            patch  # path inside the patches package, e.g. "no-init/0.5.16-pre-refactor.diff"
        )


class Release(Value):
    __slots__ = ("layout", "path", "results", "sha256", "variant", "version")

    def __init__(
        self,
        version: str,
        layout: str | None,
        path: str | None,
        sha256: str | None,
        variant: str,
        results: dict[str, Result],
    ) -> None:
        self.version = version
        self.layout = layout  # None: no DeepSeek-V4 planner in this release
        self.path = path  # kernel path inside the installed package tree ("sglang/...")
        self.sha256 = sha256  # the release's own c_plan.cuh
        self.variant = variant  # as classified: racy-init / no-init / not-applicable
        self.results = results  # target variant -> what applying it must give

    @property
    def applicable(self) -> bool:
        return self.layout is not None

    @property
    def fixed_upstream(self) -> bool:
        """The release ships a fixed kernel0: it has the planner and backport made no patch for it.

        Read from the data, so a verify of known bytes never imports the parser (kernel.py).
        """
        return self.applicable and not self.results


class Manifest(Value):
    __slots__ = ("releases",)

    def __init__(self, releases: dict[str, Release]) -> None:
        self.releases = releases

    def release(self, version: str | None) -> Release | None:
        return self.releases.get(version) if version else None

    def bases(self, sha256: str, layout: str | None) -> list[Release]:
        """Releases whose original kernel has these bytes in this layout."""
        return [r for r in self.releases.values() if r.sha256 == sha256 and r.layout == layout]

    def produced(self, sha256: str, layout: str | None) -> list[tuple[Release, str]]:
        """(base release, variant) pairs whose patched result has these bytes."""
        return [
            (r, variant)
            for r in self.releases.values()
            if r.layout == layout
            for variant, res in r.results.items()
            if res.sha256 == sha256
        ]


def data_dir() -> Path:
    """Where the patches package lives: beside this module in an installed wheel (no import: the
    package's own import was half of a manifest lookup in every SGLang process), else where the
    import system finds it (an editable install maps the repository's patches/ there)."""
    beside = os.path.join(os.path.dirname(__file__), "patches")  # os.path: pathlib costs more
    if os.path.isfile(os.path.join(beside, MANIFEST)):
        return Path(beside)
    import importlib

    spec = importlib.import_module(f"{__package__}.patches").__spec__
    assert spec is not None and spec.submodule_search_locations is not None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)  # read once per process, however many trees one call checks
def load() -> Manifest:
    with open(data_dir() / MANIFEST, "rb") as f:  # bytes: a text wrapper doubled the read's cost
        raw = json.loads(f.read())
    return Manifest({v: _release(v, entry) for v, entry in raw["releases"].items()})


def _release(version: str, entry: dict[str, Any]) -> Release:
    results = {
        variant: Result(res["sha256"], res["patch"])
        for variant, res in entry.get("results", {}).items()
    }
    return Release(
        version,
        entry.get("layout"),
        entry.get("path"),
        entry.get("sha256"),
        entry["variant"],
        results,
    )


def patch_text(name: str) -> str:
    return (data_dir() / name).read_text(encoding="utf-8")
