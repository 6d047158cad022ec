"""Every scheduled row a decode, decided from the scheduler's output alone.

Each case states its requests as the scheduler sends them (tokens scheduled,
drafts listed, computed before the step, prompt length); the expected answer
is stated with it, from the builders' definition of a decode: with K
speculative tokens, a row the runner counts exactly K drafts for; without,
one token over prior state.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import pytest

from vllm_graphsafe.fixes.scheduled_rows import (
    NOT_A_DECODE,
    DraftCounting,
    decode_draft_count,
    scheduled_rows_are_decodes,
)

PLUS_ONE = DraftCounting()  # 0.27 on: drafts count where the row schedules 1 + them
PAST_PROMPT = DraftCounting(past_prompt=True)  # 0.22: where the row is past its prompt
WITH_ZERO_DRAFTS = DraftCounting(zero_draft_decodes=True)  # 0.32 on
K = 3


@dataclass(frozen=True)
class Request:
    scheduled: int
    computed: int
    prompt: int
    drafts: int | None = None


def decide(requests: list[Request], num_drafts: int, counting: DraftCounting) -> bool:
    ids = [f"req-{index}" for index in range(len(requests))]
    by_id = dict(zip(ids, requests, strict=True))
    return scheduled_rows_are_decodes(
        {req_id: request.scheduled for req_id, request in by_id.items()},
        {
            req_id: [-1] * request.drafts
            for req_id, request in by_id.items()
            if request.drafts is not None
        },
        {req_id: request.computed for req_id, request in by_id.items()},
        lambda req_id: by_id[req_id].prompt,
        num_drafts,
        counting,
    )


FRESH_PROMPT = Request(scheduled=K + 1, computed=0, prompt=K + 1)
PADDED_PROMPT_TAIL = Request(scheduled=K + 1, computed=128, prompt=129, drafts=K)
REPREFILL_AFTER_PREEMPTION = Request(scheduled=K + 1, computed=17, prompt=10)
GENUINE_DECODE = Request(scheduled=K + 1, computed=25, prompt=10, drafts=K)
JUST_FINISHED_PROMPT = Request(scheduled=K + 1, computed=40, prompt=40, drafts=K)
CHUNKED_PROMPT_TAIL = Request(scheduled=K + 1, computed=512, prompt=512 + K + 1)


@pytest.mark.parametrize("counting", [PLUS_ONE, PAST_PROMPT, WITH_ZERO_DRAFTS])
@pytest.mark.parametrize(
    ("requests", "decodes"),
    [
        ([FRESH_PROMPT], False),
        ([FRESH_PROMPT] * 3, False),
        ([CHUNKED_PROMPT_TAIL], False),
        ([REPREFILL_AFTER_PREEMPTION], False),
        ([GENUINE_DECODE], True),
        ([GENUINE_DECODE, JUST_FINISHED_PROMPT], True),
        ([GENUINE_DECODE, FRESH_PROMPT], False),
        ([GENUINE_DECODE, REPREFILL_AFTER_PREEMPTION], False),
        ([], True),
    ],
    ids=[
        "fresh-prompt",
        "equal-fresh-prompts",
        "chunked-prompt-tail",
        "reprefill-after-preemption",
        "genuine-decode",
        "decode-and-just-finished-prompt",
        "decode-beside-fresh-prompt",
        "decode-beside-reprefill",
        "nothing-scheduled",
    ],
)
def test_k_plus_one_rows_that_every_release_counts_alike(
    requests: list[Request], decodes: bool, counting: DraftCounting
) -> None:
    assert decide(requests, K, counting) is decodes


def test_a_padded_prompt_tail_is_a_decode_where_drafts_count_by_width() -> None:
    """All but the last prompt token computed, padded with K placeholder drafts:
    it schedules 1 + K tokens (a decode from 0.27 on), but had not computed its
    prompt (0.22 counts no drafts for it)."""
    assert decide([PADDED_PROMPT_TAIL], K, PLUS_ONE) is True
    assert decide([GENUINE_DECODE, PADDED_PROMPT_TAIL], K, PLUS_ONE) is True
    assert decide([PADDED_PROMPT_TAIL], K, PAST_PROMPT) is False


def test_drafts_of_another_length_are_not_a_decode_of_k() -> None:
    two_drafts = Request(scheduled=K + 1, computed=30, prompt=10, drafts=K - 1)
    assert decide([two_drafts], K, PLUS_ONE) is False
    assert decide([two_drafts], K, PAST_PROMPT) is False


@pytest.mark.parametrize(
    ("requests", "decodes"),
    [
        ([Request(scheduled=1, computed=0, prompt=1)], False),
        ([Request(scheduled=1, computed=511, prompt=512)], True),
        ([Request(scheduled=1, computed=40, prompt=12)], True),
        (
            [
                Request(scheduled=1, computed=40, prompt=12),
                Request(scheduled=1, computed=0, prompt=1),
            ],
            False,
        ),
    ],
    ids=[
        "one-token-fresh-prompt",
        "one-token-chunk-tail",
        "decode",
        "decode-beside-fresh-prompt",
    ],
)
def test_without_speculation_one_token_over_prior_state_is_a_decode(
    requests: list[Request], decodes: bool
) -> None:
    for counting in (PLUS_ONE, PAST_PROMPT, WITH_ZERO_DRAFTS):
        assert decide(requests, 0, counting) is decodes


@pytest.mark.parametrize(
    ("request_", "counting", "count"),
    [
        (GENUINE_DECODE, PLUS_ONE, K),
        (GENUINE_DECODE, PAST_PROMPT, K),
        (PADDED_PROMPT_TAIL, PLUS_ONE, K),
        (PADDED_PROMPT_TAIL, PAST_PROMPT, NOT_A_DECODE),
        (FRESH_PROMPT, PLUS_ONE, NOT_A_DECODE),
        (REPREFILL_AFTER_PREEMPTION, WITH_ZERO_DRAFTS, NOT_A_DECODE),
        # A decode whose drafter proposed nothing: one token past its prompt.
        (Request(scheduled=1, computed=30, prompt=20), PLUS_ONE, NOT_A_DECODE),
        (Request(scheduled=1, computed=30, prompt=20), WITH_ZERO_DRAFTS, 0),
        # The last token of a chunked prompt is no zero-draft decode.
        (Request(scheduled=1, computed=19, prompt=20), WITH_ZERO_DRAFTS, NOT_A_DECODE),
        # Fewer drafts than K, scheduled with them: counted as they are.
        (Request(scheduled=2, computed=30, prompt=20, drafts=1), PLUS_ONE, 1),
        # Drafts listed but more tokens scheduled: a chunk, not a decode.
        (Request(scheduled=K + 2, computed=30, prompt=20, drafts=K), PLUS_ONE, -1),
    ],
)
def test_the_count_each_row_gets(
    request_: Request, counting: DraftCounting, count: int
) -> None:
    assert (
        decode_draft_count(
            request_.scheduled,
            request_.drafts,
            request_.computed,
            request_.prompt,
            counting,
        )
        == count
    )


def test_prompt_lengths_are_asked_only_where_the_counting_reads_them() -> None:
    def no_prompt_lengths(req_id: str) -> int:
        raise AssertionError(f"asked the prompt length of {req_id}")

    assert scheduled_rows_are_decodes(
        {"a": K + 1}, {"a": [7] * K}, {"a": 25}, no_prompt_lengths, K, PLUS_ONE
    )
    assert not scheduled_rows_are_decodes(
        {"a": 1}, {}, {"a": 0}, no_prompt_lengths, 0, PAST_PROMPT
    )


COUNTS_PAST_PROMPT = """
def _prepare_inputs(self, scheduler_output):
    counts = np.full(num_reqs, -1, dtype=np.int32)
    for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
        row = self.input_batch.req_id_to_index[req_id]
        if self.input_batch.num_computed_tokens_cpu[row] >= (
            self.input_batch.num_prompt_tokens[row]
        ):
            num_decode_draft_tokens[row] = len(drafts)
"""
COUNTS_BY_WIDTH_WITH_ZERO_DRAFTS = """
def _prepare_inputs(self, scheduler_output):
    for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
        row = self.input_batch.req_id_to_index[req_id]
        if num_scheduled_tokens[row] == len(drafts) + 1:
            num_decode_draft_tokens[row] = len(drafts)
    batch = self.input_batch
    past = batch.num_computed_tokens_cpu >= batch.num_prompt_tokens
    num_decode_draft_tokens[(num_decode_draft_tokens < 0) & past] = 0
"""
COUNTS_UNCONDITIONALLY = """
def _prepare_inputs(self, scheduler_output):
    for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
        num_decode_draft_tokens[self.input_batch.req_id_to_index[req_id]] = len(drafts)
"""


@pytest.mark.parametrize(
    ("source", "counting"),
    [
        (COUNTS_PAST_PROMPT, PAST_PROMPT),
        (COUNTS_BY_WIDTH_WITH_ZERO_DRAFTS, WITH_ZERO_DRAFTS),
        (COUNTS_UNCONDITIONALLY, None),
    ],
    ids=["past-prompt", "by-width-with-zero-drafts", "unrecognised"],
)
def test_the_counting_is_read_from_prepare_inputs(
    source: str, counting: DraftCounting | None
) -> None:
    from vllm_graphsafe.fixes.v1_phase_dispatch.drafting import recognise_draft_counting

    assert recognise_draft_counting(ast.parse(source)) == counting
