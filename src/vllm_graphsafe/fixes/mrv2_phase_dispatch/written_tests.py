"""The CPU tests the backport writes into a tree's ``tests/`` for mrv2-phase-dispatch:
the files of ``written/``, joined and set per tree.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the batch they build, never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.fixes.mrv2_phase_dispatch import FIX
from vllm_graphsafe.tree_edits.plan import render_written_tests


def mrv2_phase_dispatch(
    upstream_names: bool, computed_np: bool, prefill_np: bool
) -> str:
    helper = "upstream_helper" if upstream_names else "fork_helper"
    return render_written_tests(
        FIX.package,
        ["dispatch", helper],
        COMPUTED_IS_ARRAY=computed_np,
        PREFILL_LEN_IS_ARRAY=prefill_np,
    )
