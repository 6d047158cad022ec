"""What the Model Runner V2 dispatch fix reads of vLLM's source, and its verdict."""

from __future__ import annotations

from typing import Any, NamedTuple

from vllm_graphsafe import recognition
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.judging import (
    FixJudge,
    Layout,
    Point,
    Requirement,
    SetsAttribute,
    TakesParameters,
    Verdict,
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import (
    MRV2_AUTOREGRESSIVE_SPECULATOR,
    MRV2_EAGLE_SPECULATOR,
    MRV2_INPUT_BATCH,
    MRV2_MULTI_MODULE_MTP_SPECULATOR,
    MRV2_RUNNER,
    MRV2_SPECULATORS,
    MRV2_STATES,
)

RUNNER_STEP = "GPUModelRunner.execute_model"
#: The shape rule, wrapped by name in each module that calls it.
SHAPE_RULE = "get_uniform_token_count"
#: The batch's own pre-step phase column (0.22-0.27).
BATCH_PHASE_COLUMN = "is_prefilling_np"
#: vLLM's pre-step phase question, asked in ``prepare_inputs`` (0.20).
PRE_STEP_QUESTION = "RequestState.any_prefills"
PREPARE_INPUTS = "GPUModelRunner.prepare_inputs"
#: The hooks' roles (:mod:`.hooks` installs one per point).
TARGET_STEP_ROLE = "target step"
TARGET_COUNT_ROLE = "target count"
DRAFT_STEP_ROLE = "draft step"
DRAFT_COUNT_ROLE = "draft count"
PRE_STEP_ROLE = "pre-step answers"
#: Calls in ``execute_model`` that mean the release classifies by phase itself.
_NATIVE_MARKERS = (
    "gather_batch_req_state",
    "get_uniform_decode_token_count",
    "_get_uniform_decode_token_count",
)


class DraftPrefillDispatcher(NamedTuple):
    """A speculator whose ``propose`` classifies the draft prefill by shape."""

    module: str
    propose: str
    #: Hooked only in releases without this module (an older layout).
    only_without: str | None = None


#: Every speculator module known to compute ``get_uniform_token_count`` for its
#: draft prefill. Hook points exist only for those of the installed release.
DRAFT_PREFILL_DISPATCHERS = (
    # eagle/: before the autoregressive/ split (e.g. 0.20, 0.22) Eagle and MTP
    # run here; from 0.24 on this module only subclasses the autoregressive one.
    DraftPrefillDispatcher(
        MRV2_EAGLE_SPECULATOR,
        "EagleSpeculator.propose",
        only_without=MRV2_AUTOREGRESSIVE_SPECULATOR,
    ),
    # autoregressive/ (0.24-0.27): Eagle, MTP and Gemma4 MTP subclass this one.
    DraftPrefillDispatcher(
        MRV2_AUTOREGRESSIVE_SPECULATOR, "AutoRegressiveSpeculator.propose"
    ),
    # multi_module_mtp/ (0.24-0.27).
    DraftPrefillDispatcher(
        MRV2_MULTI_MODULE_MTP_SPECULATOR, "MultiModuleMTPSpeculator.propose"
    ),
)


def layout(sources: SourceReader) -> dict[str, Any]:
    """``dispatchers``: the speculators' draft-prefill ``propose`` to hook
    (module, qualname); ``pre_step_answers``: the 0.20 layout, whose batch has
    no phase column and whose ``prepare_inputs`` asks vLLM's own pre-step
    question (any other layout is read as having the column, and fails naming
    it when it does not); ``speculators``: this release's speculator modules."""
    dispatchers = [
        [d.module, d.propose]
        for d in DRAFT_PREFILL_DISPATCHERS
        if sources.exists(d.module)
        and not (d.only_without and sources.exists(d.only_without))
    ]
    pre_step_answers = not sources.sets_attribute(
        MRV2_INPUT_BATCH, "InputBatch", BATCH_PHASE_COLUMN
    ) and sources.calls(MRV2_RUNNER, PREPARE_INPUTS, PRE_STEP_QUESTION.split(".")[1])
    return {
        "dispatchers": dispatchers,
        "pre_step_answers": bool(dispatchers) and pre_step_answers,
        "speculators": [m for m, _ in MRV2_SPECULATORS if sources.exists(m)],
    }


def points(layout: Layout) -> list[Point]:
    found = [
        Point(MRV2_RUNNER, RUNNER_STEP, TARGET_STEP_ROLE),
        Point(MRV2_RUNNER, SHAPE_RULE, TARGET_COUNT_ROLE, caller=RUNNER_STEP),
    ]
    if layout["pre_step_answers"]:
        found.append(Point(MRV2_STATES, PRE_STEP_QUESTION, PRE_STEP_ROLE))
    for module, propose in layout["dispatchers"]:
        found += [
            Point(module, propose, DRAFT_STEP_ROLE),
            Point(module, SHAPE_RULE, DRAFT_COUNT_ROLE, caller=propose),
        ]
    return found


def reads(layout: Layout) -> list[Requirement]:
    found: list[Requirement] = [
        SetsAttribute(MRV2_RUNNER, "GPUModelRunner", "req_states", SHAPE_RULE)
    ]
    found += [
        SetsAttribute(MRV2_STATES, "RequestState", name, SHAPE_RULE)
        for name in ("req_id_to_index", "num_computed_prefill_tokens", "prefill_len")
    ]
    if not layout["dispatchers"]:
        return found
    if layout["pre_step_answers"]:
        return [
            *found,
            SetsAttribute(MRV2_INPUT_BATCH, "InputBatch", "idx_mapping_np", SHAPE_RULE),
            TakesParameters(
                MRV2_STATES, PRE_STEP_QUESTION, ("idx_mapping_np",), SHAPE_RULE
            ),
        ]
    return found + [
        SetsAttribute(MRV2_INPUT_BATCH, "InputBatch", name, SHAPE_RULE)
        for name in ("num_reqs", BATCH_PHASE_COLUMN)
    ]


def native_reason(sources: SourceReader) -> str | None:
    node = sources.function_node(MRV2_RUNNER, RUNNER_STEP)
    if node is None:
        return None
    for marker in _NATIVE_MARKERS:
        if recognition.calls_name(node, marker):
            return (
                f"{RUNNER_STEP} classifies by request phase ({marker}, "
                "vllm-project/vllm#51865)"
            )
    return None


def behaviour(sources: SourceReader) -> Evidence:
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.behaviour import judge_source

    return judge_source(sources)


def live(draft: bool = True) -> Evidence | None:
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.behaviour import judge_live

    return judge_live(draft)


def live_modules(verdict: Verdict | None) -> list[str]:
    speculators = [] if verdict is None else verdict.layout.get("speculators", [])
    return [MRV2_RUNNER, MRV2_INPUT_BATCH, *speculators]


JUDGE = FixJudge(
    native_summary=(
        "Model Runner V2's target and draft-prefill dispatch keep prompt chunks "
        "off the FULL decode graph"
    ),
    behaviour=behaviour,
    native_reason=native_reason,
    points=points,
    layout=layout,
    reads=reads,
    live=live,
    # The target's cases alone (the draft's would be compiled from the same
    # source the verdict was judged on): about a millisecond.
    confirm=lambda: live(draft=False),
    live_modules=live_modules,
)
