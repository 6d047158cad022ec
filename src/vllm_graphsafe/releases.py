"""The release table (``data/releases.json``): which vLLM releases CI verifies.

Written by the release sweep (``scripts/release-sweep.sh``). Each row gives,
per patch, the state the release reaches; a patch is verified on the releases
CI runs, and on each swept release where it reached a correct state and the
class tests and negative controls passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class ReleaseRow:
    distribution: str
    version: str
    patches: dict[str, str]
    ci: bool
    raw: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}"


@cache
def release_table() -> tuple[ReleaseRow, ...]:
    text = (
        resources.files("vllm_graphsafe")
        .joinpath("data/releases.json")
        .read_text(encoding="utf-8")
    )
    return tuple(
        ReleaseRow(
            distribution=row["distribution"],
            version=row["version"],
            patches=dict(row.get("patches", {})),
            ci=bool(row.get("ci", False)),
            raw=row,
        )
        for row in json.loads(text)["rows"]
    )


#: Patch states the sweep accepts as correct for a release.
SOUND_STATES = frozenset({"applied", "native", "not applicable"})


def sweep_verified(row: ReleaseRow, patch_id: str) -> bool:
    """The sweep saw the patch in a correct state, no class test failing, and
    every negative control failing its tests without its fix."""
    class_tests = str(row.raw.get("class_tests", ""))
    return (
        bool(row.raw.get("installed", False))
        and row.patches.get(patch_id) in SOUND_STATES
        and " 0 failed" in f" {class_tests}"
        and "error" not in class_tests
        and row.raw.get("negative_controls") == "all failed"
    )


def verified_releases(patch_id: str) -> tuple[str, ...]:
    """``"<distribution> <version>"`` of every release that verifies the patch:
    CI's releases (re-verified on every run) and the sweep's passing rows."""
    return tuple(
        row.label
        for row in release_table()
        if patch_id in row.patches and (row.ci or sweep_verified(row, patch_id))
    )
