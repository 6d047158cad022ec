"""Is a scheduled batch a uniform *decode* batch?

The stock rule looks at the batch's shape only: every request schedules the
same number of tokens. A prompt chunk of exactly ``1 + num_speculative_tokens``
tokens has that shape too. The phase rule adds the missing half: every
scheduled request must already have computed its whole prompt before the step.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Iterable, Mapping

import numpy as np

try:  # numpy 2's C entry point, without the keyword handling of np.count_nonzero
    from numpy._core.multiarray import count_nonzero as _count_nonzero
except ImportError:  # numpy 1
    _count_nonzero = np.count_nonzero

_less = np.less

PrefillPending = Callable[[], bool]


def uniform_query_len(num_reqs: int, num_tokens: int, max_query_len: int) -> int | None:
    """The common query length when every request schedules the same count."""
    if num_reqs > 0 and max_query_len > 0 and num_tokens == max_query_len * num_reqs:
        return max_query_len
    return None


def rows_past_prefill(num_computed: np.ndarray, num_prompt: np.ndarray) -> bool:
    """Whether every row had computed its whole prompt before this step.

    ``num_computed`` and ``num_prompt`` are the rows' pre-step counts in the
    same order. A computed count that runs ahead under async scheduling still
    counts as past prefill; a chunked tail with some tokens computed does not.
    """
    return not _count_nonzero(num_computed < num_prompt)


class RowPrefix:
    """The first ``num_rows`` rows of a computed and a prompt column, sliced once.

    For a per-step check over a persistent batch: the views (and the buffer
    the comparison writes to) are made once per batch size and stay valid as
    long as the batch keeps the same column arrays, which ``computed`` and
    ``prompt`` identify.
    """

    __slots__ = ("_computed_rows", "_in_prefill", "_prompt_rows", "computed", "prompt")

    def __init__(self, computed: np.ndarray, prompt: np.ndarray, num_rows: int) -> None:
        self.computed = computed
        self.prompt = prompt
        self._computed_rows = computed[:num_rows]
        self._prompt_rows = prompt[:num_rows]
        self._in_prefill = np.empty(len(self._computed_rows), dtype=bool)

    def past_prefill(self) -> bool:
        """:func:`rows_past_prefill` over the prefix, as the columns hold it now."""
        return not _count_nonzero(
            _less(self._computed_rows, self._prompt_rows, self._in_prefill)
        )

    def rows_in_prefill(self) -> np.ndarray:
        """:func:`rows_in_prefill` over the prefix, as the columns hold it now."""
        in_prefill = _less(self._computed_rows, self._prompt_rows, self._in_prefill)
        if not _count_nonzero(in_prefill):
            return _NO_ROWS
        return in_prefill.nonzero()[0]


def uniform_decode_query_len(
    num_reqs: int,
    num_tokens: int,
    max_query_len: int,
    prefill_pending: PrefillPending,
) -> int | None:
    """The uniform decode query length of a batch, or ``None`` for any other batch.

    ``prefill_pending`` is only consulted for uniform shapes, so non-uniform
    batches never pay for the request-state scan.
    """
    query_len = uniform_query_len(num_reqs, num_tokens, max_query_len)
    if query_len is None or prefill_pending():
        return None
    return query_len


def is_uniform_decode(
    num_reqs: int,
    num_tokens: int,
    max_query_len: int,
    decode_query_len: int,
    prefill_pending: PrefillPending,
) -> bool:
    """Whether the batch may replay the uniform decode graph of ``decode_query_len``."""
    if max_query_len != decode_query_len:
        return False
    return (
        uniform_decode_query_len(num_reqs, num_tokens, max_query_len, prefill_pending)
        is not None
    )


def rows_in_prefill(num_computed: np.ndarray, num_prompt: np.ndarray) -> np.ndarray:
    """Indices of the rows that had not computed their whole prompt before this step.

    The per-row form of :func:`rows_past_prefill`, for a state table that holds
    every live request in rows reached through a map (Model Runner V2's request
    states): in steady decoding few rows are in prefill, so scanning them beats
    looking up every scheduled request.
    """
    in_prefill = num_computed < num_prompt
    if not _count_nonzero(in_prefill):
        return _NO_ROWS
    return in_prefill.nonzero()[0]


_NO_ROWS = np.empty(0, dtype=np.intp)
_NO_ROWS.flags.writeable = False


def any_row_scheduled(
    rows: np.ndarray | Iterable[int],
    owner_of_row: Mapping[int, Hashable],
    scheduled: Container[Hashable],
) -> bool:
    """Whether a request that owns one of ``rows`` is scheduled this step.

    Rows without an owner (freed rows keep their last counts) never count:
    their owner reads as ``None``, which is no request id.
    """
    if isinstance(rows, np.ndarray):
        rows = rows.tolist()
    return any(map(scheduled.__contains__, map(owner_of_row.get, rows)))
