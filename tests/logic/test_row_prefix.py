"""RowPrefix: the per-step phase check over a persistent batch's columns."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_graphsafe.logic.phase import RowPrefix, rows_in_prefill, rows_past_prefill


def columns(seed: int, size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 20, size=size).astype(np.int32)
    computed = (prompt + rng.integers(-3, 3, size=size)).clip(0).astype(np.int32)
    return computed, prompt


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("num_rows", [0, 1, 7, 64])
def test_row_prefix_agrees_with_the_pure_rules(seed: int, num_rows: int) -> None:
    computed, prompt = columns(seed)
    prefix = RowPrefix(computed, prompt, num_rows)

    assert prefix.past_prefill() == rows_past_prefill(
        computed[:num_rows], prompt[:num_rows]
    )
    assert (
        prefix.rows_in_prefill().tolist()
        == rows_in_prefill(computed[:num_rows], prompt[:num_rows]).tolist()
    )


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
    computed, prompt = columns(0)
    prefix = RowPrefix(computed, prompt, 8)

    assert prefix.computed is computed and prefix.prompt is prompt
