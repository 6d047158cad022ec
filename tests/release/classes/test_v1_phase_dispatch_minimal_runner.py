"""The V1 dispatch on a runner built as upstream's own tests build one.

vLLM's V1 tests in the style of vllm-project/vllm#53059 make the runner with
``object.__new__`` and give it only an input batch (computed and prompt
lengths, perhaps each row's drafts this step) and a dispatcher: none of the
draft counts the attention metadata builders read
(``num_decode_draft_tokens``). The release's real dispatch runs on such a
runner here. With K speculative tokens a row is then a decode once it has
computed its whole prompt and, where the batch lists each row's drafts, was
handed K of them; without speculation, once it has computed a token (what the
builders read too). The expected answers follow from the rows alone.

With the plugin, the fix stays applied (it reads the input batch instead of
standing aside); ``scripts/verify_backport.py`` runs the regression tests
here on a backported copy of the release with the plugin disabled, where the
tree's own code must give the same answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.release import v1_runner
from tests.support.vllm_fakes.v1_runner import (
    DispatchRecord,
    Row,
    batch_only,
    make_runner,
    run_dispatch,
)
from vllm_graphsafe import counts
from vllm_graphsafe.fixes import phase_events
from vllm_graphsafe.judging import PatchState

if not v1_runner.installed():
    pytest.skip(v1_runner.ABSENT, allow_module_level=True)

PATCH_ID = "v1-phase-dispatch"
SPEC_TOKENS = [0, 1, 3, 7]


def decoding(prompt: int, computed: int, q: int) -> Row:
    return Row(prompt=prompt, computed=computed, scheduled=q, drafts=q - 1)


def fresh_prompt(q: int) -> list[Row]:
    return [Row(prompt=q, computed=0, scheduled=q)]


def equal_fresh_prompts(q: int) -> list[Row]:
    return [Row(prompt=q, computed=0, scheduled=q) for _ in range(3)]


def decodes_and_a_fresh_prompt(q: int) -> list[Row]:
    return [*(decoding(20, 20 + 9 * i, q) for i in range(3)), *fresh_prompt(q)]


def chunked_tail(q: int) -> list[Row]:
    return [Row(prompt=512 + q, computed=512, scheduled=q)]


def prefix_cache_hit(q: int) -> list[Row]:
    return [Row(prompt=64 + q, computed=64, scheduled=q)]


def all_decode(q: int) -> list[Row]:
    return [decoding(10 + i, 25 + 3 * i, q) for i in range(4)]


def just_finished_prompts(q: int) -> list[Row]:
    return [decoding(40, 40, q) for _ in range(2)]


#: Steps whose shape is a uniform decode batch's. Without speculation one
#: prompt token over prior state is a decode to the builders, so a prompt's
#: tail is no hazard there (the prompt cases with K = 0 are its first chunks).
STEPS: dict[str, Callable[[int], list[Row]]] = {
    step.__name__: step
    for step in (
        fresh_prompt,
        equal_fresh_prompts,
        decodes_and_a_fresh_prompt,
        chunked_tail,
        prefix_cache_hit,
        all_decode,
        just_finished_prompts,
    )
}


def is_decode(row: Row, q: int, lists_drafts: bool) -> bool:
    if q == 1:
        return row.computed > 0
    if row.computed < row.prompt:
        return False
    return not lists_drafts or row.drafts == q - 1


def expected_uniform_decode(rows: list[Row], q: int, lists_drafts: bool) -> bool:
    return all(is_decode(row, q, lists_drafts) for row in rows)


def the_patch() -> Any:
    from vllm_graphsafe.plugin import registry

    return registry().get(PATCH_ID)


def dispatch_each_step(q: int, lists_drafts: bool) -> tuple[list[bool], list[bool]]:
    """Each step on a fresh batch-only runner: (dispatched uniform, expected)."""
    record = DispatchRecord()
    expected = []
    for rows in (step(q) for step in STEPS.values()):
        runner = make_runner(
            q, batch_only(rows, lists_drafts), record, builders_counts=False
        )
        run_dispatch(runner, [row.scheduled for row in rows])
        expected.append(expected_uniform_decode(rows, q, lists_drafts))
    return record.uniform_decode, expected


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize("lists_drafts", [True, False], ids=["drafts", "no-drafts"])
@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_prompt_shaped_steps_leave_the_decode_graph_and_decodes_keep_it(
    spec_tokens: int, lists_drafts: bool
) -> None:
    q = spec_tokens + 1
    dispatched, expected = dispatch_each_step(q, lists_drafts)

    # The prompt steps off the decode graph, the decode steps on it.
    assert True in expected and False in expected
    assert dict(zip(STEPS, dispatched, strict=True)) == dict(
        zip(STEPS, expected, strict=True)
    )
    # Where the plugin is on, the fix did not stand aside.
    assert the_patch().state is not PatchState.FAILED, the_patch().reason


@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_the_fix_counts_each_step_and_stays_applied(spec_tokens: int) -> None:
    if the_patch().state is not PatchState.APPLIED:
        pytest.skip(
            f"the plugin does not apply {PATCH_ID} here: {the_patch().state.value}"
        )
    q = spec_tokens + 1
    counts.STATS.reset()

    _, expected = dispatch_each_step(q, lists_drafts=True)

    decisions = counts.STATS.snapshot().get(PATCH_ID, {})
    assert decisions == {
        phase_events.UNIFORM_DECODE: expected.count(True),
        phase_events.KEPT_OFF_DECODE: expected.count(False),
    }
    assert the_patch().state is PatchState.APPLIED, the_patch().reason


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize("spec_tokens", [1, 3])
def test_a_prompt_after_decodes_on_one_batch_only_runner(spec_tokens: int) -> None:
    """One runner over several steps, its batch columns rewritten in place."""
    q = spec_tokens + 1
    decodes, prompts = all_decode(q), prefix_cache_hit(q) * 4
    record = DispatchRecord()
    batch = batch_only(decodes, lists_drafts=True)
    runner = make_runner(q, batch, record, builders_counts=False)
    for rows in (decodes, prompts, decodes):
        fresh = batch_only(rows, lists_drafts=True)
        batch.num_computed_tokens_cpu[:] = fresh.num_computed_tokens_cpu
        batch.num_prompt_tokens[:] = fresh.num_prompt_tokens
        batch.spec_token_ids[:] = fresh.spec_token_ids
        run_dispatch(runner, [row.scheduled for row in rows])

    assert record.uniform_decode == [True, False, True]
