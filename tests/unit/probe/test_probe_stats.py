"""The probe shows the dispatch statistics the server's processes wrote."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.probe.fake_server import (
    STATS_EVENT,
    STATS_PATCH,
    STATS_PID,
    FakeConfig,
    RunningFakeServer,
)
from tests.unit.probe.test_probe_fake_server import probe_fake, run_probe
from vllm_graphsafe.probe import errors


@contextlib.contextmanager
def opens_of(path: Path, note: Callable[[], int]) -> Iterator[list[int]]:
    """``note()`` at each time this process opens ``path``, while the block runs.

    An audit hook sees every ``open``, whichever code does it; it cannot be
    removed, so it goes quiet when the block ends.
    """
    watched = os.fspath(path)
    noted: list[int] = []
    watching = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        opened = args[0] if event == "open" and args else None
        if watching[0] and isinstance(opened, str | Path) and str(opened) == watched:
            noted.append(note())

    sys.addaudithook(hook)
    try:
        yield noted
    finally:
        watching[0] = False


def test_probe_reports_dispatch_statistics(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stats_dir = tmp_path / "stats"
    stats_dir.mkdir()
    for pid, kept in ((101, 2), (102, 3)):
        record = {
            "pid": pid,
            "patches": {"v1-phase-dispatch": "applied"},
            "counts": {"v1-phase-dispatch": {"prefill_kept_off_decode_graph": kept}},
        }
        (stats_dir / f"{pid}.json").write_text(json.dumps(record))

    result, _ = probe_fake(capsys, tmp_path, None, "--stats-dir", str(stats_dir))

    assert result.status == errors.EXIT_OK
    assert result.report is not None
    stats = result.report["dispatch_stats"]
    assert stats["processes"] == 2
    kept_off = stats["counts"]["v1-phase-dispatch"]["prefill_kept_off_decode_graph"]
    assert kept_off == 5
    assert "prefill_kept_off_decode_graph=5" in result.stderr


def test_statistics_are_checked_before_any_request_and_read_once_after_the_last(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stats_dir = tmp_path / "stats"
    stats_dir.mkdir()
    with RunningFakeServer(FakeConfig(stats_dir=stats_dir)) as server:
        record = stats_dir / f"{STATS_PID}.json"
        with opens_of(record, note=lambda: server.log.count) as requests_at_open:
            result = run_probe(
                capsys, tmp_path, server.url, "--stats-dir", str(stats_dir)
            )

    assert result.status == errors.EXIT_OK, result.stderr
    # Once to refuse a wrong directory before any request, once for the counts.
    assert requests_at_open == [0, server.log.count]
    completions = server.log.requests.count(("POST", "/v1/completions"))
    assert completions > 0
    assert result.report is not None
    counts = result.report["dispatch_stats"]["counts"]
    assert counts == {STATS_PATCH: {STATS_EVENT: completions}}
    assert f"{STATS_EVENT}={completions}" in result.stderr


def test_a_probe_that_ended_early_shows_no_statistics(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stats_dir = tmp_path / "stats"
    stats_dir.mkdir()
    with RunningFakeServer(FakeConfig(stats_dir=stats_dir)) as server:
        result = run_probe(
            capsys,
            tmp_path,
            server.url,
            "--stats-dir",
            str(stats_dir),
            "--model",
            "not-the-served-one",
        )
    assert result.status == errors.EXIT_MODEL_MISMATCH, result.stderr
    assert "patch states in" not in result.stderr + result.stdout
    assert "dispatch decisions" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
