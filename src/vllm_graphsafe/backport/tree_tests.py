"""``backport --verify``: run the tests the backport wrote into a tree.

They run with the tree first on ``PYTHONPATH``, the plugin disabled and the
tree's own pytest configuration and conftest files left out, so that only the
written tests decide.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from vllm_graphsafe.backport import Backport, Outcome, Status
from vllm_graphsafe.tree_edits.plan import written_test_path

PLUGIN_OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}
#: pytest's lines that quote an exception (``E   ModuleNotFoundError: ...``).
_ERROR_LINE = re.compile(r"^E\s+(\S.*)$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


@dataclass(frozen=True)
class FixTests:
    """One fix's line of the report, and (``--json``) its parts."""

    fix_id: str
    ok: bool
    line: str
    counts: Counts | None = None
    #: Why they could not run (pytest's own first error).
    could_not_run: str | None = None
    rerun: str | None = None


@dataclass(frozen=True)
class Counts:
    """A junit report's totals; ``errors`` are tests that errored in set-up
    or teardown."""

    tests: int
    failures: int
    errors: int
    skipped: int

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped

    def text(self) -> str:
        text = f"{self.passed} passed, {self.failures} failed"
        if self.errors:
            text += f", {self.errors} errors"
        if self.skipped:
            text += f", {self.skipped} skipped"
        return text


@dataclass(frozen=True)
class TestRun:
    """One pytest run: its status, output, and its junit report's totals and
    first failed test (name, first line of its cause)."""

    returncode: int | None
    stdout: str
    stderr: str
    counts: Counts | None = None
    first_failure: tuple[str, str] | None = None


def verify_tree(result: Backport, python: str) -> list[FixTests]:
    """Run each fix's written tests against the tree, as many fixes at once as
    there are cores (each is its own pytest process, mostly importing torch)."""
    workers = max(1, min(len(result.outcomes), os.cpu_count() or 1))
    root = result.root.resolve()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda o: _one(root, o, python), result.outcomes))


def _one(root: Path, outcome: Outcome, python: str) -> FixTests:
    fix_id = outcome.fix_id
    relpath = written_test_path(fix_id)
    if (root / relpath).is_file():
        return verify_written(fix_id, python, root, relpath)
    would_write = outcome.plan.tests.get(relpath) if outcome.plan else None
    if would_write is not None:
        with tempfile.TemporaryDirectory(prefix="graphsafe-verify-") as scratch:
            path = Path(scratch).resolve() / Path(relpath).name
            path.write_text(would_write, encoding="utf-8")
            run = run_tests(python, root, path.parent, path.name)
        return _reported(
            fix_id,
            run,
            f"rerun after --write: {rerun_command(python, root, relpath)}",
            " (tests not yet written; the tree lacks the fix)",
        )
    if outcome.status is Status.NATIVE:
        return FixTests(fix_id, True, "native in this tree; no backport test to run")
    if outcome.status is Status.NOT_APPLICABLE:
        return FixTests(fix_id, True, f"not applicable ({outcome.reason})")
    return FixTests(fix_id, False, f"cannot run: {outcome.reason}")


def verify_written(fix_id: str, python: str, root: Path, relpath: str) -> FixTests:
    """Run the tests written at ``relpath`` in the tree at ``root`` (absolute)."""
    run = run_tests(python, root, root, relpath)
    return _reported(fix_id, run, f"rerun: {rerun_command(python, root, relpath)}", "")


def pytest_arguments(test: str) -> list[str]:
    """No cache written into the tree, none of its conftest files or its
    configuration, the test's folder as the root."""
    no_tree_config = ["-p", "no:cacheprovider", "--noconftest", "-c", os.devnull]
    return [*no_tree_config, "--rootdir", os.path.dirname(test) or ".", test]


def tree_pythonpath(root: Path) -> str:
    return os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])


def rerun_command(python: str, root: Path, test: str) -> str:
    """The shell command that runs ``test`` (relative to ``root``) as
    ``--verify`` does."""
    words = [python, "-m", "pytest", *pytest_arguments(test)]
    return (
        f"cd {shlex.quote(str(root))} && GRAPHSAFE_DISABLE=all "
        f"PYTHONPATH={shlex.quote(tree_pythonpath(root))} {shlex.join(words)}"
    )


def run_tests(python: str, root: Path, cwd: Path, test: str) -> TestRun:
    """Run ``test`` (relative to ``cwd``) against the tree at ``root``."""
    with tempfile.TemporaryDirectory(prefix="graphsafe-verify-report-") as folder:
        report = Path(folder) / "report.xml"
        command = [python, "-m", "pytest", "-q", f"--junitxml={report}"]
        env = {**os.environ, **PLUGIN_OFF, "PYTHONPATH": tree_pythonpath(root)}
        try:
            done = subprocess.run(
                [*command, *pytest_arguments(test)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
            )
        except OSError as error:
            return TestRun(
                None, "", f"cannot start {python}: {error.strerror or error}"
            )
        counts, first_failure = read_report(report)
    return TestRun(done.returncode, done.stdout, done.stderr, counts, first_failure)


def read_report(path: Path) -> tuple[Counts | None, tuple[str, str] | None]:
    """The totals of pytest's junit report and its first failed or errored
    test (name, first line of its cause)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None, None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = Counts(
        *(
            sum(int(suite.get(name, "0")) for suite in suites)
            for name in ("tests", "failures", "errors", "skipped")
        )
    )
    for case in root.iter("testcase"):
        for problem in (*case.iter("failure"), *case.iter("error")):
            name = case.get("name") or case.get("classname") or "a test"
            cause = first_error(problem.text or "") or _first_line(
                problem.get("message", "")
            )
            return counts, (name, cause)
    return counts, None


def first_error(output: str) -> str:
    """The first exception pytest quoted in ``output`` (an ``E   ...Error:
    ...`` line), else its first quoted line of any kind; empty without one."""
    quoted = [
        match.group(1).strip()
        for match in map(_ERROR_LINE.match, output.splitlines())
        if match
    ]
    exceptions = [line for line in quoted if _EXCEPTION.match(line)]
    return (exceptions or quoted or [""])[0]


def _reported(fix_id: str, run: TestRun, rerun: str, note: str) -> FixTests:
    counts = run.counts
    # pytest's 0: all passed, 1: some failed; any other: they could not run.
    if counts is not None and run.returncode in (0, 1):
        if run.returncode == 0:
            return FixTests(fix_id, True, counts.text(), counts, rerun=rerun)
        first = ""
        if run.first_failure is not None:
            name, cause = run.first_failure
            first = f" (first: {name}: {cause})" if cause else f" (first: {name})"
        return FixTests(
            fix_id, False, f"{counts.text()}{first}{note}; {rerun}", counts, rerun=rerun
        )
    status = "" if run.returncode is None else f" (pytest exit {run.returncode})"
    cause = _cause(run)
    return FixTests(
        fix_id,
        False,
        f"could not run: {cause}{status}{note}; {rerun}",
        could_not_run=f"{cause}{status}",
        rerun=rerun,
    )


def _cause(run: TestRun) -> str:
    return (
        first_error(run.stdout)
        or (run.first_failure[1] if run.first_failure is not None else "")
        or _last_line(run.stderr)
        or _last_line(run.stdout).strip("= ")
        or "no output"
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _last_line(text: str) -> str:
    return _first_line("\n".join(reversed(text.splitlines())))
