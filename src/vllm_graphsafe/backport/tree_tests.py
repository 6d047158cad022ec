"""``backport --verify``: run the tests the backport wrote into a tree.

Each fix's written tests run against the tree (first on ``PYTHONPATH``, the
plugin disabled, the tree's own pytest configuration and conftest files left
out, so that only the written tests decide) with a chosen interpreter. Where
the tree has no written tests for a fix the backport would edit, the tests it
would write are run from a scratch folder: they fail until ``--write``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_graphsafe.backport import Backport, Outcome, Status
from vllm_graphsafe.backport.plan import written_test_path

PLUGIN_OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}
#: pytest's status for "tests ran and some failed"; others mean it could not run.
_PYTEST_FAILED = 1


@dataclass(frozen=True)
class FixTests:
    """One fix's line of the report."""

    fix_id: str
    ok: bool
    line: str


def verify_tree(result: Backport, python: str) -> list[FixTests]:
    """Run each requested fix's written tests against ``result.root``."""
    return [_one(result.root, outcome, python) for outcome in result.outcomes]


def _one(root: Path, outcome: Outcome, python: str) -> FixTests:
    relpath = written_test_path(outcome.fix_id)
    fix_id = outcome.fix_id
    if (root / relpath).is_file():
        return _ran(fix_id, _pytest(python, root, (root / relpath).resolve()), "")
    would_write = outcome.plan.tests.get(relpath) if outcome.plan else None
    if would_write is not None:
        with tempfile.TemporaryDirectory(prefix="graphsafe-verify-") as scratch:
            path = Path(scratch).resolve() / Path(relpath).name
            path.write_text(would_write, encoding="utf-8")
            run = _pytest(python, root, path)
        return _ran(fix_id, run, " (tests not yet written; the tree lacks the fix)")
    if outcome.status is Status.NATIVE:
        return FixTests(fix_id, True, "native in this tree; no backport test to run")
    if outcome.status is Status.NOT_APPLICABLE:
        return FixTests(fix_id, True, f"not applicable ({outcome.reason})")
    return FixTests(fix_id, False, f"cannot run: {outcome.reason}")


def _pytest(python: str, root: Path, test: Path) -> subprocess.CompletedProcess[str]:
    command = [
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-c",
        os.devnull,
        "--rootdir",
        str(test.parent),
        str(test),
    ]
    pythonpath = os.pathsep.join(
        [str(root.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return subprocess.run(
        command,
        cwd=test.parent,
        env={**os.environ, **PLUGIN_OFF, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        check=False,
    )


def _ran(fix_id: str, run: subprocess.CompletedProcess[str], note: str) -> FixTests:
    summary = _summary(run.stdout)
    if run.returncode == 0:
        return FixTests(fix_id, True, f"passed: {summary}")
    if run.returncode == _PYTEST_FAILED:
        return FixTests(fix_id, False, f"failed: {summary}{note}")
    reason = _last_line(run.stderr) or _last_line(run.stdout) or "no output"
    return FixTests(
        fix_id, False, f"could not run (pytest exit {run.returncode}): {reason}"
    )


def _summary(stdout: str) -> str:
    return _last_line(stdout).strip("= ") or "no summary"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
