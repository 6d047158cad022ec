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

import pytest

V1_FIXES_MISSING = {"v1-phase-dispatch": "applied", "v1-dummy-staging": "applied"}
EXPECTED_STATES = {
    "0.22.1": {**V1_FIXES_MISSING, "mrv2-phase-dispatch": "applied"},
    "0.27.1": {**V1_FIXES_MISSING, "mrv2-phase-dispatch": "applied"},
    "0.32.0": {**V1_FIXES_MISSING, "mrv2-phase-dispatch": "native"},
    "0.33.0": {**V1_FIXES_MISSING, "mrv2-phase-dispatch": "native"},
}


def installed_version() -> str:
    return importlib.import_module("vllm").__version__


def doctor_report(*extra: str) -> tuple[int, dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.cli.main", "doctor", "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def test_release_is_one_ci_tests() -> None:
    assert installed_version() in EXPECTED_STATES


def test_doctor_reports_every_patch_state_for_this_release() -> None:
    status, report = doctor_report("--import")
    states = {p["id"]: p["state"] for p in report["patches"]}  # type: ignore[index,union-attr]
    assert states == EXPECTED_STATES[installed_version()]
    assert status == 0
    assert report["ok"] is True
    applied = [p for p in report["patches"] if p["state"] == "applied"]  # type: ignore[union-attr,index]
    assert all(p["wrapped"] for p in applied), "an applied patch wrapped nothing"


@pytest.mark.parametrize("flag", [[], ["--no-import"]])
def test_doctor_fails_when_a_needed_fix_is_disabled(
    flag: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_GRAPHSAFE_DISABLE", "v1-phase-dispatch")
    status, report = doctor_report(*flag)
    assert status != 0
    assert report["ok"] is False


def test_the_installed_tree_read_as_a_source_tree_gets_the_same_states() -> None:
    """``SourceReader(root=...)``, the backport's view, agrees with the installed."""
    from pathlib import Path

    import vllm

    from vllm_graphsafe.patches import all_patches
    from vllm_graphsafe.registry import SourceReader
    from vllm_graphsafe.settings import read_settings

    root = Path(vllm.__file__).parent.parent
    settings = read_settings({})
    for installed, tree in zip(all_patches(), all_patches(), strict=True):
        installed.decide(settings, SourceReader())
        tree.decide(settings, SourceReader(root=root))
        assert (tree.state, tree.reason) == (installed.state, installed.reason)
        assert installed.state is not None
