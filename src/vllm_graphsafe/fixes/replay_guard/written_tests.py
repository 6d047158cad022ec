"""The CPU tests the backport writes into a tree's ``tests/`` for replay-guard:
the files of ``written/``, joined and set per tree.

They exercise the edited vLLM code directly (no GPU, no model, no plugin):
vLLM's ``CUDAGraphWrapper`` with a captured entry whose replay is a recorder,
and Model Runner V2's own ``execute_model`` run to its replay with mocks for
what it reads on the way. They pass on the edited tree and fail on the
pristine one (which replays every such step, and has no helper to ask). Their
oracles are the metadata they build (how many rows each group's builder ran as
prefills), never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.fixes.replay_guard import FIX
from vllm_graphsafe.tree_edits.plan import render_written_tests


def replay_guard(*, flag: str, mrv2: bool) -> str:
    sections = ["wrapper", "mrv2"] if mrv2 else ["wrapper"]
    return render_written_tests(FIX.package, sections, UNIFORM_FLAG=flag)
