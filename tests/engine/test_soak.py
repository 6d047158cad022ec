"""A served plugin under sustained load (issue 26, item 4, CI size).

One server with the plugin serves ``REQUESTS`` requests at concurrency
``CONCURRENCY`` through vLLM's own serving benchmark (``bench/serve_load.py``'s
prompt set: (1 + K)-token prompts, chunked and prefix-cached (1 + K)-token
tails, ordinary prompts), while ``/metrics`` is scraped every second. Checked:

- no request fails, and every scrape answers 200;
- the plugin's counts equal the decisions the steps called for, by the step log
  of the worker (scheduler output, independent of the plugin): a step whose
  every width is 1 + K is a uniform decode when no scheduled request is in its
  prompt, else kept off the decode graph; any other step is non-uniform;
- the resident memory of every server process grows by at most 5% from the end
  of a warm-up to the end of the run.

``GRAPHSAFE_SOAK_REQUESTS`` raises the request count (the benchmark's soak run
uses 2,000).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench import serve_load
from tests.engine.soak_steps import SOAK_LOG_ENV, WORKER_EXTENSION
from vllm_graphsafe.counts import read_stats_dir
from vllm_graphsafe.fixes.phase_events import (
    KEPT_OFF_DECODE,
    NON_UNIFORM,
    UNIFORM_DECODE,
)
from vllm_graphsafe.local_engine import launcher as local

REPO = Path(__file__).resolve().parents[2]
K = serve_load.NUM_SPECULATIVE_TOKENS
REQUESTS = int(os.environ.get("GRAPHSAFE_SOAK_REQUESTS", "200"))
WARM_UP = 32
CONCURRENCY = 32
OUTPUT_TOKENS = 32
RSS_GROWTH = 1.05
PATCH = "v1-phase-dispatch"


def expected_decisions(steps: list[dict[str, list[int]]]) -> Counter[str]:
    decisions: Counter[str] = Counter()
    for step in steps:
        if all(width == 1 + K for width in step["widths"]):
            decisions[KEPT_OFF_DECODE if step["in_prompt"] else UNIFORM_DECODE] += 1
        else:
            decisions[NON_UNIFORM] += 1
    return decisions


def resident_kib(root: int) -> dict[int, int]:
    """VmRSS of ``root`` and its descendants, by pid."""
    sizes = {}
    for pid in local.live_group_members(root) or [root]:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                sizes[pid] = int(line.split()[1])
    return sizes


def read_steps(directory: Path) -> list[dict[str, list[int]]]:
    steps = []
    for path in sorted(directory.glob("*.jsonl")):
        steps += [json.loads(line) for line in path.read_text().splitlines() if line]
    return steps


class Scraper(threading.Thread):
    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.stop = threading.Event()
        self.answers: list[int] = []
        self.errors: list[str] = []

    def run(self) -> None:
        due = time.monotonic()
        with httpx.Client(base_url=self.base_url, timeout=10) as client:
            while not self.stop.wait(max(0.0, due - time.monotonic())):
                due += 1.0  # on a one-second clock, whatever a scrape takes
                try:
                    self.answers.append(client.get("/metrics").status_code)
                except httpx.HTTPError as error:
                    self.errors.append(f"{type(error).__name__}: {error}")


def test_soak_counts_memory_and_metrics(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    started = time.monotonic()
    steps_dir, stats_dir = tmp_path / "steps", tmp_path / "stats"
    env = local.server_environment(
        {
            "GRAPHSAFE_STATS_DIR": str(stats_dir),
            "GRAPHSAFE_CACHE_DIR": os.environ.get(
                "GRAPHSAFE_CACHE_DIR", str(tmp_path / "verdicts")
            ),
            SOAK_LOG_ENV: str(steps_dir),
            "PYTHONPATH": os.pathsep.join(
                filter(None, (str(REPO), os.environ.get("PYTHONPATH")))
            ),
        },
        drop=[k for k in os.environ if k.startswith(("GRAPHSAFE_", "VLLM_GRAPHSAFE_"))],
    )
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    dataset = serve_load.write_dataset(
        serve_load.prompt_set(tokenizer, REQUESTS, OUTPUT_TOKENS),
        tmp_path / "prompts.json",
    )
    server = local.start_server(
        tiny_model,
        env=env,
        log_path=tmp_path / "server.log",
        num_speculative_tokens=K,
        extra_args=[
            "--max-num-batched-tokens",
            str(serve_load.CHUNK_TOKENS),
            "--worker-extension-cls",
            WORKER_EXTENSION,
        ],
    )
    try:
        server.wait_until_healthy(600)

        def load(count: int) -> dict[str, float]:
            return serve_load.run_turn(
                serve_load.serve_arguments(
                    server.base_url,
                    server.model,
                    dataset,
                    count,
                    CONCURRENCY,
                    OUTPUT_TOKENS,
                )
            )

        warm = load(WARM_UP)
        assert warm["failed"] == 0
        after_warm_up = resident_kib(server.process.pid)
        scraper = Scraper(server.base_url)
        scraper.start()
        soak_started = time.monotonic()
        soak = load(REQUESTS)
        soak_s = time.monotonic() - soak_started
        scraper.stop.set()
        scraper.join()
        at_end = resident_kib(server.process.pid)
    finally:
        server.stop()
    print(
        f"soak: {REQUESTS} requests in {time.monotonic() - started:.0f} s, "
        f"load {soak_s:.1f} s, {len(scraper.answers)} scrapes, output "
        f"{soak['output_throughput']:.0f} tok/s"
    )
    assert soak["failed"] == 0 and soak["completed"] == REQUESTS
    assert scraper.errors == [] and set(scraper.answers) == {200}
    grown = {
        pid: at_end[pid] / size for pid, size in after_warm_up.items() if pid in at_end
    }
    assert grown and all(ratio <= RSS_GROWTH for ratio in grown.values()), grown
    counts = read_stats_dir(stats_dir)["counts"][PATCH]
    expected = expected_decisions(read_steps(steps_dir))
    made = {
        event: counts.get(event, 0)
        for event in (UNIFORM_DECODE, KEPT_OFF_DECODE, NON_UNIFORM)
    }
    assert made == {event: expected[event] for event in made}
    assert expected[KEPT_OFF_DECODE] > 0, "no prompt step had a decode's shape"
    assert len(scraper.answers) >= int(soak_s), (soak_s, scraper.answers)
