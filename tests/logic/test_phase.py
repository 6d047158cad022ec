from __future__ import annotations

import numpy as np
import pytest

from vllm_graphsafe.logic.phase import (
    is_uniform_decode,
    rows_past_prefill,
    uniform_decode_query_len,
    uniform_query_len,
)


def never_called() -> bool:
    raise AssertionError("the request-state scan ran for a non-uniform shape")


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 16])
@pytest.mark.parametrize("num_reqs", [1, 2, 5, 64])
def test_uniform_shapes_report_their_width(width: int, num_reqs: int) -> None:
    assert uniform_query_len(num_reqs, width * num_reqs, width) == width


@pytest.mark.parametrize(
    ("num_reqs", "num_tokens", "max_query_len"),
    [(0, 0, 0), (2, 7, 4), (3, 4, 4), (1, 5, 4), (4, 15, 4), (2, 0, 0)],
)
def test_ragged_or_empty_shapes_are_not_uniform(
    num_reqs: int, num_tokens: int, max_query_len: int
) -> None:
    assert uniform_query_len(num_reqs, num_tokens, max_query_len) is None
    assert (
        uniform_decode_query_len(num_reqs, num_tokens, max_query_len, never_called)
        is None
    )


@pytest.mark.parametrize(
    ("computed", "prompt", "past"),
    [
        ([0], [4], False),
        ([100], [104], False),
        ([4], [4], True),
        ([9, 30], [4, 20], True),
        ([9, 3], [4, 20], False),
        ([], [], True),
    ],
)
def test_rows_past_prefill(computed: list[int], prompt: list[int], past: bool) -> None:
    assert rows_past_prefill(np.array(computed), np.array(prompt)) is past


def test_prefill_in_flight_blocks_the_decode_width() -> None:
    assert uniform_decode_query_len(3, 12, 4, lambda: True) is None
    assert uniform_decode_query_len(3, 12, 4, lambda: False) == 4


@pytest.mark.parametrize("decode_query_len", [1, 4])
def test_is_uniform_decode_needs_the_decode_width(decode_query_len: int) -> None:
    assert not is_uniform_decode(2, 10, 5, decode_query_len, never_called)
    assert is_uniform_decode(
        2, 2 * decode_query_len, decode_query_len, decode_query_len, lambda: False
    )
    assert not is_uniform_decode(
        2, 2 * decode_query_len, decode_query_len, decode_query_len, lambda: True
    )
