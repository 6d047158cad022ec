"""The emulator corrupts exactly the hazardous steps of a real engine, nothing else.

One in-process engine with the emulator and the plugin disabled, one without
the emulator (same workload). The step ground truth comes from the script's
own wrappers (the scheduler's view of prompt progress, the decision handed to
the dispatcher), never from the emulator.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import last_answer

SCRIPT = Path(__file__).parent / "emulator" / "engine_steps.py"
SWITCHES = (
    "GRAPHSAFE_DISABLE",
    "VLLM_GRAPHSAFE_DISABLE",
    "GRAPHSAFE_EMULATE_GRAPH_HAZARD",
)


def _run(model_dir: Path, emulate: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", GRAPHSAFE_DISABLE="all")
    if emulate:
        env["GRAPHSAFE_EMULATE_GRAPH_HAZARD"] = "1"
    return last_answer([str(SCRIPT), str(model_dir)], env, timeout=900)


@pytest.fixture(scope="module")
def runs(tiny_model: Path) -> dict[bool, dict[str, Any]]:
    return {emulate: _run(tiny_model, emulate) for emulate in (True, False)}


def _external(request_id: str, answers: dict[str, Any]) -> str:
    """The answer label of an engine-internal request id (``<external>-<suffix>``)."""
    for label, answer in answers.items():
        external = answer["request_id"]
        if request_id == external or request_id.rsplit("-", 1)[0] == external:
            return label
    raise AssertionError(f"no answer for request {request_id}")


def _hazards(steps: list[dict[str, Any]]) -> list[dict[str, list[str]]]:
    return [
        {"scheduled": step["scheduled"], "prefill_rows": step["prefill_rows"]}
        for step in steps
        if step["uniform_decode"] and step["prefill_rows"]
    ]


def test_corrupts_exactly_the_hazardous_steps(
    runs: dict[bool, dict[str, Any]],
) -> None:
    emulated, stock = runs[True], runs[False]
    truth = _hazards(emulated["steps"])
    record = emulated["emulator"]
    assert record is not None, "the emulator did not load"
    print(
        f"{len(emulated['steps'])} real steps, "
        f"{record['uniform_decode_steps']} dispatched as uniform decode, "
        f"{len(truth)} hazardous: {truth}"
    )
    assert truth, "the workload made no hazardous step: it proves nothing"
    assert record["hazards"] == truth
    assert record["real_steps"] == len(emulated["steps"])
    assert record["uniform_decode_steps"] == sum(
        bool(step["uniform_decode"]) for step in emulated["steps"]
    )

    answers = emulated["answers"]
    poisoned = {
        _external(req_id, answers) for step in truth for req_id in step["scheduled"]
    }
    vocab = emulated["vocab_size"]
    for label, answer in answers.items():
        control = stock["answers"][label]["token_ids"]
        assert all(token < vocab for token in control), (label, control)
        if label in poisoned:
            assert answer["token_ids"] == [vocab] * len(control), label
        else:
            assert answer["token_ids"] == control, label
    # What the reference table predicts for these prompts.
    assert poisoned == {
        "fresh_k_plus_1/0",
        "boundary_warm/0",
        "fresh_pair/0",
        "fresh_pair/1",
    }


def test_decode_only_workload_is_byte_identical(
    runs: dict[bool, dict[str, Any]],
) -> None:
    emulated, stock = runs[True], runs[False]
    decode_steps = emulated["steps"][emulated["decode_only_from"] :]
    genuine = [step for step in decode_steps if step["uniform_decode"]]
    print(f"decode-only: {len(decode_steps)} steps, {len(genuine)} uniform decode")
    assert len(genuine) >= 5, "too few genuine uniform-decode steps to matter"
    assert not _hazards(decode_steps)
    for label, answer in emulated["answers"].items():
        if label.startswith("decode_only/"):
            control = stock["answers"][label]
            assert answer["token_ids"] == control["token_ids"], label
            assert answer["text"] == control["text"], label
