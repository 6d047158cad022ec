"""The release table (``data/releases.json``): which vLLM releases CI verifies.

Written by the release sweep, and by hand for CI's own releases until it runs.
Each row gives, per patch, the state the release reaches; a patch is verified
on the releases CI runs whose row names it.
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


def verified_releases(patch_id: str) -> tuple[str, ...]:
    """``"<distribution> <version>"`` of every CI release whose row names the patch."""
    return tuple(
        row.label for row in release_table() if row.ci and patch_id in row.patches
    )
