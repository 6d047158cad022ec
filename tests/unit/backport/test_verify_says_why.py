"""``backport --verify`` says why a fix's tests did not pass, and how to rerun them.

Each case plants a test file where the backport writes a fix's tests, in a
small tree (no vLLM needed), and runs it as ``--verify`` does. The expected
causes are the ones the planted files raise: a module that does not exist, an
assertion with its message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe.backport.tree_tests import first_error, verify_written
from vllm_graphsafe.tree_edits.plan import written_test_path

FIX_ID = "v1-phase-dispatch"
MISSING = "graphsafe_no_such_module"

IMPORTS_A_MISSING_MODULE = f"""\
import {MISSING}


def test_never_collected():
    pass
"""

FAILS_AN_ASSERTION = """\
def test_passes():
    assert 2 + 2 == 4


def test_planted_failure():
    assert 2 + 2 == 5, "two and two planted as five"


def test_a_second_failure():
    assert False, "not the first"
"""

PASSES = """\
import vllm


def test_the_tree_is_first_on_the_path():
    assert vllm.PLANTED == "tree"


def test_the_plugin_is_off():
    import os

    assert os.environ["GRAPHSAFE_DISABLE"] == "all"
"""


def tree_with(tmp_path: Path, test_text: str) -> tuple[Path, str]:
    root = tmp_path / "tree with space"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text('PLANTED = "tree"\n')
    relpath = written_test_path(FIX_ID)
    (root / relpath).parent.mkdir(parents=True)
    (root / relpath).write_text(test_text)
    return root.resolve(), relpath


def rerun_part(line: str) -> str:
    _, _, command = line.partition("; rerun: ")
    assert command, line
    return command


def test_tests_that_cannot_import_name_the_missing_module(tmp_path: Path) -> None:
    root, relpath = tree_with(tmp_path, IMPORTS_A_MISSING_MODULE)

    result = verify_written(FIX_ID, sys.executable, root, relpath)

    assert not result.ok
    assert result.line.startswith(
        f"could not run: ModuleNotFoundError: No module named '{MISSING}' "
        "(pytest exit 2); rerun: "
    ), result.line


def test_the_rerun_command_runs_the_same_tests_by_hand(tmp_path: Path) -> None:
    root, relpath = tree_with(tmp_path, IMPORTS_A_MISSING_MODULE)
    command = rerun_part(verify_written(FIX_ID, sys.executable, root, relpath).line)

    by_hand = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "GRAPHSAFE_DISABLE": ""},
    )

    assert by_hand.returncode == 2
    assert f"E   ModuleNotFoundError: No module named '{MISSING}'" in by_hand.stdout
    assert not (root / relpath).parent.joinpath(".pytest_cache").exists()


def test_failed_tests_give_counts_the_first_failure_and_the_rerun(
    tmp_path: Path,
) -> None:
    root, relpath = tree_with(tmp_path, FAILS_AN_ASSERTION)

    result = verify_written(FIX_ID, sys.executable, root, relpath)

    assert not result.ok
    assert result.line.startswith(
        "1 passed, 2 failed (first: test_planted_failure: "
        "AssertionError: two and two planted as five); rerun: cd "
    ), result.line
    assert relpath in rerun_part(result.line)


def test_passing_tests_give_their_counts(tmp_path: Path) -> None:
    root, relpath = tree_with(tmp_path, PASSES)

    result = verify_written(FIX_ID, sys.executable, root, relpath)

    assert result.ok, result.line
    assert result.line == "2 passed, 0 failed"


def test_an_interpreter_without_pytest_could_not_run_the_tests(
    tmp_path: Path,
) -> None:
    """Python's own status for a missing ``-m`` module is 1, pytest's status
    for failed tests: no report was written, so nothing ran."""
    root, relpath = tree_with(tmp_path, PASSES)
    python = tmp_path / "python-without-pytest"
    python.write_text('#!/bin/sh\necho "$0: No module named pytest" >&2\nexit 1\n')
    python.chmod(0o755)

    result = verify_written(FIX_ID, str(python), root, relpath)

    assert not result.ok
    assert result.line.startswith(
        f"could not run: {python}: No module named pytest (pytest exit 1); rerun: "
    ), result.line


@pytest.mark.parametrize(
    ("output", "first"),
    [
        (
            "E   ImportError: cannot import name 'x' from 'y'\n"
            "E   ModuleNotFoundError: No module named 'z'\n",
            "ImportError: cannot import name 'x' from 'y'",
        ),
        ("E       assert 1 == 2\nE   ValueError: v\n", "ValueError: v"),
        ("E       assert 1 == 2\n", "assert 1 == 2"),
        ("nothing quoted\n", ""),
    ],
)
def test_the_first_quoted_exception_is_preferred(output: str, first: str) -> None:
    assert first_error(output) == first
