"""The GPU kit's verdicts and table, from configurations' results written here."""

from __future__ import annotations

from typing import Any

from tests.unit.gpu_kit.kit_modules import load

report = load("report")

ORACLE = {"a/0": [1, 2, 3], "b/0": [4, 5, 6], "c/0": [7, 8]}


def ran(
    answers: dict[str, list[int]], boundary: int = 2, **counts: int
) -> dict[str, Any]:
    per_fix: dict[str, dict[str, int]] = {}
    for key, value in counts.items():
        fix, decision = key.split("__")
        per_fix.setdefault(fix.replace("_", "-"), {})[decision] = value
    return {
        "status": "ran",
        "answers": answers,
        "steps": {"boundary": boundary},
        "counts": per_fix,
        "wall_s": 40,
    }


def by_check(checks: list[dict[str, Any]]) -> dict[str, bool | None]:
    return {c["check"]: c["passed"] for c in checks}


def test_differences_name_the_first_differing_position_or_a_missing_answer() -> None:
    answers = {"a/0": [1, 2, 3], "b/0": [4, 9, 6]}

    assert report.differences(ORACLE, answers) == {"b/0": 1, "c/0": None}
    assert report.differences(ORACLE, {**ORACLE, "a/0": [1, 2]}) == {"a/0": 2}


def test_the_fix_passes_when_off_differs_and_on_and_guard_equal_with_their_counts() -> (
    None
):
    results = {
        "eager": ran(ORACLE),
        "off": ran({**ORACLE, "b/0": [4, 0, 0]}),
        "on": ran(ORACLE, v1_phase_dispatch__prefill_kept_off_decode_graph=2),
        "guard": ran(ORACLE, replay_guard__decode_graph_fallback=2),
    }

    checks = report.verdicts(3, results)

    assert all(c["passed"] for c in checks), checks
    assert "1 of 3 differ (b/0)" in checks[0]["detail"]


def test_a_wrong_answer_or_a_count_off_the_boundary_steps_fails() -> None:
    results = {
        "eager": ran(ORACLE),
        "off": ran(ORACLE),
        "on": ran(
            {**ORACLE, "c/0": [7, 7]},
            v1_phase_dispatch__prefill_kept_off_decode_graph=2,
        ),
        "guard": ran(ORACLE, replay_guard__decode_graph_fallback=1),
    }

    counted = "prefill_kept_off_decode_graph equals the boundary steps"
    assert by_check(report.verdicts(3, results)) == {
        "off: some request differs from the oracle": False,
        "on: every request equals the oracle": False,
        f"on: v1-phase-dispatch {counted}": True,
        "guard: every request equals the oracle": True,
        "guard: replay-guard decode_graph_fallback equals the boundary steps": False,
    }


def test_nothing_is_judged_without_the_oracle_or_without_a_boundary_step() -> None:
    missing_oracle = {
        "eager": {"status": "stopped at the time limit"},
        "on": ran(ORACLE),
    }
    no_boundary = {"eager": ran(ORACLE), "off": ran(ORACLE, boundary=0)}

    assert {c["passed"] for c in report.verdicts(0, missing_oracle)} == {None}
    assert (
        by_check(report.verdicts(0, no_boundary))[
            "off: some request differs from the oracle"
        ]
        is None
    )


def test_the_table_shows_each_configuration_and_the_throughput_ratio() -> None:
    tput = {
        "status": "ran",
        "runs": [900.0, 1000.0, 1100.0],
        "tokens_per_s": 1000.0,
        "answers": {"x": [1]},
    }
    hit = {"prefix_tail/k_plus_1": 272}
    summary = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "vllm": "0.24.0",
        "torch": "2.11.0+cu130",
        "dtype": "float32",
        "configs": {
            "k3": {
                "eager": {**ran(ORACLE), "block_size": 272, "cached": hit},
                "off": ran({"a/0": [1, 2, 0]}),
                "on": {"status": "stopped at the time limit", "wall_s": 90},
            }
        },
        "verdicts": [
            {"k": 3, "check": "on: x", "passed": None, "detail": "not judged"}
        ],
        "throughput": [{"k": 3, "off": tput, "on": {**tput, "tokens_per_s": 980.0}}],
    }

    text = report.table(summary)

    assert "| 3 | eager (oracle) | yes | (oracle) | 2 |" in text
    assert "| 3 | FULL decode graphs, plugin off | yes | 0/3 | 2 |" in text
    assert "| 3 | FULL decode graphs, plugin on | stopped at the time limit |" in text
    assert "- K=3 NOT JUDGED: on: x (not judged)" in text
    assert "on/off = 0.980" in text and "same tokens" in text
    assert "block size 272; prefix_tail/k_plus_1 found 272 tokens in the prefix" in text


def test_the_summary_keys_each_engine_by_k_and_configuration() -> None:
    tput = {"status": "ran", "runs": [1.0], "tokens_per_s": 1.0, "answers": {}}
    results = {
        (3, "eager"): {**ran(ORACLE), "gpu": "NVIDIA H200", "vllm": "0.24.0"},
        (3, "on"): ran(ORACLE, v1_phase_dispatch__prefill_kept_off_decode_graph=2),
        (3, "tput-off"): tput,
        (3, "tput-on"): tput,
    }

    summary = report.summarize(results, [3, 0], "float32")

    assert (summary["gpu"], summary["vllm"], summary["dtype"]) == (
        "NVIDIA H200",
        "0.24.0",
        "float32",
    )
    assert summary["configs"]["k0"]["eager"] == {"status": "not run"}
    assert summary["configs"]["k3"]["off"] == {"status": "not run"}
    assert [t["k"] for t in summary["throughput"]] == [3]
    assert {c["k"] for c in summary["verdicts"]} == {0, 3}
