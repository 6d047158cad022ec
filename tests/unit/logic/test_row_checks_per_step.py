"""The per-step row checks answer as their plain definitions do, step after step.

Each check keeps what it built for the last step (views, the bytes of a
uniform column, the host arrays of a request-state table); the oracle is the
definition written out per row in plain Python, recomputed from the columns'
current values at every step, so a kept view that went stale would disagree.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_graphsafe.fixes.phase_rows import (
    PrefillColumns,
    rows_are_speculative_decodes,
    rows_have_prior_state,
)
from vllm_graphsafe.fixes.v1_phase_dispatch.hooks import rows_are_decodes


def speculative_oracle(counts: list[int], num_rows: int, num_drafts: int) -> bool:
    return num_rows <= len(counts) and all(
        count == num_drafts for count in counts[:num_rows]
    )


def prior_state_oracle(computed: list[int], num_rows: int) -> bool:
    return num_rows <= len(computed) and all(c != 0 for c in computed[:num_rows])


# -- V1: draft counts ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, np.uint8])
def test_draft_counts_follow_the_column_step_after_step(dtype: type) -> None:
    column: np.ndarray = np.full(16, 3, dtype=dtype)
    steps = [
        (8, None),  # all decodes
        (8, (7, 2)),  # the last row drafts fewer
        (8, (7, 3)),  # back to decodes, same view
        (9, (8, 0)),  # one more row, a prompt chunk (0 drafts counted)
        (16, None),
        (3, (0, 1)),
        (0, None),  # no rows: nothing to contradict
    ]
    for num_rows, write in steps:
        if write is not None:
            column[write[0]] = write[1]
        expected = speculative_oracle(column.tolist(), num_rows, 3)
        assert rows_are_speculative_decodes(column, num_rows, 3) is expected


def test_draft_counts_of_a_replaced_column_are_read_afresh() -> None:
    first = np.full(8, 3, dtype=np.int32)
    second = np.full(8, 3, dtype=np.int32)
    second[2] = -1
    for column in (first, second, first, second):
        assert rows_are_speculative_decodes(column, 8, 3) is (column is first)


def test_more_rows_than_the_column_holds_are_not_decodes() -> None:
    assert rows_are_speculative_decodes(np.full(4, 3, np.int32), 5, 3) is False
    assert rows_are_speculative_decodes(np.full(4, 3, np.int32), -1, 3) is False


@pytest.mark.parametrize(
    ("column", "num_drafts"),
    [
        (np.full(6, 3.0), 3),  # a float column: compared by value
        (np.full(6, 3, np.int8), 300),  # a value the column cannot hold
        (np.full(6, -1, np.int8), -1),  # negative values
    ],
)
def test_draft_counts_the_bytes_cannot_say_are_compared_by_value(
    column: np.ndarray, num_drafts: int
) -> None:
    for num_rows in (6, 3):
        expected = speculative_oracle(column.tolist(), num_rows, num_drafts)
        assert rows_are_speculative_decodes(column, num_rows, num_drafts) is expected
    column[1] = 0
    expected = speculative_oracle(column.tolist(), 6, num_drafts)
    assert rows_are_speculative_decodes(column, 6, num_drafts) is expected


def test_a_strided_draft_column_follows_its_rows() -> None:
    backing = np.full(32, 3, dtype=np.int32)
    column = backing[::2]  # every other row: not contiguous
    for step in range(6):
        backing[2 * step] = -1 if step % 2 else 3
        expected = speculative_oracle(column.tolist(), 16, 3)
        assert rows_are_speculative_decodes(column, 16, 3) is expected


def test_a_changed_draft_count_is_a_new_question() -> None:
    column = np.full(8, 2, dtype=np.int32)
    assert rows_are_speculative_decodes(column, 8, 2)
    assert not rows_are_speculative_decodes(column, 8, 3)
    assert rows_are_speculative_decodes(column, 8, 2)


def test_random_draft_columns_agree_with_the_definition() -> None:
    generator = np.random.default_rng(7)
    column = np.full(64, 3, dtype=np.int32)
    for _ in range(400):
        if generator.random() < 0.5:
            column[generator.integers(0, 64)] = generator.choice([-1, 0, 2, 3, 3, 3])
        num_rows = int(generator.integers(0, 70))
        expected = speculative_oracle(column.tolist(), num_rows, 3)
        assert rows_are_speculative_decodes(column, num_rows, 3) is expected


# -- V1: prior state (no speculation) ----------------------------------------------


def test_prior_state_follows_the_column_step_after_step() -> None:
    computed = np.array([5, 9, 1, 40, 0, 7], dtype=np.int32)
    for num_rows, write in [(4, None), (5, None), (5, (4, 3)), (6, (0, 0)), (7, None)]:
        if write is not None:
            computed[write[0]] = write[1]
        expected = prior_state_oracle(computed.tolist(), num_rows)
        assert rows_have_prior_state(computed, num_rows) is expected


def test_the_runner_rule_reads_the_columns_it_holds_now() -> None:
    """``rows_are_decodes``'s inlined first test gives the function's answer."""
    drafts = SimpleNamespace(np=np.full(32, 3, dtype=np.int32))
    runner = SimpleNamespace(
        num_decode_draft_tokens=drafts,
        input_batch=SimpleNamespace(num_computed_tokens_cpu=np.ones(32, np.int32)),
    )
    for step in range(60):
        num_rows = 1 + step % 32
        if step % 7 == 3:
            drafts.np[step % 32] = -1
        if step % 7 == 5:
            drafts.np[:] = 3
        if step == 40:
            drafts.np = np.full(32, 3, dtype=np.int32)  # the runner's new buffer
            drafts.np[0] = 1
        expected = speculative_oracle(drafts.np.tolist(), num_rows, 3)
        assert rows_are_decodes(runner, num_rows, 4) is expected
        expected = prior_state_oracle(
            runner.input_batch.num_computed_tokens_cpu.tolist(), num_rows
        )
        assert rows_are_decodes(runner, num_rows, 1) is expected


def batch_only_oracle(
    computed: list[int],
    prompt: list[int],
    drafts: list[list[int]] | None,
    num_rows: int,
    num_drafts: int,
) -> bool:
    """Each row past its prompt and, where drafts are listed, handed them all."""
    return num_rows <= len(computed) and all(
        computed[row] >= prompt[row]
        and (drafts is None or len(drafts[row]) == num_drafts)
        for row in range(num_rows)
    )


@pytest.mark.parametrize("lists_drafts", [True, False])
def test_a_runner_without_draft_counts_is_read_from_its_input_batch(
    lists_drafts: bool,
) -> None:
    """As upstream's tests build a runner: an input batch, no draft counts."""
    computed = np.array([40, 12, 7, 0, 30, 9, 64, 3], dtype=np.int32)
    prompt = np.array([10, 12, 7, 3, 31, 9, 60, 3], dtype=np.int32)
    drafts = [[0, 0, 0], [0, 0, 0], [], [0, 0, 0], [0, 0, 0], [0], [0, 0, 0], []]
    batch = SimpleNamespace(num_computed_tokens_cpu=computed, num_prompt_tokens=prompt)
    if lists_drafts:
        batch.spec_token_ids = drafts
    runner = SimpleNamespace(input_batch=batch)
    listed = drafts if lists_drafts else None
    answers = []
    for num_rows in range(len(computed) + 2):
        expected = batch_only_oracle(
            computed.tolist(), prompt.tolist(), listed, num_rows, 3
        )
        answers.append(expected)
        assert rows_are_decodes(runner, num_rows, 4) is expected
    assert True in answers and False in answers
    # Without speculation the rows' prior state decides, as with draft counts.
    for num_rows in range(len(computed) + 2):
        expected = prior_state_oracle(computed.tolist(), num_rows)
        assert rows_are_decodes(runner, num_rows, 1) is expected


# -- Model Runner V2: a scheduled request in prefill ----------------------------------


def in_prefill_oracle(
    computed: list[int],
    prefill_len: list[int],
    row_of: dict[str, int],
    scheduled: dict[str, int],
) -> bool:
    return any(computed[row_of[r]] < prefill_len[row_of[r]] for r in scheduled)


def test_scheduled_requests_in_prefill_follow_the_table() -> None:
    computed = np.zeros(12, np.int32)
    prefill_len = np.zeros(12, np.int32)
    table = PrefillColumns(computed, prefill_len)
    row_of = {"a": 3, "b": 7, "c": 0}
    generator = np.random.default_rng(3)
    for _ in range(300):
        row = int(generator.integers(0, 12))
        prefill_len[row] = int(generator.integers(0, 20))
        computed[row] = min(int(generator.integers(0, 25)), int(prefill_len[row]) + 3)
        for size in range(4):
            for chosen in itertools.combinations("abc", size):
                scheduled = dict.fromkeys(chosen, 4)
                expected = in_prefill_oracle(
                    computed.tolist(), prefill_len.tolist(), row_of, scheduled
                )
                assert table.scheduled_in_prefill(row_of, scheduled) is expected


def test_rows_in_prefill_that_nobody_scheduled_do_not_count() -> None:
    """Stale rows (freed, or waiting requests) mid-prefill: the ids decide."""
    computed = np.array([4, 4, 1, 2], np.int32)
    prefill_len = np.array([4, 4, 9, 9], np.int32)
    table = PrefillColumns(computed, prefill_len)
    assert not table.scheduled_in_prefill({"a": 0, "b": 1, "w": 2}, {"a": 4, "b": 4})
    assert table.scheduled_in_prefill({"a": 0, "w": 2}, {"a": 4, "w": 4})
    assert table.scheduled_in_prefill({"w": 3}, {"w": 4})


def test_a_scheduled_request_without_a_row_is_an_error_where_rows_are_in_prefill() -> (
    None
):
    table = PrefillColumns(np.array([0, 5], np.int32), np.array([4, 5], np.int32))
    with pytest.raises(KeyError):
        table.scheduled_in_prefill({"a": 1}, {"a": 4, "gone": 4})


def test_columns_of_other_types_or_lengths() -> None:
    computed = np.array([3, 0], np.int64)
    table = PrefillColumns(computed, np.array([3, 4], np.int32))  # no byte shortcut
    assert table.scheduled_in_prefill({"a": 0, "b": 1}, {"b": 4})
    assert not table.scheduled_in_prefill({"a": 0, "b": 1}, {"a": 4})
    assert not table.scheduled_in_prefill({"a": 0}, {})
    with pytest.raises(ValueError, match="rows"):
        PrefillColumns(np.zeros(3, np.int32), np.zeros(4, np.int32))
