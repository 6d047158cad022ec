"""The CPU tests the backport writes into a tree's ``tests/`` for v1-phase-dispatch:
the files of ``written/``, joined and set per tree.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the rows they state, never the code under test. They test the edit
where it is made: the predicate the backport adds, and the dispatch's
classification right after the call that the backport guards, as the rest of
the dispatch consumes it. The dispatch runs on a runner that holds only what
the classification reads and stops at its first read of anything else, so a
fork that reads more in the rest of its dispatch does not break them.
"""

from __future__ import annotations

from vllm_graphsafe.fixes.v1_phase_dispatch import FIX
from vllm_graphsafe.tree_edits.plan import render_written_tests


def v1_phase_dispatch(
    classification: str = "uniform_decode",
    *,
    scheduled_step: bool = False,
    worker_classifies_early: bool = False,
    drafts_count_past_prompt: bool = False,
    drafts_counted_when_drafting: bool = False,
) -> str:
    """The tests for a tree whose dispatch names its classification
    ``classification``; with ``scheduled_step``, those of the step's scheduler
    output too (the dispatch is handed the step), whose drafts count where a
    row is past its prompt if ``drafts_count_past_prompt``, else where it
    schedules exactly 1 + its drafts; with ``worker_classifies_early``, those
    of the worker's own early dispatch; with ``drafts_counted_when_drafting``,
    that a step without drafts is not read from the last drafting step's
    counts."""
    sections = {
        "dispatch": True,
        "scheduled_step": scheduled_step,
        "drafting_steps_only": drafts_counted_when_drafting,
        "worker": worker_classifies_early,
    }
    past_prompt = {"DRAFTS_COUNT_PAST_PROMPT": drafts_count_past_prompt}
    return render_written_tests(
        FIX.package,
        [name for name, wanted in sections.items() if wanted],
        CLASSIFICATION=classification,
        **(past_prompt if scheduled_step else {}),
    )
