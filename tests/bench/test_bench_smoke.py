"""The benchmarks' vLLM-free parts, in the ordinary test run.

CI also runs ``bench/run.py --quick``, which starts vLLM; these checks keep
the trace, the summaries, the markdown and the plot from rotting where vLLM
is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import full_graph_coverage, report

SIZES = ("1", "256")


def test_coverage_trace_exercises_the_hazard_and_the_phase_rule_meets_goals() -> None:
    result = full_graph_coverage.run(steps_per_width=150)

    assert result["shape_collisions"] > 0
    assert result["prompt_as_decode_pct"]["shape"] > 0
    assert result["goals_met"] == {
        "decode_kept_100pct": True,
        "prompt_as_decode_0pct": True,
    }
    assert result["v1_mrv2_disagreements"] == 0


def test_coverage_trace_is_deterministic() -> None:
    first = full_graph_coverage.run(seed=3, steps_per_width=60)
    second = full_graph_coverage.run(seed=3, steps_per_width=60)

    assert first == second


def _worker(cases: dict[str, float]) -> dict[str, Any]:
    """A worker's raw output: seconds per call, five rounds per size."""
    return {
        "sizes": [int(size) for size in SIZES],
        "rounds": 5,
        "target_ms": 2.0,
        "table_rows": 1024,
        "decode_query_len": 4,
        "stale_rows": 64,
        "seconds_per_call": {
            name: {
                size: [base * int(size) ** 0.1 * (1 + i / 100) for i in range(5)]
                for size in SIZES
            }
            for name, base in cases.items()
        },
    }


def _plugin_run(version: str, register_ms: float) -> dict[str, Any]:
    return {
        "vllm": version,
        "plugin": {
            "context": "process",
            "bytecode": "cached",
            "register_ms": register_ms,
            "modules_imported": 30,
            "states": {"v1-phase-dispatch": "applied"},
        },
        "runner_imports": {
            "vllm.v1.worker.gpu_model_runner": {"added_ms": 3.0},
            "vllm.v1.worker.gpu.model_runner": {"added_ms": 0.3},
        },
    }


def _results() -> dict[str, Any]:
    workers = {
        "0.27.1": _worker(
            {"v1.shape": 2e-6, "v1.phase": 3e-6, "mrv2.shape": 3e-6, "mrv2.phase": 4e-6}
        ),
        "0.32.0": _worker(
            {
                "v1.shape": 2e-6,
                "v1.phase": 5e-6,
                "mrv2.shape": 3e-6,
                "mrv2.phase": 4e-6,
                "mrv2.native": 9e-5,
            }
        ),
    }
    runs = [_plugin_run("0.27.1", 25.0), _plugin_run("0.27.1", 27.0)]
    turn = {"tokens_per_s": 800.0, "mean_ttft_ms": 50.0}
    e2e = {
        "prompt_lengths": [4, 700],
        "max_tokens": 16,
        "concurrency": 2,
        "repetitions": 4,
        "turns": {"on": [turn] * 4, "off": [turn] * 4},
        "dispatch": {"on": {"counts": {"v1-phase-dispatch": {"uniform_decode": 3}}}},
    }
    return {
        "meta": {"mode": "test", "host": "test host", "command": "x", "wall_s": 1.0},
        "dispatch_cost": {
            "workers": workers,
            "summary": {v: report.summarize_dispatch(w) for v, w in workers.items()},
        },
        "plugin_cost": {"runs": runs, "summary": report.summarize_plugin(runs)},
        "end_to_end": {"raw": e2e, "summary": report.summarize_end_to_end(e2e)},
        "full_graph_coverage": full_graph_coverage.run(steps_per_width=60),
    }


def test_summaries_goals_and_markdown() -> None:
    results = _results()
    results["goals"] = goals = report.check_goals(results)

    assert goals["v1_phase_added_us_at_256 (0.27.1)"]["met"] is True
    assert goals["v1_phase_added_us_at_256 (0.32.0)"]["met"] is False
    assert goals["mrv2_phase_not_slower_than_native (0.32.0)"]["met"] is True
    # The MRV2 patch stays inert where the release classifies by phase itself.
    assert "mrv2_phase_added_us_at_256 (0.32.0)" not in goals
    assert goals["mrv2_phase_added_us_at_256 (0.27.1)"]["met"] is True
    assert goals["plugin_cost_ms (0.27.1/process/cached)"]["met"] is True
    assert goals["end_to_end_throughput_ratio"]["met"] is True
    markdown = report.markdown(results)
    for heading in ("### 1.", "### 2.", "### 3.", "### 4.", "### Goals"):
        assert heading in markdown


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from bench import plot

    path = tmp_path / "dispatch_cost.png"
    plot.draw(_results(), path)

    assert path.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("values", "interval"),
    [
        (list(range(1, 9)), (1, 8)),
        (list(range(10, 0, -1)), (2, 9)),
        (list(range(1, 17)), (4, 13)),
        (list(range(1, 33)), (10, 23)),
        (list(range(1, 101)), (40, 61)),
    ],
)
def test_median_interval_takes_the_binomial_order_statistics(
    values: list[int], interval: tuple[int, int]
) -> None:
    from bench.timing import median_interval

    assert median_interval(values) == interval


def _e2e_goal(on: list[float], off: list[float]) -> dict[str, Any]:
    turns = {
        label: [{"tokens_per_s": v, "mean_ttft_ms": 10.0} for v in values]
        for label, values in (("on", on), ("off", off))
    }
    raw = {"repetitions": len(on), "turns": turns}
    results = {"end_to_end": {"raw": raw, "summary": report.summarize_end_to_end(raw)}}
    return report.check_goals(results)["end_to_end_throughput_ratio"]


def test_a_throughput_ratio_below_the_floor_within_noise_is_not_resolved() -> None:
    off = [1000.0] * 16
    noisy = [900.0, 1100.0] * 7 + [960.0, 980.0]
    result = _e2e_goal(noisy, off)
    assert result["met"] is None
    assert result["verdict"] == "**not resolved**"
    assert "**not resolved**" in "\n".join(report.goals_markdown({"e2e": result}))


def test_a_throughput_ratio_clearly_below_the_floor_is_missed() -> None:
    off = [1000.0] * 16
    slower = [960.0 + index for index in range(16)]
    assert _e2e_goal(slower, off)["met"] is False
    assert _e2e_goal([1000.0 + index for index in range(16)], off)["met"] is True
