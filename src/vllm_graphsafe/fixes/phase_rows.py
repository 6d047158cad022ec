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

from collections.abc import Container, Hashable, Iterable, Mapping

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


def rows_are_speculative_decodes(
    decode_draft_counts: np.ndarray, num_rows: int, num_drafts: int
) -> bool:
    """Whether each of the first ``num_rows`` rows is a decode of ``num_drafts``.

    ``decode_draft_counts`` is the V1 runner's per-row column for its
    attention metadata builders: a row's draft count where it schedules
    exactly one token plus its drafts, negative for a prefill chunk (a prompt
    chunk, or output tokens re-computed after preemption, which carry no
    drafts).
    """
    counts = decode_draft_counts[:num_rows]
    return len(counts) == num_rows and not _count_nonzero(counts != num_drafts)


def rows_have_prior_state(computed: np.ndarray, num_rows: int) -> bool:
    """Without speculation: whether each of the first ``num_rows`` rows had
    computed a token before this step (one new token over prior state is a
    decode to the builders, the last token of a chunked prompt included)."""
    rows = computed[:num_rows]
    return len(rows) == num_rows and bool(rows.all())


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
