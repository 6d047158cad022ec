"""0.20-0.31: whether the runner's draft counts are written only on a step
that schedules drafts. Asked by the hooks (what they read) and the cases (how
the builders' column looks on a step after a drafting one)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from vllm_graphsafe import recognition
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_RUNNER

RUNNER_MODULE = V1_RUNNER
_PREPARE_INPUTS = "GPUModelRunner._prepare_inputs"
#: The local that decides whether the step counts drafts.
_DECISION = "use_spec_decode"


def draft_counts_only_on_drafting_steps(sources: SourceReader) -> bool:
    """0.20-0.31: ``_prepare_inputs`` counts the rows' drafts only on a step
    that schedules some (``use_spec_decode`` tests the scheduled drafts, not
    the speculative config); on any other step the column still holds the last
    drafting step's counts. Where the source says neither, assume so (the
    check it adds is exact either way)."""

    def work() -> bool:
        lines = sources.lines_naming(RUNNER_MODULE, _PREPARE_INPUTS, _DECISION)
        if lines is not None:
            assignments = [
                assignment
                for line in lines
                for node in line
                for assignment in _decisions(node)
            ]
            if len(assignments) <= 1:  # else: the first in the def's own order
                return not assignments or _counts_from_scheduled(assignments[0])
        prepare = sources.function_node(RUNNER_MODULE, _PREPARE_INPUTS)
        return prepare is None or counts_drafts_only_on_drafting_steps(prepare)

    return sources.kept_answer(
        RUNNER_MODULE, "drafts_counted_when_drafting", (_PREPARE_INPUTS,), work
    )


def counts_drafts_only_on_drafting_steps(prepare_inputs: ast.AST) -> bool:
    """Whether this ``_prepare_inputs`` decides to count drafts from the step's
    scheduled drafts; True where it says neither."""
    for assignment in _decisions(prepare_inputs):
        return _counts_from_scheduled(assignment)
    return True


def _decisions(node: ast.AST) -> Iterator[ast.Assign]:
    """The assignments to ``use_spec_decode`` in ``node``, in ``ast.walk``'s order."""
    for child in ast.walk(node):
        if isinstance(child, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == _DECISION
            for target in child.targets
        ):
            yield child


def _counts_from_scheduled(decision: ast.Assign) -> bool:
    return "scheduled_spec_decode_tokens" in recognition.referenced_names(
        decision.value
    )
