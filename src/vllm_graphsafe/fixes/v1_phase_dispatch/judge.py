"""What the V1 dispatch fix reads of vLLM's source, and its verdict there."""

from __future__ import annotations

from typing import Any

from vllm_graphsafe import recognition
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.fixes.v1_phase_dispatch.drafting import (
    draft_counts_only_on_drafting_steps,
    recognise_draft_counting,
)
from vllm_graphsafe.judging import (
    FixJudge,
    Layout,
    Point,
    Requirement,
    SetsAttribute,
    TakesParameters,
    imported_class,
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import (
    COMPILATION_CONFIG,
    PARALLEL_CONFIG,
    SCHEDULER_OUTPUT,
    V1_INPUT_BATCH,
    V1_RUNNER,
    V1_RUNNER_CLASS,
    V1_WORKER,
)

DISPATCH = "GPUModelRunner._determine_batch_execution_and_padding"
SHAPE_RULE = "GPUModelRunner._is_uniform_decode"
WORKER_EXECUTE = "Worker.execute_model"
PREPARE_INPUTS = "GPUModelRunner._prepare_inputs"
#: The hooks' roles (:mod:`.hooks` installs one per point).
SHAPE_RULE_ROLE = "phase-aware shape rule"
HOLD_STEPS_ROLE = "step-holding execute_model"

_DISPATCH_NAME = DISPATCH.rsplit(".", 1)[-1]
_COMPUTED_NAMES = {"num_computed_tokens_cpu", "num_computed_tokens"}
_PROMPT_NAMES = {"num_prompt_tokens"}
_DRAFT_COUNT_NAMES = {"num_decode_draft_tokens"}
_QUERY_LEN_NAMES = {"uniform_decode_query_len"}
#: What the early path reads of a scheduler output, by class.
_STEP_FIELDS = {
    "SchedulerOutput": (
        "num_scheduled_tokens",
        "scheduled_spec_decode_tokens",
        "scheduled_new_reqs",
        "scheduled_cached_reqs",
    ),
    "NewRequestData": (
        "req_id",
        "num_computed_tokens",
        "prompt_token_ids",
        "prompt_embeds",
    ),
    "CachedRequestData": ("req_ids", "num_computed_tokens"),
}


def layout(sources: SourceReader) -> dict[str, Any]:
    """``classifies_early``: with pipeline + sequence parallel the worker calls
    the dispatch before the runner updates its rows (0.20-0.31); there
    ``draft_counting`` is how ``_prepare_inputs`` counts drafts (None:
    unrecognised). ``stale_draft_counts``: the draft counts are written only
    on steps that schedule drafts (0.20-0.31)."""
    early = sources.module_calls(V1_WORKER, _DISPATCH_NAME)
    counting = None
    if early:
        prepare = sources.function_node(V1_RUNNER, PREPARE_INPUTS)
        found = None if prepare is None else recognise_draft_counting(prepare)
        counting = None if found is None else vars(found)
    return {
        "classifies_early": early,
        "draft_counting": counting,
        "stale_draft_counts": draft_counts_only_on_drafting_steps(sources),
    }


def points(layout: Layout) -> list[Point]:
    found = [Point(V1_RUNNER, SHAPE_RULE, SHAPE_RULE_ROLE, caller=DISPATCH)]
    if layout["classifies_early"]:
        found.append(Point(V1_WORKER, WORKER_EXECUTE, HOLD_STEPS_ROLE))
    return found


def reads(layout: Layout) -> list[Requirement]:
    read = [
        (V1_RUNNER, "GPUModelRunner", "input_batch"),
        (V1_INPUT_BATCH, "InputBatch", "num_computed_tokens_cpu"),
        (V1_RUNNER, "GPUModelRunner", "num_decode_draft_tokens"),
    ]
    if layout["stale_draft_counts"]:
        read.append((V1_INPUT_BATCH, "InputBatch", "spec_token_ids"))
    found: list[Requirement] = [SetsAttribute(*where, SHAPE_RULE) for where in read]
    if not layout["classifies_early"]:
        return found
    # What the rule and the worker's hook read where the worker classifies early.
    found += [
        SetsAttribute(V1_WORKER, "Worker", "model_runner", WORKER_EXECUTE),
        TakesParameters(
            V1_WORKER, WORKER_EXECUTE, ("scheduler_output",), WORKER_EXECUTE
        ),
    ]
    read = [
        (V1_RUNNER, "GPUModelRunner", "parallel_config"),
        (V1_RUNNER, "GPUModelRunner", "compilation_config"),
        (COMPILATION_CONFIG, "PassConfig", "enable_sp"),
        (PARALLEL_CONFIG, "ParallelConfig", "pipeline_parallel_size"),
        # Prompt lengths of cached requests, where drafts count past the prompt.
        (V1_RUNNER, "GPUModelRunner", "requests"),
        (V1_INPUT_BATCH, "CachedRequestState", "num_prompt_tokens"),
    ]
    read += [
        (SCHEDULER_OUTPUT, owner, field)
        for owner, fields in _STEP_FIELDS.items()
        for field in fields
    ]
    return found + [SetsAttribute(*where, SHAPE_RULE) for where in read]


def native_reason(sources: SourceReader) -> str | None:
    """The V1 runner's own classification reads each row's phase: it compares
    computed with prompt lengths, or the builders' draft counts with the decode
    query length."""
    dispatch = sources.function_node(V1_RUNNER, DISPATCH)
    candidates = [SHAPE_RULE, DISPATCH]
    if dispatch is not None:
        candidates += [
            f"GPUModelRunner.{name}"
            for name in recognition.self_methods_called(dispatch)
        ]
    for qualname in dict.fromkeys(candidates):
        node = sources.function_node(V1_RUNNER, qualname)
        if node is None:
            continue
        if recognition.compares_names(node, _COMPUTED_NAMES, _PROMPT_NAMES):
            return f"{qualname} compares computed with prompt lengths"
        if recognition.compares_names(node, _DRAFT_COUNT_NAMES, _QUERY_LEN_NAMES):
            return f"{qualname} compares draft counts with the decode query length"
    return None


def behaviour(sources: SourceReader) -> Evidence:
    from vllm_graphsafe.fixes.v1_phase_dispatch.behaviour import judge_source

    return judge_source(sources)


def live() -> Evidence | None:
    runner_class = imported_class(V1_RUNNER, V1_RUNNER_CLASS)
    if runner_class is None:
        return None
    from vllm_graphsafe.fixes.v1_phase_dispatch.behaviour import judge_live

    return judge_live(runner_class, SourceReader())


JUDGE = FixJudge(
    native_summary=(
        "the V1 runner's dispatch keeps prompt chunks off the FULL decode graph"
    ),
    behaviour=behaviour,
    native_reason=native_reason,
    points=points,
    layout=layout,
    reads=reads,
    live=live,
)
