"""The end-to-end benchmark's client, against the probe's fake vLLM server."""

from __future__ import annotations

import httpx
import pytest

from bench import end_to_end
from tests.unit.probe.fake_server import FakeConfig, RunningFakeServer


def test_a_turn_counts_every_streamed_token_and_a_first_token_time() -> None:
    prompts = [[20, 21, 22, 23], [30] * 12, [40] * 4]
    with RunningFakeServer(FakeConfig(stream_token_delay_s=0.001)) as server:
        turn = end_to_end.run_turn(server.url, "fake/hybrid-tiny", prompts, 8)

    assert turn["output_tokens"] == 3 * 8
    assert turn["tokens_per_s"] == pytest.approx(24 / turn["wall_s"])
    assert 0 < turn["mean_ttft_ms"] < 1e3 * turn["wall_s"]


def test_a_server_error_stops_the_turn() -> None:
    config = FakeConfig(completion_status=500)
    with RunningFakeServer(config) as server, pytest.raises(httpx.HTTPStatusError):
        end_to_end.run_turn(server.url, "fake/hybrid-tiny", [[20, 21]], 4)
