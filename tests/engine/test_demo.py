"""The README's main job, end to end: build, serve, doctor, probe, statistics, stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def test_demo_runs_and_shows_prefill_kept_off_decode_graphs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GRAPHSAFE_D")}
    cache = Path(os.environ.get("VLLM_GRAPHSAFE_CACHE", tmp_path)).parent
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_graphsafe.cli.main",
            "demo",
            "--cache-dir",
            str(cache),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, output[-3000:] + result.stderr[-3000:]
    assert "a CPU runs no CUDA graphs" in output
    assert "every fix this vLLM needs is active" in output
    kept = [line for line in output.splitlines() if line.startswith("The plugin kept")]
    assert kept and not kept[0].startswith("The plugin kept 0 "), output[-2000:]
    assert "server stopped" in output
