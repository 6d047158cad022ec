"""Written after ``dispatch.py`` where the tree counts drafts only on drafting
steps."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.v1_phase_dispatch.written.dispatch import (
        MAX_ROWS,
        _classification,
        _runner,
    )


# -- draft counts written only on drafting steps --------------------------------


def test_a_step_without_drafts_reads_no_stale_draft_counts() -> None:
    """This tree's _prepare_inputs leaves the last drafting step's counts in
    place on a step that schedules no drafts (a K+1-token prompt chunk alone):
    such a step is a prefill, whatever the counts still say."""
    q = 4
    runner = _runner([(25, q - 1), (31, q - 1)], q)
    runner.input_batch.spec_token_ids = [[] for _ in range(MAX_ROWS)]

    assert runner._has_prefill_request(2) is True
    assert _classification(runner, 2) is False
