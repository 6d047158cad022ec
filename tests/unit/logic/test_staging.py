from __future__ import annotations

import numpy as np
import pytest

from vllm_graphsafe.fixes.v1_dummy_staging.logic import (
    StagedDummyBatch,
    stage_dummy_batch,
    token_positions,
)


def check_invariants(
    staged: StagedDummyBatch, num_scheduled: np.ndarray, num_tokens: int
) -> None:
    num_reqs = len(num_scheduled)
    assert (staged.seq_lens == staged.num_computed + staged.num_scheduled).all()
    assert (staged.num_computed >= 0).all()
    assert (staged.positions >= 0).all()
    req_of_token = np.repeat(np.arange(num_reqs), num_scheduled)
    query_pos = np.concatenate([np.arange(n) for n in num_scheduled])
    expected = staged.num_computed[req_of_token] + query_pos
    assert (staged.positions[:num_tokens] == expected).all()
    assert (staged.positions[num_tokens:] == 0).all()
    assert (staged.seq_lens[num_reqs:] == 0).all()
    assert (staged.num_computed[num_reqs:] == 0).all()
    assert (staged.num_scheduled[num_reqs:] == 0).all()


@pytest.mark.parametrize("profile_len", [1, 4, 4096])
def test_profile_lengths_with_four_scheduled_tokens(profile_len: int) -> None:
    scheduled = np.array([4])
    staged = stage_dummy_batch(np.array([profile_len]), scheduled, 3, 8)
    check_invariants(staged, scheduled, 4)
    assert staged.seq_lens[0] == max(profile_len, 4)


def test_long_profile_length_puts_the_query_at_the_causal_tail() -> None:
    staged = stage_dummy_batch(np.array([4096]), np.array([4]), 1, 4)
    assert staged.num_computed[0] == 4092
    assert staged.positions.tolist() == [4092, 4093, 4094, 4095]


def test_mixed_batch_keeps_the_context_length() -> None:
    context = 8
    scheduled = np.array([1, 6])
    staged = stage_dummy_batch(np.array([1 + context, 6 + context]), scheduled, 4, 16)
    check_invariants(staged, scheduled, 7)
    assert staged.num_computed[:2].tolist() == [context, context]


def test_ragged_uniform_decode_ends_at_seq_len_minus_one() -> None:
    seq_len = 4 + 8
    scheduled = np.array([4, 3])
    staged = stage_dummy_batch(np.array([seq_len, seq_len]), scheduled, 2, 8)
    check_invariants(staged, scheduled, 7)
    assert staged.positions[4:7].tolist() == [seq_len - 3, seq_len - 2, seq_len - 1]


def test_padding_must_cover_the_batch() -> None:
    with pytest.raises(ValueError):
        stage_dummy_batch(np.array([4]), np.array([4]), 0, 4)


def test_token_positions_of_an_empty_batch() -> None:
    assert (
        token_positions(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).size
        == 0
    )
