"""A real vLLM engine on CPU: the rows a prompt-length rule misreads.

K=3 speculation, prefill chunks of at most K+1 tokens, a 10-block cache
(``row_phase_steps.py``). The ground truth is each step's rows as the
scheduler handed them over: a request past its prompt that schedules K+1
tokens without drafts re-computes output tokens after preemption (a prefill
to the attention metadata builders); a request one token short of its prompt
that schedules K+1 tokens with K drafts is a padded prompt tail (a decode to
them). With the plugin such a re-prefill step never reaches the dispatcher as
uniform decode and a padded tail does; with the plugin off a re-prefill step
does (the bug), and with the prompt-length rule in its place the padded tail
loses the decode graph. A copy of the installed release, backported and first
on ``PYTHONPATH`` with the plugin disabled, decides both as the plugin does.
The generated tokens are the same every way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import last_answer
from tests.support.backport_checks import copy_package
from vllm_graphsafe.cli.main import main

SCRIPT = Path(__file__).with_name("row_phase_steps.py")
PATCH_ID = "v1-phase-dispatch"


def run(
    model: Path,
    *,
    plugin: bool,
    prompt_length_rule: bool = False,
    tree: Path | None = None,
) -> Any:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("VLLM_GRAPHSAFE_DISABLE", None)
    env.pop("GRAPHSAFE_DISABLE", None)
    if not plugin:
        env["GRAPHSAFE_DISABLE"] = PATCH_ID if tree is None else "all"
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    args = [str(SCRIPT), str(model)]
    if prompt_length_rule:
        args.append("--prompt-length-rule")
    return last_answer(args, env)


@pytest.fixture(scope="module")
def runs(
    tiny_model: Path, release_package: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tree = tmp_path_factory.mktemp("row-phase-tree")
    copy_package(release_package, tree)
    assert main(["backport", "--tree", str(tree), "--write"]) == 0
    return {
        "on": run(tiny_model, plugin=True),
        "off": run(tiny_model, plugin=False),
        "prompt-length": run(tiny_model, plugin=True, prompt_length_rule=True),
        "backported": run(tiny_model, plugin=False, tree=tree),
    }


def uniform_shape(step: dict[str, Any], spec_tokens: int) -> bool:
    return all(row["width"] == spec_tokens + 1 for row in step["rows"])


def reprefill_steps(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Uniform-shaped steps with a row re-computing tokens past its prompt."""
    k = answer["spec_tokens"]
    return [
        step
        for step in answer["steps"]
        if uniform_shape(step, k)
        and any(
            row["drafts"] is None and row["computed"] >= row["prompt"]
            for row in step["rows"]
        )
    ]


def padded_tail_steps(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Uniform-shaped steps of the repeated prompt's admission, padded with drafts."""
    k = answer["spec_tokens"]
    first, last = answer["padded_admission_steps"]
    return [
        step
        for step in answer["steps"][first:last]
        if uniform_shape(step, k)
        and any(
            row["drafts"] == k and row["computed"] == row["prompt"] - 1
            for row in step["rows"]
        )
    ]


def test_reprefill_after_preemption_stays_off_the_decode_graph(
    runs: dict[str, Any],
) -> None:
    steps = reprefill_steps(runs["on"])
    assert steps, "no re-prefill step of the decode shape ran: no preemption?"
    assert [step for step in steps if step["uniform_decode"]] == []


def test_without_the_fix_a_reprefill_step_replays_the_decode_graph(
    runs: dict[str, Any],
) -> None:
    assert [step for step in reprefill_steps(runs["off"]) if step["uniform_decode"]]


def test_a_padded_prompt_tail_keeps_the_decode_graph(runs: dict[str, Any]) -> None:
    steps = padded_tail_steps(runs["on"])
    assert steps, "the repeated prompt was not admitted padded with drafts"
    assert all(step["uniform_decode"] for step in steps)


def test_the_prompt_length_rule_sends_the_padded_tail_off_the_graph(
    runs: dict[str, Any],
) -> None:
    steps = padded_tail_steps(runs["prompt-length"])
    assert steps
    assert not any(step["uniform_decode"] for step in steps)


def test_the_backported_tree_decides_both_rows_as_the_plugin(
    runs: dict[str, Any],
) -> None:
    answer = runs["backported"]
    assert reprefill_steps(answer)
    assert not any(step["uniform_decode"] for step in reprefill_steps(answer))
    assert padded_tail_steps(answer)
    assert all(step["uniform_decode"] for step in padded_tail_steps(answer))


def test_pure_decode_steps_keep_the_decode_graph(runs: dict[str, Any]) -> None:
    k = runs["on"]["spec_tokens"]
    decodes = [
        step
        for step in runs["on"]["steps"]
        if uniform_shape(step, k) and all(row["drafts"] == k for row in step["rows"])
    ]
    assert decodes
    assert all(step["uniform_decode"] for step in decodes)


def test_generated_tokens_are_identical_every_way(runs: dict[str, Any]) -> None:
    assert runs["on"]["token_ids"] == runs["off"]["token_ids"]
    assert runs["on"]["token_ids"] == runs["prompt-length"]["token_ids"]
    assert runs["on"]["token_ids"] == runs["backported"]["token_ids"]
