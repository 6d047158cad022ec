"""How a release's ``_prepare_inputs`` counts each row's drafts, read from its
source: only on drafting steps (0.20-0.31)? by which test (``DraftCounting``)?"""

from __future__ import annotations

import ast

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes.scheduled_rows import DraftCounting
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_RUNNER

_PREPARE_INPUTS = "GPUModelRunner._prepare_inputs"
#: The local that decides whether the step counts drafts.
_DECISION = "use_spec_decode"


def draft_counts_only_on_drafting_steps(sources: SourceReader) -> bool:
    """0.20-0.31: the rows' drafts are counted only on a step that schedules
    some; other steps see the last drafting step's counts. Assumed where the
    source says neither (the check it adds is exact either way)."""
    prepare = sources.function_node(V1_RUNNER, _PREPARE_INPUTS)
    return prepare is None or counts_drafts_only_on_drafting_steps(prepare)


def counts_drafts_only_on_drafting_steps(prepare_inputs: ast.AST) -> bool:
    """Whether the first ``use_spec_decode`` decision reads the step's
    scheduled drafts (not the speculative config); True where there is none."""
    decisions = [
        node
        for node in ast.walk(prepare_inputs)
        if isinstance(node, ast.Assign)
        and any(
            isinstance(target, ast.Name) and target.id == _DECISION
            for target in node.targets
        )
    ]
    if not decisions:
        return True
    first = min(decisions, key=lambda node: (node.lineno, node.col_offset))
    return "scheduled_spec_decode_tokens" in recognition.referenced_names(first.value)


_DRAFT_COLUMN = "num_decode_draft_tokens"


def recognise_draft_counting(prepare_inputs: ast.AST) -> DraftCounting | None:
    """How ``_prepare_inputs`` counts a row's drafts into ``num_decode_draft_tokens``:
    its condition compares computed with prompt length, or scheduled tokens
    with drafts; a store of 0 marks zero-draft decodes. None: neither or both.
    """
    past_prompt = plus_one = zero_draft = False
    for node in ast.walk(prepare_inputs):
        if isinstance(node, ast.If) and any(
            recognition.stores_into_subscript_of(statement, _DRAFT_COLUMN)
            for statement in node.body
        ):
            tested = recognition.referenced_names(node.test)
            past_prompt |= "num_prompt_tokens" in tested
            plus_one |= "num_scheduled_tokens" in tested
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and node.value.value == 0
            and recognition.stores_into_subscript_of(node, _DRAFT_COLUMN)
        ):
            zero_draft = True
    if past_prompt == plus_one:
        return None
    return DraftCounting(past_prompt=past_prompt, zero_draft_decodes=zero_draft)
