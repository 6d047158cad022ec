"""The doctor's verdict for each release CI tests, against what we know of them.

The table is the release survey (see the README's support table): which fixes
each release lacks. The patches must reach these states from the installed
code alone.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from typing import Any

import pytest

from tests.support.fix_tests import surveyed_states
from vllm_graphsafe.releases import release_table

V1_FIXES = ("v1-phase-dispatch", "v1-dummy-staging")
#: The releases CI installs: their exact rows are checked on every run.
EXPECTED_MRV2 = {
    "0.22.1": "applied",
    "0.27.1": "applied",
    "0.32.0": "native",
    "0.33.0": "native",
}
#: States in which no fix the release needs is missing.
SATISFIED = {"applied", "native", "not applicable"}


def expected_states(version: str) -> dict[str, str] | None:
    """The exact states for ``version`` by the survey (every fix declares the
    release its code landed in), or None outside the surveyed range."""
    return surveyed_states(version)


def table_states(version: str) -> dict[str, str] | None:
    """The states the release table records for ``version`` (0.34 on), or None."""
    rows = [row for row in release_table() if row.version == version]
    return dict(rows[0].patches) if rows else None


def installed_version() -> str:
    version: str = importlib.import_module("vllm").__version__
    return version


def doctor_report(*extra: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.cli.main", "doctor", "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def test_every_fix_this_release_needs_is_active() -> None:
    """Holds on every release, surveyed or not."""
    status, report = doctor_report("--import")
    states = {p["id"]: p["state"] for p in report["patches"]}
    assert {pid: s for pid, s in states.items() if s not in SATISFIED} == {}
    assert status == 0
    assert report["ok"] is True
    applied = [p for p in report["patches"] if p["state"] == "applied"]
    assert all(p["wrapped"] for p in applied), "an applied patch wrapped nothing"


def test_doctor_reports_every_patch_state_for_this_release() -> None:
    version = installed_version()
    expected = expected_states(version) or table_states(version)
    if expected is None:
        warnings.warn(
            f"vLLM {version} is outside the surveyed releases 0.20-0.33 and the "
            "release table: its exact patch states were not checked, only that "
            "every fix it needs is active",
            pytest.PytestWarning,
            stacklevel=1,
        )
        return
    _, report = doctor_report("--import")
    states = {p["id"]: p["state"] for p in report["patches"]}
    assert states == expected


@pytest.mark.parametrize("version", sorted(EXPECTED_MRV2))
def test_the_ci_releases_reach_the_surveyed_states(version: str) -> None:
    """The V1 runner lacks both fixes in every surveyed release; Model Runner V2
    classifies by phase from 0.28 (vllm-project/vllm#51865)."""
    states = expected_states(version)
    assert states is not None
    assert {fix: states[fix] for fix in V1_FIXES} == dict.fromkeys(V1_FIXES, "applied")
    assert states["mrv2-phase-dispatch"] == EXPECTED_MRV2[version]


@pytest.mark.parametrize(
    ("version", "mrv2"),
    [
        ("0.20.2", "applied"),
        ("0.27.0", "applied"),
        ("0.28.0", "native"),
        ("0.31.1rc1", "native"),
        ("0.33.0", "native"),
    ],
)
def test_the_expected_row_follows_the_survey(version: str, mrv2: str) -> None:
    states = expected_states(version)
    assert states is not None
    assert {fix: states[fix] for fix in V1_FIXES} == dict.fromkeys(V1_FIXES, "applied")
    assert states["mrv2-phase-dispatch"] == mrv2


def test_a_release_outside_the_survey_has_no_exact_row() -> None:
    assert expected_states("0.19.1") is None
    assert expected_states("0.35.0") is None


def needed_fix(version: str) -> str:
    """A fix the release needs, by its row of the release table: the first
    it applies (``v1-phase-dispatch`` up to 0.33, ``replay-guard`` on 0.34)."""
    rows = [row for row in release_table() if row.version == version]
    assert rows, f"vLLM {version} has no row in the release table"
    return next(fix for fix, state in rows[0].patches.items() if state == "applied")


@pytest.mark.parametrize("flag", [[], ["--no-import"]])
def test_doctor_fails_when_a_needed_fix_is_disabled(
    flag: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_GRAPHSAFE_DISABLE", needed_fix(installed_version()))
    status, report = doctor_report(*flag)
    assert status != 0
    assert report["ok"] is False


def test_the_installed_tree_read_as_a_source_tree_gets_the_same_states() -> None:
    """``SourceReader(root=...)``, the backport's view, agrees with the installed."""
    from pathlib import Path

    import vllm

    from vllm_graphsafe.fixes import all_fixes
    from vllm_graphsafe.judging import judge
    from vllm_graphsafe.sources import SourceReader

    root = Path(vllm.__file__).parent.parent
    for fix in all_fixes():
        installed = judge(fix, SourceReader())
        tree = judge(fix, SourceReader(root=root))
        assert tree.settle() == installed.settle()
