"""A real engine whose input batch drifted keeps generating as unpatched vLLM does.

In-process vLLM on CPU with the tiny model and ngram speculation (K=3):
the runner's ``num_decode_draft_tokens`` and the input batch's
``num_prompt_tokens`` are made unreadable to the plugin only, as a release
that renamed them would be. The V1 phase rule fails open on the first
uniform step: the patch reads ``failed`` naming what it was reading, and the
tokens equal those of the same engine with the plugin switched off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.scripts import run_python

SCRIPT = Path(__file__).with_name("drift_steps.py")


def run(model_dir: Path, mode: str, plugin: bool) -> dict[str, Any]:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for name in ("VLLM_GRAPHSAFE_DISABLE", "GRAPHSAFE_DISABLE"):
        env.pop(name, None)
    if not plugin:
        env["GRAPHSAFE_DISABLE"] = env["VLLM_GRAPHSAFE_DISABLE"] = "all"
    result = run_python([str(SCRIPT), str(model_dir), mode], env, timeout=600)
    record: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    record["log"] = result.stdout + result.stderr
    return record


def test_drifted_input_batch_generates_what_unpatched_vllm_does(
    tiny_model: Path,
) -> None:
    drifted = run(tiny_model, "drift", plugin=True)
    unpatched = run(tiny_model, "plain", plugin=False)

    assert drifted["token_ids"] == unpatched["token_ids"]
    assert drifted["state"] == "failed"
    assert "num_decode_draft_tokens" in drifted["reason"]
    warnings = [
        line for line in drifted["log"].splitlines() if "failed at run time" in line
    ]
    assert len(warnings) == 1, warnings
    assert "v1-phase-dispatch" in warnings[0]
    assert "num_decode_draft_tokens" in warnings[0]
