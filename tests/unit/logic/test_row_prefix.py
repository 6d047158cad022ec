"""RowPrefix: the per-step phase check over a persistent batch's columns.

The oracle is written out per row in plain Python: row ``i`` is in prefill
when ``computed[i] < prompt[i]``, and only rows below ``num_rows`` count.
"""

from __future__ import annotations

import numpy as np
import pytest

from vllm_graphsafe.fixes.phase_rows import RowPrefix

# (computed, prompt): rows 0-2 decoding, 3 fresh prompt, 4 chunked tail,
# 5 just computed, 6 ahead (async), 7 stale row in prefill.
COMPUTED = [30, 12, 7, 0, 512, 40, 25, 0]
PROMPT = [20, 12, 5, 4, 516, 40, 16, 300]


@pytest.mark.parametrize(
    ("num_rows", "in_prefill"),
    [
        (0, []),
        (1, []),
        (3, []),
        (4, [3]),
        (5, [3, 4]),
        (7, [3, 4]),
        (8, [3, 4, 7]),
    ],
)
def test_rows_in_prefill_and_past_prefill_over_the_prefix(
    num_rows: int, in_prefill: list[int]
) -> None:
    prefix = RowPrefix(
        np.array(COMPUTED, np.int32), np.array(PROMPT, np.int32), num_rows
    )

    assert prefix.rows_in_prefill().tolist() == in_prefill
    assert prefix.past_prefill() is (in_prefill == [])


def test_row_prefix_reads_the_columns_as_they_are_now() -> None:
    computed = np.array([10, 10, 10, 0], np.int32)
    prompt = np.array([10, 10, 10, 4], np.int32)
    prefix = RowPrefix(computed, prompt, 3)
    assert prefix.past_prefill()

    # A new request lands in row 1 of the same arrays: its prompt is pending.
    computed[1], prompt[1] = 0, 4
    assert not prefix.past_prefill()
    assert prefix.rows_in_prefill().tolist() == [1]

    # Its prompt computed, the batch is all decode again.
    computed[1] = 4
    assert prefix.past_prefill()
    assert prefix.rows_in_prefill().size == 0


def test_rows_past_the_prefix_never_count() -> None:
    computed = np.array([10, 0], np.int32)
    prompt = np.array([10, 4], np.int32)  # row 1 is a stale row past num_rows

    assert RowPrefix(computed, prompt, 1).past_prefill()


def test_row_prefix_keeps_the_columns_it_views() -> None:
    computed = np.array(COMPUTED, np.int32)
    prompt = np.array(PROMPT, np.int32)
    prefix = RowPrefix(computed, prompt, 8)

    assert prefix.computed is computed and prefix.prompt is prompt
