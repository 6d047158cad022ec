"""A real vLLM engine on CPU, ngram speculation K=3, a 4-token prompt.

With the plugin no step that still holds prompt tokens reaches the dispatcher
as uniform decode, and every pure-decode step of the decode shape does; with
the plugin disabled the 4-token prefill step does (the bug, on the real
engine). The generated tokens are the same either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.serving import run_engine_script

SCRIPT = Path(__file__).with_name("dispatch_steps.py")


@pytest.fixture(scope="module")
def runs(tiny_model: Path) -> dict[str, Any]:
    return {
        "on": run_engine_script(SCRIPT, tiny_model, plugin=True),
        "off": run_engine_script(SCRIPT, tiny_model, plugin=False),
    }


def misdispatched_prefills(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if s["holds_prefill_rows"] and s["uniform_decode"]]


def test_prefill_steps_stay_off_the_decode_graph(runs: dict[str, Any]) -> None:
    steps = runs["on"]["steps"]
    boundary_prefills = [
        s for s in steps if s["holds_prefill_rows"] and s["decode_shape"]
    ]
    assert boundary_prefills, "the 4-token prompt never formed a decode-shaped step"
    assert misdispatched_prefills(steps) == []


def test_pure_decode_steps_keep_the_decode_graph(runs: dict[str, Any]) -> None:
    decode_steps = [
        s
        for s in runs["on"]["steps"]
        if s["decode_shape"] and not s["holds_prefill_rows"]
    ]
    assert decode_steps, "no pure speculative-decode step of width 4 ran"
    assert all(s["uniform_decode"] for s in decode_steps)


def test_without_the_plugin_the_prefill_step_is_misdispatched(
    runs: dict[str, Any],
) -> None:
    assert misdispatched_prefills(runs["off"]["steps"])


def test_generated_tokens_are_identical_with_and_without(runs: dict[str, Any]) -> None:
    assert runs["on"]["token_ids"] == runs["off"]["token_ids"]
