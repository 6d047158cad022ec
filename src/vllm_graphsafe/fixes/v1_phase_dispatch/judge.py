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
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import (
    COMPILATION_CONFIG,
    PARALLEL_CONFIG,
    SCHEDULER_OUTPUT,
    V1_INPUT_BATCH,
    V1_RUNNER,
    V1_WORKER,
)

DISPATCH = "GPUModelRunner._determine_batch_execution_and_padding"
SHAPE_RULE = "GPUModelRunner._is_uniform_decode"
WORKER_EXECUTE = "Worker.execute_model"
PREPARE_INPUTS = "GPUModelRunner._prepare_inputs"
#: The hooks' roles (:mod:`.hooks` installs one per point).
SHAPE_RULE_ROLE = "phase-aware shape rule"
HOLD_STEPS_ROLE = "step-holding execute_model"

_COMPUTED_NAMES = {"num_computed_tokens_cpu", "num_computed_tokens"}


def layout(sources: SourceReader) -> dict[str, Any]:
    """``classifies_early``: with pipeline + sequence parallel the worker calls
    the dispatch before the runner updates its rows (0.20-0.31); there
    ``draft_counting`` is how ``_prepare_inputs`` counts drafts (None:
    unrecognised). ``stale_draft_counts``: the draft counts are written only
    on steps that schedule drafts (0.20-0.31)."""
    early = sources.module_calls(V1_WORKER, DISPATCH.rsplit(".", 1)[-1])
    prepare = sources.function_node(V1_RUNNER, PREPARE_INPUTS) if early else None
    counting = None if prepare is None else recognise_draft_counting(prepare)
    return {
        "classifies_early": early,
        "draft_counting": None if counting is None else vars(counting),
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
    # What the early path reads of a scheduler output.
    read += [
        (SCHEDULER_OUTPUT, "SchedulerOutput", "num_scheduled_tokens"),
        (SCHEDULER_OUTPUT, "SchedulerOutput", "scheduled_spec_decode_tokens"),
        (SCHEDULER_OUTPUT, "SchedulerOutput", "scheduled_new_reqs"),
        (SCHEDULER_OUTPUT, "SchedulerOutput", "scheduled_cached_reqs"),
        (SCHEDULER_OUTPUT, "NewRequestData", "req_id"),
        (SCHEDULER_OUTPUT, "NewRequestData", "num_computed_tokens"),
        (SCHEDULER_OUTPUT, "NewRequestData", "prompt_token_ids"),
        (SCHEDULER_OUTPUT, "NewRequestData", "prompt_embeds"),
        (SCHEDULER_OUTPUT, "CachedRequestData", "req_ids"),
        (SCHEDULER_OUTPUT, "CachedRequestData", "num_computed_tokens"),
    ]
    return found + [SetsAttribute(*where, SHAPE_RULE) for where in read]


def native_reason(sources: SourceReader) -> str | None:
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
        if recognition.compares_names(node, _COMPUTED_NAMES, {"num_prompt_tokens"}):
            return f"{qualname} compares computed with prompt lengths"
        if recognition.compares_names(
            node, {"num_decode_draft_tokens"}, {"uniform_decode_query_len"}
        ):
            return f"{qualname} compares draft counts with the decode query length"
    return None


def behaviour(sources: SourceReader) -> Evidence:
    from vllm_graphsafe.fixes.v1_phase_dispatch.behaviour import judge_source

    return judge_source(sources)


def live() -> Evidence | None:
    from vllm_graphsafe.fixes.v1_phase_dispatch.behaviour import judge_live

    return judge_live()


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
