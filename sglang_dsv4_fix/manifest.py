"""The release manifest (patches/manifest.json, package data written by backport/)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

PACKAGE = "sglang_dsv4_fix.patches"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Result:
    sha256: str
    patch: str  # path inside the patches package, e.g. "no-init/0.5.16-pre-refactor.diff"


@dataclass(frozen=True)
class Release:
    version: str
    layout: str | None  # None: no DeepSeek-V4 planner in this release
    path: str | None  # kernel path inside the installed package tree ("sglang/...")
    sha256: str | None  # the release's own c_plan.cuh
    variant: str  # as classified: racy-init / no-init / not-applicable
    results: dict[str, Result]  # target variant -> what applying it must give

    @property
    def applicable(self) -> bool:
        return self.layout is not None


@dataclass(frozen=True)
class Manifest:
    releases: dict[str, Release]

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


def load() -> Manifest:
    raw = json.loads(resources.files(PACKAGE).joinpath(MANIFEST).read_text(encoding="utf-8"))
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
    return resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8")
