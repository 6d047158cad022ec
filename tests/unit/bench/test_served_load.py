"""The served-load benchmarks' vLLM-free parts: the prompt set, the end-to-end
figures and their verdicts, the soak's tallies, goals and report.

The oracles are hand counts of small made-up inputs, never the code's output.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench import report, serve_load, soak, summaries
from tests.support import step_log
from vllm_graphsafe import catalogue

K = serve_load.NUM_SPECULATIVE_TOKENS

# -- the prompt set ------------------------------------------------------------


class WordTokenizer:
    """Every word one token, as the tiny model's tokenizer reads common words."""

    class Encoded:
        def __init__(self, ids: list[int]) -> None:
            self.input_ids = ids

    def __call__(self, text: str, add_special_tokens: bool = False) -> Encoded:
        return self.Encoded([hash(word) % 1000 for word in text.split()])


def test_the_prompt_set_has_its_share_of_decode_shaped_prompts_and_tails() -> None:
    rows = serve_load.prompt_set(WordTokenizer(), 40, 16)
    lengths = {kind: [] for kind, _ in serve_load.MIX}  # type: ignore[var-annotated]
    for row in rows:
        lengths[row["kind"]].append(len(row["prompt"].split()))

    assert lengths["decode_shaped"] == [1 + K] * 16
    assert sorted(set(lengths["chunked_tail"])) == [132, 260, 388]  # 128 n + 4
    assert lengths["cached_tail"] == [256 + 1 + K] * 8
    cached = [row["prompt"] for row in rows if row["kind"] == "cached_tail"]
    assert len({" ".join(text.split()[:256]) for text in cached}) == 1
    assert all(row["output_tokens"] == 16 for row in rows)


def test_the_benchmark_gets_the_prompts_as_written(tmp_path: Path) -> None:
    rows = serve_load.prompt_set(WordTokenizer(), 10, 8)
    path = serve_load.write_dataset(rows, tmp_path / "prompts.json")
    conversations = json.loads(path.read_text())

    assert [c["conversations"][0]["value"] for c in conversations] == [
        row["prompt"] for row in rows
    ]
    arguments = serve_load.serve_arguments("http://x", "m", path, 10, 4, 8)
    assert arguments[arguments.index("--sharegpt-output-len") + 1] == "8"
    assert "--ignore-eos" in arguments


# -- end to end: eight figures, one symmetric rule --------------------------------

FIGURES = [metric for metric, _, _ in summaries.END_TO_END_FIGURES]


def _turns(values: dict[str, list[float]], pairs: int) -> list[dict[str, float]]:
    return [{metric: values[metric][i] for metric in FIGURES} for i in range(pairs)]


def _e2e(on: dict[str, list[float]], off: dict[str, list[float]]) -> dict[str, Any]:
    pairs = len(on[FIGURES[0]])
    raw = {
        "prompts": 10,
        "prompt_kinds": {"decode_shaped": 4, "chunked_tail": 2, "other": 4},
        "max_num_batched_tokens": 128,
        "output_tokens": 16,
        "concurrency": 8,
        "repetitions": pairs,
        "turns": {"on": _turns(on, pairs), "off": _turns(off, pairs)},
        "dispatch": {"on": {"counts": {"v1-phase-dispatch": {"uniform_decode": 3}}}},
    }
    return {"raw": raw, "summary": summaries.summarize_end_to_end(raw)}


def _same(pairs: int, value: float = 100.0) -> dict[str, list[float]]:
    return {metric: [value] * pairs for metric in FIGURES}


def test_each_figure_is_a_median_of_paired_ratios_with_its_interval() -> None:
    on = _same(8)
    on["p99_itl_ms"] = [50.0, 100.0, 200.0, 100.0, 100.0, 100.0, 100.0, 100.0]
    summary = summaries.summarize_end_to_end(_e2e(on, _same(8))["raw"])

    assert set(summary) == set(FIGURES)
    assert summary["p99_itl_ms"]["ratio_on_off"]["median"] == 1.0
    # 8 pairs: the binomial interval of the median spans the 1st to 8th ratio.
    assert summary["p99_itl_ms"]["ratio_median_ci95"] == [0.5, 2.0]


def test_a_higher_latency_is_a_slowdown_and_a_lower_one_is_not() -> None:
    on, off = _same(16), _same(16)
    on["median_ttft_ms"] = [110.0 + i for i in range(16)]  # every pair 10-25% slower
    on["p99_tpot_ms"] = [80.0 + i for i in range(16)]  # every pair faster
    on["output_throughput"] = [90.0 + i / 2 for i in range(16)]  # fewer tokens/s
    goals = summaries.end_to_end_goals(_e2e(on, off))

    assert goals["end_to_end_median_ttft_ms"]["verdict"] == "**slower**"
    assert goals["end_to_end_median_ttft_ms"]["met"] is False
    assert goals["end_to_end_p99_tpot_ms"]["verdict"] == "faster"
    assert goals["end_to_end_output_throughput"]["verdict"] == "**slower**"
    assert goals["end_to_end_p99_itl_ms"]["verdict"] == (
        "no difference detected within ±0.0%"
    )
    assert len(goals) == 7


def test_a_zero_figure_with_the_plugin_off_makes_an_infinite_ratio() -> None:
    assert summaries.on_off_ratio(3.0, 0.0) == math.inf
    assert summaries.on_off_ratio(0.0, 0.0) == 1.0
    assert summaries.on_off_ratio(0.0, 2.0) == 0.0


def test_too_few_pairs_are_not_judged() -> None:
    goals = summaries.end_to_end_goals(_e2e(_same(1, 2.0), _same(1)))

    assert all(goal["met"] is None for goal in goals.values())
    assert all("verdict" not in goal for goal in goals.values())


def test_results_md_and_the_table_show_every_figure() -> None:
    results: dict[str, Any] = {
        "meta": {
            "mode": "test",
            "host": "test host",
            "command": "x",
            "wall_s": 1.0,
            "started": "2026-01-01T00:00:00+0000",
        },
        "end_to_end": _e2e(_same(4), _same(4)),
    }
    results["goals"] = summaries.check_goals(results)
    markdown = report.markdown(results)
    block = report.benchmarks_table(results)

    for _, label, _ in summaries.END_TO_END_FIGURES:
        assert f"| {label} |" in markdown
        assert f"end to end, {label.rsplit(',', 1)[0]}, plugin on/off" in block
    assert "(1 + K)-token prompts" in markdown
    assert "`vllm.benchmarks.serve`" in markdown


def test_an_older_end_to_end_record_renders_as_a_note() -> None:
    older = {
        "raw": {"repetitions": 2, "turns": {}},
        "summary": {"tokens_per_s": {}},
    }
    lines = report.end_to_end_markdown({"end_to_end": older})

    assert "older version of the benchmark" in "\n".join(lines)


# -- the soak: tallies of the step log -------------------------------------------

DECODE, PROMPT_TAIL = [1 + K, 1 + K], [1 + K]


def _step(
    widths: list[int], in_prompt: bool, prefill: bool, uniform: bool | None
) -> dict[str, Any]:
    return {
        "widths": widths,
        "in_prompt": in_prompt,
        "prefill_rows": prefill,
        "uniform_decode": uniform,
    }


STEPS = [
    _step(DECODE, False, False, True),  # a genuine decode
    _step(DECODE, True, False, True),  # a prompt tail padded with drafts: a decode
    _step(PROMPT_TAIL, True, True, False),  # a (1 + K)-token prompt: kept off
    _step([1 + K, 12], True, True, False),  # a mixed step
    _step([1, 1], False, False, False),  # no drafts proposed: not a decode's shape
]


def test_the_scheduler_and_the_dispatcher_tallies_read_the_step_log() -> None:
    expected = {"uniform_decode": 2, "prefill_kept_off_decode_graph": 1}
    expected["non_uniform"] = 2

    assert soak.scheduler_decisions(STEPS) == expected
    assert soak.engine_decisions(STEPS) == expected
    assert soak.padded_prompt_tails(STEPS) == 1
    # A prompt step the runner sent to the decode graph: the tallies part.
    leaked = [*STEPS, _step(PROMPT_TAIL, True, True, True)]
    assert soak.scheduler_decisions(leaked)["prefill_kept_off_decode_graph"] == 2
    assert soak.engine_decisions(leaked)["uniform_decode"] == 3


def test_the_step_log_is_read_without_a_half_written_line(tmp_path: Path) -> None:
    (tmp_path / "1.jsonl").write_text(
        json.dumps(STEPS[0]) + "\n" + json.dumps(STEPS[2]) + "\n" + '{"widths": [4'
    )
    (tmp_path / "2.jsonl").write_text(json.dumps(STEPS[4]) + "\n")

    assert step_log.read_steps(tmp_path) == [STEPS[0], STEPS[2], STEPS[4]]


DECISIONS = "graphsafe_dispatch_decisions_total"
V1 = 'patch="v1-phase-dispatch"'
PAGE = f"""\
# HELP {DECISIONS} Dispatch decisions ...
# TYPE {DECISIONS} counter
{DECISIONS}{{decision="uniform_decode",dp_rank="0",{V1}}} 5.0
{DECISIONS}{{decision="uniform_decode",dp_rank="1",{V1}}} 2.0
{DECISIONS}{{decision="non_uniform",{V1}}} 7.0
{DECISIONS}{{decision="uniform_decode",patch="mrv2-phase-dispatch"}} 9.0
vllm:num_requests_running{{model_name="m"}} 0.0
"""


def test_a_metrics_page_gives_the_patch_decisions_summed_over_ranks() -> None:
    assert soak.scraped_decisions(PAGE) == {"uniform_decode": 7, "non_uniform": 7}


class _Metrics(BaseHTTPRequestHandler):
    statuses: Iterator[int]

    def do_GET(self) -> None:
        status = next(self.statuses)
        body = PAGE.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_scraper_counts_every_answer_and_keeps_each_error() -> None:
    handler = type("Handler", (_Metrics,), {"statuses": iter([200, 500, 200])})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ticks: list[int] = []

        def stop_after_two_ticks() -> dict[str, Any]:
            ticks.append(len(ticks))
            if len(ticks) == 2:  # one scrape now, the next a tick later
                scraper.stop.set()
            return {"tick": ticks[-1]}

        scraper = soak.Scraper(
            f"http://127.0.0.1:{server.server_address[1]}",
            sample=stop_after_two_ticks,
            interval_s=0.1,
        )
        scraper.start()
        scraper.join(timeout=30)
        scraper.finish()  # and one after the load
    finally:
        server.shutdown()
        server.server_close()
    record = scraper.record(2.0)

    assert record["scrapes"] == 3
    assert [sample for _, sample in scraper.samples] == [{"tick": 0}, {"tick": 1}]
    assert record["statuses"] == {"200": 2, "500": 1}
    assert record["errors"] == ["status 500"]
    assert record["last_decisions"] == {"uniform_decode": 7, "non_uniform": 7}


# -- the soak: goals and report -----------------------------------------------------


def _soak(**changes: Any) -> dict[str, Any]:
    counted = {"uniform_decode": 50, "prefill_kept_off_decode_graph": 4}
    counted["non_uniform"] = 30
    record: dict[str, Any] = {
        "requests": 100,
        "warm_up": 500,
        "warm_up_rounds": [
            {"requests": 250, "failed": 0.0, "growth": 0.08},
            {"requests": 250, "failed": 0.0, "growth": 0.004},
        ],
        "warm_up_settled": True,
        "warm_up_settled_growth": 0.01,
        "concurrency": 32,
        "output_tokens": 32,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 128,
        "prompt_kinds": {"decode_shaped": 40, "other": 60},
        "warm_up_failed": 0.0,
        "load": {
            "completed": 100.0,
            "failed": 0.0,
            "seconds": 30.0,
            "output_throughput": 300.0,
        },
        "decisions": {
            "steps": 84,
            "counted": dict(counted),
            "scheduler": dict(counted),
            "engine": dict(counted),
        },
        "resident_kib": {
            "after_warm_up": {
                "10": {"name": "python3.11", "kib": 1000},
                "11": {"name": "VLLM::EngineCor", "kib": 2000},
            },
            "at_end": {
                "10": {"name": "python3.11", "kib": 1010},
                "11": {"name": "VLLM::EngineCor", "kib": 2090},
            },
        },
        "metrics": {
            "seconds": 30.0,
            "scrapes": 31,
            "statuses": {"200": 31},
            "error_count": 0,
            "errors": [],
            "slowest_s": 0.02,
            "last_decisions": dict(counted),
        },
        "meta": {
            "command": "python bench/soak.py",
            "host": "test host",
            "started": "2026-01-02T00:00:00+0000",
            "wall_s": 60.0,
            "vllm": "0.32.0",
        },
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = record
        for key in parents:
            target = target[key]
        target[leaf] = value
    return record


def test_the_warm_up_ends_on_the_largest_growth_of_any_process() -> None:
    before = {"1": {"name": "a", "kib": 1000}, "2": {"name": "b", "kib": 2000}}
    after = {"1": {"name": "a", "kib": 1005}, "2": {"name": "b", "kib": 2100}}

    assert soak.largest_growth(before, after) == pytest.approx(0.05)
    assert soak.largest_growth(before, {"1": after["1"]}) == pytest.approx(0.005)
    assert soak.largest_growth(before, {}) == 0.0


def test_a_warm_up_that_did_not_settle_is_said_so() -> None:
    record = _soak(warm_up_settled=False)
    detail = summaries.soak_goals(record)["soak_resident_memory"]["detail"]

    assert "a warm-up of 500 requests in 2 rounds" in detail
    assert "not settled" in detail


def test_a_clean_soak_meets_every_goal() -> None:
    goals = summaries.soak_goals(_soak())

    assert {name: goal["met"] for name, goal in goals.items()} == {
        "soak_failed_requests": True,
        "soak_decision_counts": True,
        "soak_resident_memory": True,
        "soak_metrics_scrapes": True,
    }
    assert goals["soak_resident_memory"]["row"][1] == "+4.5% at most (2 processes)"


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"load__failed": 1.0, "load__completed": 99.0}, "soak_failed_requests"),
        ({"warm_up_failed": 1.0}, "soak_failed_requests"),
        ({"decisions__engine": {"uniform_decode": 51}}, "soak_decision_counts"),
        (
            {"resident_kib__at_end": {"10": {"name": "python3.11", "kib": 1051}}},
            "soak_resident_memory",
        ),
        ({"metrics__error_count": 1, "metrics__errors": ["x"]}, "soak_metrics_scrapes"),
        ({"metrics__statuses": {"200": 29}}, "soak_metrics_scrapes"),
        ({"metrics__last_decisions": {"uniform_decode": 49}}, "soak_metrics_scrapes"),
    ],
)
def test_each_soak_fault_misses_its_goal(change: dict[str, Any], missed: str) -> None:
    goals = summaries.soak_goals(_soak(**change))

    assert [name for name, goal in goals.items() if goal["met"] is False] == [missed]


def test_a_soak_without_a_decode_shaped_prompt_step_shows_too_little() -> None:
    counted = {"uniform_decode": 50, "non_uniform": 30}
    record = _soak(
        decisions__counted=counted,
        decisions__scheduler=counted,
        decisions__engine=counted,
        metrics__last_decisions=counted,
    )
    goal = summaries.soak_goals(record)["soak_decision_counts"]

    assert goal["met"] is None
    assert "no prompt step had a decode's shape" in goal["detail"]


def test_the_soak_file_beside_the_results_joins_the_table(tmp_path: Path) -> None:
    results = {
        "meta": {
            "mode": "full",
            "host": "test host",
            "command": "x",
            "wall_s": 1.0,
            "started": "2026-01-01T00:00:00+0000",
        },
        "goals": {},
    }
    soak_record = _soak()
    soak_record["goals"] = summaries.soak_goals(soak_record)
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "soak.json").write_text(json.dumps(soak_record))
    page = tmp_path / "benchmarks.md"
    begin, end = catalogue.markers("bench")
    page.write_text(f"{begin}\n{end}\n")

    arguments = ["--results", str(tmp_path / "results.json"), "--doc", str(page)]
    assert report.main(arguments) == report.EXIT_OK
    text = page.read_text()
    assert "The soak rows: from `bench/results/soak.json`" in text
    assert "soak, 100 requests at concurrency 32 (30 s): requests failed" in text
    assert "| 0 of 600 | 0 | met |" in text
    markdown = report.markdown(report.load_results(tmp_path / "results.json"))
    assert "### 5. Soak" in markdown
    assert "after a warm-up of 500 requests (rounds of 250 until no process's" in (
        markdown
    )
    assert "grew over 1% in one: +8.0%, +0.4%)" in markdown
    assert "| 11 (VLLM::EngineCor) | 2 | 2 | +4.5% |" in markdown
