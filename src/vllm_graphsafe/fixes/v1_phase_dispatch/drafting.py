"""0.20-0.31: whether the runner's draft counts are written only on a step
that schedules drafts. Asked by the hooks (what they read) and the cases (how
the builders' column looks on a step after a drafting one)."""

from __future__ import annotations

import ast

from vllm_graphsafe import recognition
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_RUNNER

RUNNER_MODULE = V1_RUNNER
_PREPARE_INPUTS = "GPUModelRunner._prepare_inputs"


def draft_counts_only_on_drafting_steps(sources: SourceReader) -> bool:
    """0.20-0.31: ``_prepare_inputs`` counts the rows' drafts only on a step
    that schedules some (``use_spec_decode`` tests the scheduled drafts, not
    the speculative config); on any other step the column still holds the last
    drafting step's counts. Where the source says neither, assume so (the
    check it adds is exact either way)."""

    def work() -> bool:
        prepare = sources.function_node(RUNNER_MODULE, _PREPARE_INPUTS)
        return prepare is None or counts_drafts_only_on_drafting_steps(prepare)

    return sources.kept_answer(
        RUNNER_MODULE, "drafts_counted_when_drafting", (_PREPARE_INPUTS,), work
    )


def counts_drafts_only_on_drafting_steps(prepare_inputs: ast.AST) -> bool:
    """Whether this ``_prepare_inputs`` decides to count drafts from the step's
    scheduled drafts; True where it says neither."""
    for node in ast.walk(prepare_inputs):
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "use_spec_decode"
            for target in node.targets
        ):
            used = recognition.referenced_names(node.value)
            return "scheduled_spec_decode_tokens" in used
    return True
