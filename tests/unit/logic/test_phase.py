"""The phase predicate over a batch's pre-step computed and prompt counts."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_graphsafe.fixes.phase_rows import RowPrefix


@pytest.mark.parametrize(
    ("computed", "prompt", "past"),
    [
        ([0], [4], False),  # fresh prompt
        ([100], [104], False),  # chunked tail
        ([4], [4], True),  # prompt just computed
        ([9, 30], [4, 20], True),  # decodes
        ([9, 3], [4, 20], False),  # a decode beside a prefill
        ([], [], True),  # nothing scheduled
    ],
)
def test_rows_past_prefill(computed: list[int], prompt: list[int], past: bool) -> None:
    rows = RowPrefix(np.array(computed), np.array(prompt), len(computed))
    assert rows.past_prefill() is past
