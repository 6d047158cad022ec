"""A served plugin under sustained load: the benchmark's soak, at CI size.

``bench/soak.py`` serves 2,000 requests for the benchmark table; here one
server with the plugin serves ``REQUESTS`` at concurrency 32 through vLLM's own
serving benchmark (``bench/serve_load.py``'s prompt set: (1 + K)-token
prompts, chunked and prefix-cached (1 + K)-token tails, ordinary prompts),
while ``/metrics`` is scraped every second. Checked, each against state the
plugin does not keep:

- no request fails, every scrape answers 200, one at least every second, and
  the last page holds the counts;
- the plugin's counts equal the decisions the steps called for by the
  worker's step log (scheduler output: a step whose every width is 1 + K is a
  uniform decode when the attention metadata builders run none of its rows as
  a prefill, else kept off the decode graph; any other step is non-uniform),
  and what the runner handed the dispatcher;
- the resident memory of every server process grows by at most 5% from the end
  of the warm-up (the benchmark's: rounds of 250 requests until memory
  settles, about a thousand requests; vLLM's CPU worker grows by about a tenth
  over them, with or without the plugin, and a shorter warm-up measures that)
  to the end of the run.

``GRAPHSAFE_SOAK_REQUESTS`` sets the request count.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench import soak
from vllm_graphsafe.fixes.phase_events import KEPT_OFF_DECODE

REQUESTS = int(os.environ.get("GRAPHSAFE_SOAK_REQUESTS", "200"))
RSS_GROWTH = 1.05


def test_soak_counts_memory_and_metrics(tiny_model: Path, tmp_path: Path) -> None:
    record = soak.run(
        tiny_model,
        Path(os.environ["VLLM_CACHE_ROOT"]),
        REQUESTS,
        tmp_path,
    )

    load, decisions, metrics = record["load"], record["decisions"], record["metrics"]
    print(
        f"soak: {REQUESTS} requests, load {load['seconds']:.1f} s, "
        f"{metrics['scrapes']} scrapes, output {load['output_throughput']:.0f} tok/s"
    )
    assert record["warm_up_failed"] == 0
    assert record["warm_up_settled"], record["warm_up_rounds"]
    assert load["failed"] == 0 and load["completed"] == REQUESTS, load["first_error"]
    assert metrics["error_count"] == 0, metrics["errors"]
    assert metrics["statuses"] == {"200": metrics["scrapes"]}
    assert metrics["scrapes"] >= int(metrics["seconds"]), metrics
    counted = decisions["counted"]
    assert counted == decisions["scheduler"] == decisions["engine"], decisions
    assert counted[KEPT_OFF_DECODE] > 0, "no prompt step had a decode's shape"
    last_page = metrics["last_decisions"]
    assert {event: last_page.get(event, 0) for event in soak.EVENTS} == counted
    after = record["resident_kib"]["after_warm_up"]
    at_end = record["resident_kib"]["at_end"]
    grown = {
        pid: at_end[pid]["kib"] / size["kib"]
        for pid, size in after.items()
        if pid in at_end
    }
    assert grown and all(ratio <= RSS_GROWTH for ratio in grown.values()), grown
