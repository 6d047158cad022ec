"""The collector behind ``/metrics``: every process's record, summed at scrape time."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families

from vllm_graphsafe import metrics, plugin, vllm_layout
from vllm_graphsafe.counts import (
    ROLE_API_SERVER,
    ROLE_ENGINE_CORE,
    ROLE_MAIN,
    ROLE_WORKER,
    roles,
)

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


# -- several API server processes (``--api-server-count`` above 1) ---------------
# There /metrics comes from a fresh registry with one MultiProcessCollector per
# scrape (prometheus-fastapi-instrumentator; vLLM's get_prometheus_registry alike).


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Module state as in a process that has not loaded the plugin; the
    collector class put back as it was after the test."""
    monkeypatch.setattr(plugin, "_prepared_in_pid", None)
    monkeypatch.setattr(plugin, "_prepared_directory", None)
    monkeypatch.setattr(metrics, "_warned", False)
    collector_class = multiprocess.MultiProcessCollector
    monkeypatch.setattr(collector_class, "collect", collector_class.collect)


def served_per_scrape(prometheus_dir: Path) -> prometheus_client.CollectorRegistry:
    """The registry one scrape is answered from, built as the instrumentator does."""
    registry = prometheus_client.CollectorRegistry()
    # prometheus_client leaves these classes unannotated.
    collector: Any = multiprocess.MultiProcessCollector
    collector(registry, path=str(prometheus_dir))
    return registry


def samples_of(
    registry: prometheus_client.CollectorRegistry,
) -> list[tuple[str, dict[str, str], float]]:
    text = prometheus_client.generate_latest(registry).decode()
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def kept_off(registry: prometheus_client.CollectorRegistry) -> float:
    return sum(
        value
        for name, labels, value in samples_of(registry)
        if name == "graphsafe_dispatch_decisions_total" and labels["decision"] == KEPT
    )


def four_processes(directory: Path) -> None:
    write_records(
        directory,
        [
            record(10, 1, "MainProcess", None),
            record(11, 10, "ApiServer_0", None),
            record(20, 10, "EngineCore", None),
            record(30, 20, "VllmWorker-0", None, kept=7),
        ],
    )


def vllm_counter(prometheus_dir: Path) -> None:
    """A counter vLLM counted in multi-process mode (one mmap file per process)."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    mmaped_dict: Any = MmapedDict  # unannotated in prometheus_client
    values = mmaped_dict(str(prometheus_dir / "counter_4242.db"))
    key = mmap_key("vllm:requests", "vllm:requests_total", [], [], "Requests.")
    values.write_value(key, 5.0, 0.0)
    values.close()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    records, prometheus_dir = tmp_path / "records", tmp_path / "prometheus"
    records.mkdir(mode=0o700)
    prometheus_dir.mkdir()
    four_processes(records)
    vllm_counter(prometheus_dir)
    return records, prometheus_dir


@pytest.mark.usefixtures("fresh_state")
def test_each_scrape_of_a_multiprocess_registry_has_the_counts_once(
    dirs: tuple[Path, Path],
) -> None:
    records, prometheus_dir = dirs
    assert metrics.serve_with_multiprocess_collector(records)
    assert metrics.serve_with_multiprocess_collector(records)  # a second load
    for _ in range(3):  # a new registry per scrape, each read afresh
        registry = served_per_scrape(prometheus_dir)
        assert kept_off(registry) == 7
        samples = samples_of(registry)
        assert ("vllm:requests_total", {}, 5.0) in samples  # vLLM's own, unchanged
        applied = [
            value
            for name, labels, value in samples
            if name == "graphsafe_patch_state"
            and labels == {"patch": "v1-phase-dispatch", "state": "applied"}
        ]
        assert applied == [4]
    write_records(records, [record(31, 20, "VllmWorker-1", None, kept=2)])
    assert kept_off(served_per_scrape(prometheus_dir)) == 9  # read at scrape time


@pytest.mark.usefixtures("fresh_state")
def test_without_the_hook_a_multiprocess_registry_lacks_the_plugin(
    dirs: tuple[Path, Path],
) -> None:
    """The gap the hook fills: the default registry's collector is not served."""
    _, prometheus_dir = dirs
    names = {name for name, _, _ in samples_of(served_per_scrape(prometheus_dir))}
    assert "vllm:requests_total" in names
    assert not any(name.startswith("graphsafe_") for name in names)


@pytest.mark.usefixtures("fresh_state")
def test_an_unreadable_directory_leaves_vllm_metrics_and_warns_once(
    dirs: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    records, prometheus_dir = dirs
    metrics.serve_with_multiprocess_collector(records)

    def broken(directory: Path) -> list[dict[str, Any]]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(metrics, "read_records_leniently", broken)
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        for _ in range(2):
            samples = samples_of(served_per_scrape(prometheus_dir))
            assert ("vllm:requests_total", {}, 5.0) in samples
            assert not any(name.startswith("graphsafe_") for name, _, _ in samples)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "PermissionError" in warnings[0].getMessage()


@pytest.mark.usefixtures("fresh_state")
def test_a_prometheus_client_without_the_class_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(multiprocess, "MultiProcessCollector")
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        assert not metrics.serve_with_multiprocess_collector(tmp_path)
        assert not metrics.serve_with_multiprocess_collector(tmp_path)
    assert len(caplog.records) == 1


@pytest.mark.usefixtures("fresh_state")
def test_an_api_server_vllm_spawned_serves_the_directory_it_inherited(
    dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, prometheus_dir = dirs
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("GRAPHSAFE_METRICS_DIR", str(records))
    monkeypatch.setattr(roles, "process_role", lambda name: ROLE_API_SERVER)
    monkeypatch.setattr(multiprocessing.current_process(), "name", "ApiServer_1")
    assert not roles.is_root_process()
    assert plugin.prepare_metrics_directory() == records
    assert list(temp.iterdir()) == []  # no directory of its own
    assert os.environ["GRAPHSAFE_METRICS_DIR"] == str(records)
    assert kept_off(served_per_scrape(prometheus_dir)) == 7


@pytest.mark.usefixtures("fresh_state")
def test_the_real_vllm_registry_in_multiprocess_mode_has_the_counts(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the installed vLLM: the function its /metrics mount calls."""
    vllm_prometheus = pytest.importorskip(vllm_layout.PROMETHEUS)
    records, prometheus_dir = dirs
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prometheus_dir))
    assert metrics.serve_with_multiprocess_collector(records)
    registry = vllm_prometheus.get_prometheus_registry()
    assert registry is not prometheus_client.REGISTRY
    assert kept_off(registry) == 7


@pytest.mark.usefixtures("fresh_state")
@pytest.mark.parametrize(
    ("name", "role", "joins"),
    [
        ("EngineCore", ROLE_ENGINE_CORE, True),
        ("VllmWorker-0", ROLE_WORKER, True),
        # vLLM's model-inspection subprocess: it loads the plugin, serves nothing.
        ("MainProcess", ROLE_MAIN, False),
    ],
)
def test_only_vllms_serving_processes_join_the_inherited_directory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    role: str,
    joins: bool,
) -> None:
    inherited = tmp_path / "records"
    inherited.mkdir(mode=0o700)
    monkeypatch.setenv("GRAPHSAFE_METRICS_DIR", str(inherited))
    monkeypatch.setattr(roles, "process_role", lambda _: role)
    monkeypatch.setattr(multiprocessing.current_process(), "name", name)
    assert plugin.prepare_metrics_directory() == (inherited if joins else None)


def test_the_directory_is_removed_though_a_late_record_lands_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine process signalled with the API server writes its last record
    while the directory is being removed: the first removal leaves it there."""
    directory = tmp_path / "graphsafe-metrics-x"
    directory.mkdir(mode=0o700)
    (directory / "1.json").write_text("{}")
    real_rmtree = shutil.rmtree
    calls = []

    def racing_rmtree(path: Path, ignore_errors: bool = False) -> None:
        calls.append(path)
        if len(calls) == 1:
            (Path(path) / "2.json").write_text("{}")  # lands before the rmdir
            with contextlib.suppress(OSError):
                os.unlink(Path(path) / "1.json")
            return
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", racing_rmtree)
    metrics.remove_directory(directory, os.getpid())
    assert not directory.exists()
    assert len(calls) == 2


def test_the_replay_guards_fallbacks_are_a_counter_with_its_labels(
    tmp_path: Path,
) -> None:
    """The guard's counts reach ``/metrics`` like any fix's: its id as the
    ``patch`` label, its events as ``decision``, summed over processes."""
    from vllm_graphsafe.fixes.replay_guard import FELL_BACK, FIX, REPLAYED

    guard = {FIX.id: {FELL_BACK: 2, REPLAYED: 40}}
    items = [record(30, 20, "VllmWorker-0", None), record(31, 20, "VllmWorker-1", None)]
    for item in items:
        item["patches"] = {**PATCHES, FIX.id: "applied"}
        item["counts"] = guard
    write_records(tmp_path, items)
    samples = scrape(tmp_path)
    name = "graphsafe_dispatch_decisions_total"
    assert samples[(name, (("decision", FELL_BACK), ("patch", FIX.id)))] == 4
    assert samples[(name, (("decision", REPLAYED), ("patch", FIX.id)))] == 80
    state = ("graphsafe_patch_state", (("patch", FIX.id), ("state", "applied")))
    assert samples[state] == 2
