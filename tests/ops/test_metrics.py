"""The collector behind ``/metrics``: every process's record, summed at scrape time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from vllm_graphsafe import metrics

KEPT = "prefill_kept_off_decode_graph"
PATCHES = {"v1-phase-dispatch": "applied", "mrv2-phase-dispatch": "native"}


def record(
    pid: int, ppid: int, name: str, dp_rank: int | None, kept: int = 0
) -> dict[str, Any]:
    counts = {"v1-phase-dispatch": {KEPT: kept, "uniform_decode": 2 * kept}}
    return {
        "pid": pid,
        "ppid": ppid,
        "process_name": name,
        "dp_rank": dp_rank,
        "patches": PATCHES,
        "counts": counts if kept else {},
    }


def scrape(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = prometheus_client.CollectorRegistry()
    registry.register(metrics.DispatchCollector(directory))
    text = prometheus_client.generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def write_records(directory: Path, records: list[dict[str, Any]]) -> None:
    for item in records:
        (directory / f"{item['pid']}.json").write_text(json.dumps(item))


def test_counts_of_every_process_are_summed(tmp_path: Path) -> None:
    write_records(
        tmp_path,
        [
            record(10, 1, "MainProcess", None),
            record(20, 10, "EngineCore", None),
            record(30, 20, "VllmWorker-0", None, kept=3),
            record(31, 20, "VllmWorker-1", None, kept=4),
        ],
    )
    samples = scrape(tmp_path)
    kept = samples[
        (
            "graphsafe_dispatch_decisions_total",
            (("decision", KEPT), ("patch", "v1-phase-dispatch")),
        )
    ]
    assert kept == 7
    applied = (
        "graphsafe_patch_state",
        (("patch", "v1-phase-dispatch"), ("state", "applied")),
    )
    failed = (
        "graphsafe_patch_state",
        (("patch", "v1-phase-dispatch"), ("state", "failed")),
    )
    assert samples[applied] == 4
    assert samples[failed] == 0  # every state is present, so alerts need no absent()
    assert not any(("dp_rank", "0") in labels for _, labels in samples)


def test_the_dp_rank_is_a_label_where_there_are_several(tmp_path: Path) -> None:
    write_records(
        tmp_path,
        [
            record(10, 1, "MainProcess", None),
            record(20, 10, "EngineCore_DP0", 0),
            record(21, 10, "EngineCore_DP1", 1),
            record(30, 20, "VllmWorker-0", None, kept=3),  # its rank: its engine core's
            record(31, 21, "VllmWorker-0", None, kept=5),
        ],
    )
    samples = scrape(tmp_path)
    name = "graphsafe_dispatch_decisions_total"
    for rank, expected in (("0", 3), ("1", 5)):
        labels = (("decision", KEPT), ("dp_rank", rank), ("patch", "v1-phase-dispatch"))
        assert samples[(name, labels)] == expected


def test_unreadable_records_never_break_a_scrape(tmp_path: Path) -> None:
    write_records(tmp_path, [record(30, 20, "VllmWorker-0", None, kept=2)])
    (tmp_path / "99.json").write_text("{half a rec")
    (tmp_path / "98.json").write_text("[]")
    samples = scrape(tmp_path)
    labels = (("decision", KEPT), ("patch", "v1-phase-dispatch"))
    assert samples[("graphsafe_dispatch_decisions_total", labels)] == 2


def test_the_example_alert_names_a_metric_that_exists() -> None:
    assert metrics.PATCH_STATE in metrics.EXAMPLE_ALERT
    assert 'state="failed"' in metrics.EXAMPLE_ALERT
