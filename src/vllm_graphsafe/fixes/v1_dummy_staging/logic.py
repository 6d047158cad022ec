"""Dummy-batch metadata that satisfies the invariants of a real batch.

For every active request ``r`` and every active token ``t`` of ``r``::

    seq_len[r]   == num_computed[r] + num_scheduled[r]
    positions[t] == num_computed[r] + query_pos[t]

Padded rows and tokens are zero; a requested sequence length shorter than the
query is raised to it, so no computed length or position is negative.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class StagedDummyBatch(NamedTuple):
    seq_lens: np.ndarray
    num_computed: np.ndarray
    num_scheduled: np.ndarray
    positions: np.ndarray


def stage_dummy_batch(
    requested_seq_lens: np.ndarray,
    num_scheduled: np.ndarray,
    num_reqs_padded: int,
    num_tokens_padded: int,
) -> StagedDummyBatch:
    """Stage lengths and positions for ``len(num_scheduled)`` active requests
    (``requested_seq_lens``: what the dummy run asked for), zero-padded to
    ``num_reqs_padded`` rows and ``num_tokens_padded`` tokens."""
    num_reqs = len(num_scheduled)
    num_tokens = int(num_scheduled.sum())
    if num_reqs_padded < num_reqs or num_tokens_padded < num_tokens:
        raise ValueError("padded sizes must cover the active requests and tokens")

    scheduled = np.zeros(num_reqs_padded, dtype=np.int64)
    scheduled[:num_reqs] = num_scheduled
    seq_lens = np.zeros(num_reqs_padded, dtype=np.int64)
    seq_lens[:num_reqs] = seq_len_floor(requested_seq_lens[:num_reqs], num_scheduled)
    num_computed = seq_lens - scheduled

    positions = np.zeros(num_tokens_padded, dtype=np.int64)
    positions[:num_tokens] = token_positions(num_computed[:num_reqs], num_scheduled)
    return StagedDummyBatch(seq_lens, num_computed, scheduled, positions)


def seq_len_floor(requested: np.ndarray, num_scheduled: np.ndarray) -> np.ndarray:
    floor: np.ndarray = np.maximum(requested, num_scheduled)
    return floor


def token_positions(num_computed: np.ndarray, num_scheduled: np.ndarray) -> np.ndarray:
    starts = np.repeat(num_computed.astype(np.int64), num_scheduled)
    ends = np.cumsum(num_scheduled, dtype=np.int64)
    query_pos = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
    query_pos -= np.repeat(ends - num_scheduled, num_scheduled)
    return starts + query_pos
