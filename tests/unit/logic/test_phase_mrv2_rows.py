"""Row helpers of the Model Runner V2 phase scan: rows in prefill, and their owners."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_graphsafe.fixes.phase_rows import RowPrefix, any_row_scheduled


@pytest.mark.parametrize(
    ("computed", "prompt", "rows"),
    [
        ([0, 5, 9, 12], [4, 5, 10, 12], [0, 2]),  # fresh prompt, chunked tail
        ([7, 40, 3], [7, 40, 3], []),  # every prompt computed
        ([9, 50], [7, 40], []),  # counts ahead of the prompt (async, decode)
        ([], [], []),  # empty table
        ([0, 0, 0], [0, 0, 1], [2]),  # unused rows have zero prompts
    ],
)
def test_rows_in_prefill(
    computed: list[int], prompt: list[int], rows: list[int]
) -> None:
    table = RowPrefix(
        np.array(computed, np.int32), np.array(prompt, np.int32), len(computed)
    )
    assert table.rows_in_prefill().tolist() == rows


def test_scheduled_owner_of_a_prefill_row_counts() -> None:
    assert any_row_scheduled(np.array([3, 9]), {3: "a", 9: "b"}, {"b": 4, "c": 4})


def test_unscheduled_owners_do_not_count() -> None:
    assert not any_row_scheduled(np.array([3, 9]), {3: "a", 9: "b"}, {"c": 4})


def test_freed_rows_never_count() -> None:
    # A freed row keeps its last counts but has no owner any more.
    assert not any_row_scheduled(np.array([5]), {3: "a"}, {"a": 1})


def test_no_rows_nothing_scheduled_in_prefill() -> None:
    assert not any_row_scheduled(np.array([], dtype=np.int64), {}, {"a": 1})
