"""The V1 runner keeps non-decode rows off the uniform decode CUDA graph: a
prefill chunk of 1 + num_speculative_tokens tokens has a uniform decode batch's
shape (vllm-project/vllm#53051)."""

import inspect
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

MAX_ROWS = 16
NO_DRAFTS = -1
#: The dispatch's uniform-decode local in this tree (set by the backport).
CLASSIFICATION = "uniform_decode"

Rows = list[tuple[int, int]]


def _runner(rows: Rows, decode_query_len: int) -> GPUModelRunner:
    """rows: (num_computed, decode_draft_count) per row, -1 for a prefill chunk."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    drafts = np.full(MAX_ROWS, NO_DRAFTS, dtype=np.int32)
    for index, (num_computed, num_drafts) in enumerate(rows):
        computed[index] = num_computed
        drafts[index] = num_drafts
    # Each row's drafts this step, as _update_states leaves them.
    scheduled_drafts = [[0] * max(int(count), 0) for count in drafts]
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(
        uniform_decode_query_len=decode_query_len,
        input_batch=SimpleNamespace(
            num_computed_tokens_cpu=computed, spec_token_ids=scheduled_drafts
        ),
        num_decode_draft_tokens=SimpleNamespace(np=drafts),
    )
    return runner


def _is_decode(row: tuple[int, int], decode_query_len: int) -> bool:
    num_computed, num_drafts = row
    if decode_query_len > 1:
        return num_drafts == decode_query_len - 1
    return num_computed > 0


def _classification(
    runner: GPUModelRunner, num_reqs: int, force_uniform_decode: bool | None = None
) -> bool:
    dispatch = inspect.unwrap(GPUModelRunner._determine_batch_execution_and_padding)
    q = runner.uniform_decode_query_len
    kwargs = {}
    if force_uniform_decode is not None:
        kwargs["force_uniform_decode"] = force_uniform_decode
    return _answer_of_the_dispatch(
        lambda: dispatch(
            runner,
            num_tokens=q * num_reqs,
            num_reqs=num_reqs,
            num_scheduled_tokens_np=np.full(num_reqs, q, dtype=np.int32),
            max_num_scheduled_tokens=q,
            use_cascade_attn=False,
            **kwargs,
        )
    )


def _answer_of_the_dispatch(call: Callable[[], object]) -> bool:
    """Run ``call`` until the dispatch reads state its runner was not given,
    past the classification; the answer is read from the dispatch's frame."""
    dispatch = inspect.unwrap(GPUModelRunner._determine_batch_execution_and_padding)
    with pytest.raises(AttributeError) as stopped:
        call()
    traceback = stopped.value.__traceback__
    while traceback is not None and traceback.tb_frame.f_code is not dispatch.__code__:
        traceback = traceback.tb_next
    assert traceback is not None, "the dispatch stopped before it ran"
    answers = traceback.tb_frame.f_locals
    assert CLASSIFICATION in answers, "the dispatch stopped before it classified"
    return bool(answers[CLASSIFICATION])


# (num_computed, decode_draft_count) per request; each schedules q tokens.
CASES: dict[str, Callable[[int], Rows]] = {
    "fresh_prompt": lambda q: [(0, NO_DRAFTS)],
    "equal_fresh_prompts": lambda q: [(0, NO_DRAFTS)] * 3,
    "chunked_prompt_tail": lambda q: [(512, NO_DRAFTS)],
    "decodes_and_one_prompt": lambda q: (
        [(20 + 9 * i, q - 1) for i in range(3)] + [(0, NO_DRAFTS)]
    ),
    "reprefill_after_preemption": lambda q: [(25, q - 1), (17, NO_DRAFTS)],
    "all_decode": lambda q: [(25 + 3 * i, q - 1) for i in range(4)],
    "padded_prompt_tail": lambda q: [(128, q - 1), (40, q - 1)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3, 7])
def test_real_step_is_uniform_decode_only_when_every_row_is_a_decode(
    case: str, num_speculative_tokens: int
) -> None:
    q = num_speculative_tokens + 1
    rows = CASES[case](q)
    runner = _runner(rows, q)
    every_row_decodes = all(_is_decode(row, q) for row in rows)

    has_prefill = runner._has_prefill_request(len(rows))
    uniform_decode = _classification(runner, len(rows))

    assert has_prefill == (not every_row_decodes)
    assert uniform_decode == every_row_decodes


@pytest.mark.parametrize("forced", [True, False])
def test_capture_and_dummy_runs_keep_their_classification(forced: bool) -> None:
    runner = _runner(CASES["equal_fresh_prompts"](4), 4)

    # Prompt rows, yet a capture or dummy run keeps the class it asked for.
    assert runner._has_prefill_request(3) is True
    assert _classification(runner, 3, force_uniform_decode=forced) is forced


def test_rows_past_the_batch_are_ignored() -> None:
    rows = CASES["all_decode"](4)
    runner = _runner([*rows, (0, NO_DRAFTS)], 4)

    assert _classification(runner, len(rows)) is True
    assert runner._has_prefill_request(len(rows)) is False


# Tests elsewhere build the runner with an input batch alone (no draft counts):
# there a row is a decode once past its prompt and, where the batch lists them,
# handed its drafts; without speculation, once it has computed a token.

BatchRows = list[tuple[int, int, int]]


def _batch_only_runner(
    rows: BatchRows, decode_query_len: int, lists_drafts: bool
) -> GPUModelRunner:
    """rows: (num_computed, num_prompt, num_drafts this step)."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prompt = np.zeros(MAX_ROWS, dtype=np.int32)
    for index, (num_computed, num_prompt, _) in enumerate(rows):
        computed[index] = num_computed
        prompt[index] = num_prompt
    batch = SimpleNamespace(num_computed_tokens_cpu=computed, num_prompt_tokens=prompt)
    if lists_drafts:
        batch.spec_token_ids = [[0] * row[2] for row in rows] + [[]] * (
            MAX_ROWS - len(rows)
        )
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(uniform_decode_query_len=decode_query_len, input_batch=batch)
    return runner


def _is_decode_by_batch(
    row: tuple[int, int, int], decode_query_len: int, lists_drafts: bool
) -> bool:
    num_computed, num_prompt, num_drafts = row
    if decode_query_len == 1:
        return num_computed > 0
    if num_computed < num_prompt:
        return False
    return not lists_drafts or num_drafts == decode_query_len - 1


BATCH_ONLY_CASES: dict[str, Callable[[int], BatchRows]] = {
    "fresh_prompt": lambda q: [(0, q, 0)],
    "chunked_prompt_tail": lambda q: [(512, 512 + q, 0)],
    "prefix_cache_hit": lambda q: [(64, 64 + q, 0)],
    "decodes_and_one_prompt": lambda q: (
        [(25 + i, 10, q - 1) for i in range(3)] + [(0, q, 0)]
    ),
    "reprefill_after_preemption": lambda q: [(17, 10, 0)],
    "all_decode": lambda q: [(25 + 3 * i, 10, q - 1) for i in range(4)],
}


@pytest.mark.parametrize("lists_drafts", [True, False])
@pytest.mark.parametrize("case", sorted(BATCH_ONLY_CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3])
def test_a_runner_without_draft_counts_is_read_from_its_input_batch(
    case: str, num_speculative_tokens: int, lists_drafts: bool
) -> None:
    q = num_speculative_tokens + 1
    rows = BATCH_ONLY_CASES[case](q)
    runner = _batch_only_runner(rows, q, lists_drafts)
    every_row_decodes = all(_is_decode_by_batch(row, q, lists_drafts) for row in rows)

    has_prefill = runner._has_prefill_request(len(rows))
    uniform_decode = _classification(runner, len(rows))

    assert has_prefill == (not every_row_decodes)
    assert uniform_decode == every_row_decodes
