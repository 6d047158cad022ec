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


#: The minor releases whose code was surveyed for each fix (``Fix.native_from``).
SURVEYED = ((0, 20), (0, 33))


def minor_of(version: str) -> tuple[int, int]:
    """``(0, 31)`` for ``"0.31.1rc1"``."""
    major, minor = version.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def surveyed_states(version: str) -> dict[str, str] | None:
    """The state each fix reaches on ``version`` by the survey, or None outside
    it: ``native`` from the release a fix's code landed in, else ``applied``."""
    from vllm_graphsafe.fixes import all_fixes

    minor = minor_of(version)
    if not SURVEYED[0] <= minor <= SURVEYED[1]:
        return None
    return {
        fix.id: "native"
        if fix.native_from is not None and minor >= fix.native_from
        else "applied"
        for fix in all_fixes()
    }
