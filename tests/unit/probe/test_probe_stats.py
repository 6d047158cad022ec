"""The probe shows the dispatch statistics the server's processes wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.probe.test_probe_fake_server import probe_fake
from vllm_graphsafe.probe import errors


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
