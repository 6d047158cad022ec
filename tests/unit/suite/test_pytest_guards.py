"""The suite's own guards: a mistyped marker and an empty regression list fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_pytest(
    tmp_path: Path, source: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """pytest on one test file, with this repository's settings and conftest."""
    test_file = tmp_path / "test_guarded.py"
    test_file.write_text(source)
    return subprocess.run(
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
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
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


def test_a_mistyped_marker_is_an_error(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, MISTYPED)

    assert result.returncode == pytest_exit_code("INTERRUPTED")
    assert "'regresion' not found in `markers` configuration option" in result.stdout


def test_an_empty_regression_list_fails_the_negative_control(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, EMPTY, "--negative-control=mrv2-phase-dispatch")

    assert result.returncode == pytest_exit_code("TESTS_FAILED")
    assert (
        "the negative control of mrv2-phase-dispatch would drop "
        "test_guarded.py::test_x[NOTSET]: a parameter list it iterates is empty"
    ) in result.stdout + result.stderr


def test_an_empty_list_of_another_patch_does_not_stop_a_control(
    tmp_path: Path,
) -> None:
    result = run_pytest(tmp_path, EMPTY, "--negative-control=v1-phase-dispatch")

    assert result.returncode == pytest_exit_code("NO_TESTS_COLLECTED")


def pytest_exit_code(name: str) -> int:
    import pytest

    return int(pytest.ExitCode[name])
