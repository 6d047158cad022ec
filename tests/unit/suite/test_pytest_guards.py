"""The suite's own guards: a mistyped marker and an empty regression list fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.suite.processes import finish_all

ROOT = Path(__file__).resolve().parents[3]


def start_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.Popen[str]:
    """pytest on one test file, with this repository's settings and conftest."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    test_file = tmp_path / "test_guarded.py"
    test_file.write_text(source)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(test_file),
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


MISTYPED = """
import pytest

@pytest.mark.regresion("v1-phase-dispatch")
def test_x():
    assert False
"""

EMPTY = """
import pytest

SPECULATORS = []

@pytest.mark.regression("mrv2-phase-dispatch")
@pytest.mark.parametrize("speculator", SPECULATORS)
def test_x(speculator):
    assert False
"""


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    """The three runs, started together (each spends its time starting pytest)."""
    base = tmp_path_factory.mktemp("guards")
    started = {
        "mistyped": start_pytest(base / "mistyped", MISTYPED),
        "empty, its control": start_pytest(
            base / "own", EMPTY, "--negative-control=mrv2-phase-dispatch"
        ),
        "empty, another control": start_pytest(
            base / "other", EMPTY, "--negative-control=v1-phase-dispatch"
        ),
    }
    return finish_all(started)


def test_a_mistyped_marker_is_an_error(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = runs["mistyped"]

    assert result.returncode == pytest_exit_code("INTERRUPTED")
    assert "'regresion' not found in `markers` configuration option" in result.stdout


def test_an_empty_regression_list_fails_the_negative_control(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = runs["empty, its control"]

    assert result.returncode == pytest_exit_code("TESTS_FAILED")
    assert (
        "the negative control of mrv2-phase-dispatch would drop "
        "test_guarded.py::test_x[NOTSET]: a parameter list it iterates is empty"
    ) in result.stdout + result.stderr


def test_an_empty_list_of_another_patch_does_not_stop_a_control(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = runs["empty, another control"]

    assert result.returncode == pytest_exit_code("NO_TESTS_COLLECTED")


def pytest_exit_code(name: str) -> int:
    return int(pytest.ExitCode[name])
