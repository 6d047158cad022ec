"""Written after ``dispatch.py`` where drafts are counted on drafting steps only."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.v1_phase_dispatch.written.dispatch import (
        MAX_ROWS,
        _classification,
        _runner,
    )


def test_a_step_without_drafts_reads_no_stale_draft_counts() -> None:
    """A K+1-token prompt chunk alone is a prefill, whatever stale counts say."""
    q = 4
    runner = _runner([(25, q - 1), (31, q - 1)], q)
    runner.input_batch.spec_token_ids = [[] for _ in range(MAX_ROWS)]

    assert runner._has_prefill_request(2) is True
    assert _classification(runner, 2) is False
