"""The CPU tests the backport writes into a tree's ``tests/`` for v1-dummy-staging:
the files of ``written/``, joined and set per tree.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the batch they build, never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.fixes.v1_dummy_staging import FIX
from vllm_graphsafe.tree_edits.plan import render_written_tests


def v1_dummy_staging(dcp: bool, seq_lens_layout: str) -> str:
    sections = ["staging", "dcp"] if dcp else ["staging"]
    return render_written_tests(FIX.package, sections, SEQ_LENS_LAYOUT=seq_lens_layout)
