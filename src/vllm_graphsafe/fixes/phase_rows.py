"""Is each scheduled row a decode? The phase half of uniform *decode*.

The stock rule looks at the batch's shape only: every request schedules the
same number of tokens. A prompt chunk of exactly ``1 + num_speculative_tokens``
tokens has that shape too. The phase rule adds the missing half.

Model Runner V2 asks whether every scheduled request had computed its whole
prompt (:class:`RowPrefix`). The V1 runner's attention metadata builders
classify rows differently, and the V1 rule follows them
(:func:`rows_are_speculative_decodes`, :func:`rows_have_prior_state`): a row
resumed after preemption re-prefills output tokens past its prompt without
drafts (a prefill to the builders), and the scheduler pads a request with all
but its last prompt token computed to ``1 + K`` tokens with placeholder drafts
(a decode to the builders).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Hashable, Iterable, Mapping
from operator import itemgetter
from typing import Any

import numpy as np

try:  # numpy 2's C entry point, without the keyword handling of np.count_nonzero
    from numpy._core.multiarray import count_nonzero as _count_nonzero
except ImportError:  # numpy 1
    _count_nonzero = np.count_nonzero

_less = np.less

_NO_ROWS = np.empty(0, dtype=np.intp)
_NO_ROWS.flags.writeable = False


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
        """Whether every row of the prefix is past its prompt (columns as now)."""
        return not _count_nonzero(
            _less(self._computed_rows, self._prompt_rows, self._in_prefill)
        )

    def rows_in_prefill(self) -> np.ndarray:
        """Indices of the prefix's rows still in their prompt, as the columns are now.

        For a state table that holds every live request in rows reached through
        a map (Model Runner V2's request states): in steady decoding few rows
        are in prefill, so scanning them beats looking up every scheduled
        request.
        """
        in_prefill = _less(self._computed_rows, self._prompt_rows, self._in_prefill)
        if not _count_nonzero(in_prefill):
            return _NO_ROWS
        rows: np.ndarray = in_prefill.nonzero()[0]
        return rows


class PrefillColumns:
    """A request-state table's computed-prefill and prefill-length columns,
    for Model Runner V2's per-step question: is a scheduled request still in
    prefill?

    The answer is read through the scheduled request ids (each one's row in
    ``row_of``), but only where some row of the table is in prefill at all:
    in steady decoding no row is, which the columns say by holding the same
    bytes (a decoding row has computed exactly its prefill), or else by one
    vectorised comparison.
    """

    __slots__ = ("_computed", "_in_prefill", "_prefill_len", "_same_layout")

    def __init__(self, computed: np.ndarray, prefill_len: np.ndarray) -> None:
        """Two columns of one shape (``ValueError`` otherwise)."""
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
        self._in_prefill = np.empty(computed.shape, bool)

    def scheduled_in_prefill(
        self, row_of: Mapping[Any, int], scheduled: Collection[Any]
    ) -> bool:
        """Whether a request of ``scheduled`` has a row still in prefill (as
        the columns are now). A scheduled request without a row raises
        ``KeyError`` wherever the table has a row in prefill."""
        computed, prefill_len = self._computed, self._prefill_len
        if self._same_layout and computed.tobytes() == prefill_len.tobytes():
            return False
        in_prefill = _less(computed, prefill_len, self._in_prefill)
        if not _count_nonzero(in_prefill):
            return False
        count = len(scheduled)
        if count > 1:
            found: Any = itemgetter(*scheduled)(row_of)
        elif count:
            found = (row_of[next(iter(scheduled))],)
        else:
            return False
        rows = np.fromiter(found, dtype=np.intp, count=count)
        return bool(_count_nonzero(in_prefill[rows]))


def rows_are_speculative_decodes(
    decode_draft_counts: np.ndarray, num_rows: int, num_drafts: int
) -> bool:
    """Whether each of the first ``num_rows`` rows is a decode of ``num_drafts``.

    ``decode_draft_counts`` is the V1 runner's per-row column for its
    attention metadata builders: a row's draft count where it schedules
    exactly one token plus its drafts, negative for a prefill chunk (a prompt
    chunk, or output tokens re-computed after preemption, which carry no
    drafts).

    Per step this copies the rows' bytes into a kept buffer and compares them
    with those of ``num_drafts`` repeated (an integer column has one byte
    pattern per value); the view, the buffer and the pattern are made again
    only when the column, the row count or the value changes.
    """
    column, rows, value, view, expected, source, copied, target = _last_uniform_check[0]
    if column is not decode_draft_counts or rows != num_rows or value != num_drafts:
        check = _uniform_check(decode_draft_counts, num_rows, num_drafts)
        _last_uniform_check[0] = check
        column, rows, value, view, expected, source, copied, target = check
    if source is not None:
        target[:] = source
        same: bool = copied == expected
        return same
    if expected is not None:
        same = view.tobytes() == expected
        return same
    if view is None:
        return False
    return not _count_nonzero(view != num_drafts)


#: The column, row count and value last checked; the view of those rows; the
#: bytes of the value repeated over them (None where bytes cannot say it); and
#: the rows as bytes (None: not contiguous), with the buffer they are copied to
#: and its view. One tuple, replaced whole, so a thread never sees half of an
#: update. A per-step caller may compare against it before calling.
UniformCheck = tuple[Any, int, int, Any, Any, Any, Any, Any]
LAST_UNIFORM_CHECK: list[UniformCheck] = [(None, -1, 0, None, None, None, None, None)]
_last_uniform_check = LAST_UNIFORM_CHECK


def _uniform_check(column: Any, num_rows: int, value: int) -> UniformCheck:
    """What :func:`rows_are_speculative_decodes` keeps for these three."""
    view = column[:num_rows]
    if len(view) != num_rows:
        return (column, num_rows, value, None, None, None, None, None)
    if not isinstance(view, np.ndarray) or view.dtype.kind not in "iu":
        return (column, num_rows, value, view, None, None, None, None)
    limits = np.iinfo(view.dtype)
    if not (isinstance(value, int | np.integer) and limits.min <= value <= limits.max):
        return (column, num_rows, value, view, None, None, None, None)
    expected = np.full(num_rows, value, dtype=view.dtype).tobytes()
    if not view.flags.c_contiguous:
        return (column, num_rows, value, view, expected, None, None, None)
    copied = bytearray(len(expected))
    source = view.data.cast("B")
    return (column, num_rows, value, view, expected, source, copied, memoryview(copied))


def rows_have_prior_state(computed: np.ndarray, num_rows: int) -> bool:
    """Without speculation: whether each of the first ``num_rows`` rows had
    computed a token before this step (one new token over prior state is a
    decode to the builders, the last token of a chunked prompt included)."""
    column, rows, view = _last_prior_state_check[0]
    if column is not computed or rows != num_rows:
        view = computed[:num_rows]
        if len(view) != num_rows:
            view = None
        _last_prior_state_check[0] = (computed, num_rows, view)
    if view is None:
        return False
    if isinstance(view, np.ndarray):
        # Every row nonzero, counted without a ufunc reduction.
        return bool(_count_nonzero(view) == num_rows)
    return bool(view.all())


#: The column and row count last checked, and the view of those rows (None:
#: the column has fewer); replaced whole, as ``_last_uniform_check``.
_last_prior_state_check: list[tuple[Any, int, Any]] = [(None, -1, None)]


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
