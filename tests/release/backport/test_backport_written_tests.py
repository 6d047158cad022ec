"""The CPU tests the backport writes pass on the edited tree, fail on the pristine one.

They run with the release's python, the tree first on ``PYTHONPATH`` and the
plugin disabled, so they exercise the tree's own code only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_graphsafe.cli.main import main

PLUGIN_OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}


def run_tests(tree: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rf",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tree),
            *tests,
        ],
        cwd=tree,
        env={**os.environ, **PLUGIN_OFF, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_written_tests_pass_after_the_edit_and_fail_before_it(
    pristine_tree: Path, tree_copy: Callable[[], Path]
) -> None:
    edited = tree_copy()
    if main(["backport", "--tree", str(edited), "--write"]) != 0:
        pytest.fail("the backport did not apply to this release")
    tests = sorted(
        path.relative_to(edited).as_posix()
        for path in (edited / "tests").rglob("test_graphsafe_backport_*.py")
    )
    if not tests:
        pytest.skip("this release needs none of the fixes")
    before = tree_copy()
    for test in tests:
        (before / test).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(edited / test, before / test)

    after_edit = run_tests(edited, tests)
    before_edit = run_tests(before, tests)

    assert after_edit.returncode == 0, after_edit.stdout[-3000:]
    assert before_edit.returncode == 1, before_edit.stdout[-3000:]
    failing_files = {
        line.split()[1].split("::")[0]
        for line in before_edit.stdout.splitlines()
        if line.startswith("FAILED ")
    }
    assert failing_files == set(tests)
