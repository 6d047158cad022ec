"""Is each scheduled row a decode? The phase half of uniform *decode*.

Run on every step. What each keeps between steps, ``docs/benchmarks.md`` ("What
the per-step code keeps") measured at more than a tenth of its hook's cost.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence, Sized
from operator import itemgetter
from typing import Any

import numpy as np


class PrefillColumns:
    """A request-state table's computed-prefill and prefill-length columns.
    The scheduled ids are looked up only where some row is in prefill at all:
    in steady decoding none is."""

    __slots__ = ("_computed", "_prefill_len", "_same_layout")

    def __init__(self, computed: np.ndarray, prefill_len: np.ndarray) -> None:
        if computed.shape != prefill_len.shape:
            raise ValueError(
                f"columns of {computed.shape} and {prefill_len.shape} rows"
            )
        self._computed = computed
        self._prefill_len = prefill_len
        #: Equal bytes mean equal values (one integer type, one shape).
        self._same_layout = (
            computed.dtype == prefill_len.dtype and computed.dtype.kind in "iu"
        )

    def scheduled_in_prefill(
        self, row_of: Mapping[Any, int], scheduled: Collection[Any]
    ) -> bool:
        """Whether a request of ``scheduled`` is still in prefill (``KeyError``
        for one without a row, wherever some row is in prefill)."""
        computed, prefill_len = self._computed, self._prefill_len
        # A decoding row has computed exactly its prefill, so in steady
        # decoding the two columns hold the same bytes: comparing them first
        # saves 0.4-0.6 µs of the hook's 1.5-1.7 µs per step (docs/benchmarks.md).
        if self._same_layout and computed.tobytes() == prefill_len.tobytes():
            return False
        in_prefill = computed < prefill_len
        if not scheduled or not np.count_nonzero(in_prefill):
            return False
        # The ids' rows looked up in C, one call for all of them, and turned
        # into an index array of known length: a Python loop would add about a
        # fifth to the worst case's per-step cost, np.array about a tenth at
        # 1024 requests (docs/benchmarks.md).
        count = len(scheduled)
        found = itemgetter(*scheduled)(row_of)
        rows = np.fromiter(found if count > 1 else (found,), np.intp, count)
        return bool(np.count_nonzero(in_prefill[rows]))


def rows_are_speculative_decodes(
    decode_draft_counts: np.ndarray, num_rows: int, num_drafts: int
) -> bool:
    """Whether each of the first ``num_rows`` V1 builders' draft counts
    (negative for a prefill chunk) is ``num_drafts``, by their bytes. The view
    and the expected bytes are kept: making them each step would cost more
    than the whole hook does (docs/benchmarks.md)."""
    column, rows, value, view, expected = _last_uniform_check[0]
    if column is not decode_draft_counts or rows != num_rows or value != num_drafts:
        check = _uniform_check(decode_draft_counts, num_rows, num_drafts)
        _last_uniform_check[0] = check
        column, rows, value, view, expected = check
    if expected is not None:
        same: bool = view.tobytes() == expected
        return same
    if view is None:
        return False
    return not np.count_nonzero(view != num_drafts)


#: The column, row count and value last checked; the view of those rows (None:
#: the column has fewer); the bytes of the value repeated over them (None where
#: bytes cannot say it). One tuple, replaced whole, so a thread never sees half
#: of an update.
UniformCheck = tuple[Any, int, int, Any, "bytes | None"]
_last_uniform_check: list[UniformCheck] = [(None, -1, 0, None, None)]


def _uniform_check(column: Any, num_rows: int, value: int) -> UniformCheck:
    view = column[:num_rows]
    if len(view) != num_rows:
        return (column, num_rows, value, None, None)
    if not isinstance(view, np.ndarray) or view.dtype.kind not in "iu":
        return (column, num_rows, value, view, None)
    limits = np.iinfo(view.dtype)
    if not (isinstance(value, int | np.integer) and limits.min <= value <= limits.max):
        return (column, num_rows, value, view, None)
    expected = np.full(num_rows, value, dtype=view.dtype).tobytes()
    return (column, num_rows, value, view, expected)


def rows_have_prior_state(computed: np.ndarray, num_rows: int) -> bool:
    """Without speculation: whether each of the first ``num_rows`` rows had
    computed a token before this step (one new token over prior state is a
    decode to the builders, the last token of a chunked prompt included)."""
    # The view of the rows is kept while the column and row count repeat:
    # slicing each step would add about a fifth to the rule's own per-step
    # cost without speculation (docs/benchmarks.md).
    column, rows, view = _last_prior_state_check[0]
    if column is not computed or rows != num_rows:
        view = computed[:num_rows]
        if len(view) != num_rows:
            view = None
        _last_prior_state_check[0] = (computed, num_rows, view)
    if view is None:
        return False
    if isinstance(view, np.ndarray):
        return bool(np.count_nonzero(view) == num_rows)
    return bool(view.all())


#: The column and row count last checked, and the view of those rows (None:
#: the column has fewer); replaced whole, as ``_last_uniform_check``.
_last_prior_state_check: list[tuple[Any, int, Any]] = [(None, -1, None)]


def rows_past_prompt_with_drafts(
    computed: np.ndarray,
    prompt: np.ndarray,
    scheduled_drafts: Sequence[Sized] | None,
    num_rows: int,
    num_drafts: int,
) -> bool:
    """On a runner without the builders' draft counts (upstream's tests): each
    row past its prompt and handed ``num_drafts`` where drafts are listed.
    Stricter than the builders: a padded prompt tail is a prefill here."""
    computed_rows, prompt_rows = computed[:num_rows], prompt[:num_rows]
    if len(computed_rows) != num_rows or len(prompt_rows) != num_rows:
        return False
    if np.count_nonzero(computed_rows < prompt_rows):
        return False
    if scheduled_drafts is None:
        return True
    return all(len(scheduled_drafts[row]) == num_drafts for row in range(num_rows))
