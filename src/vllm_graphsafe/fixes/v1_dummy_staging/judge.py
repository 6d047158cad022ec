"""What the V1 dummy-staging fix reads of vLLM's source, and its verdict there."""

from __future__ import annotations

from typing import Any

from vllm_graphsafe import recognition
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.judging import (
    FixJudge,
    Layout,
    Point,
    Requirement,
    SetsAttribute,
    TakesParameters,
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_CP_UTILS, V1_INPUT_BATCH, V1_RUNNER

DUMMY_RUN = "GPUModelRunner._dummy_run"
DCP_HELPER = "prepare_dcp_dummy_context_metadata"
BUILD_METADATA = "GPUModelRunner._build_attention_metadata"
#: The hooks' roles (:mod:`.hooks` installs one per point).
DUMMY_RUN_ROLE = "consistent dummy run"
STAGING_ROLE = "staged metadata"

#: The DCP helper's parameters the staging reads or replaces.
DCP_HELPER_PARAMETERS = (
    "positions",
    "query_start_loc",
    "num_reqs",
    "num_tokens_unpadded",
    "dcp_dummy_context_len",
    "query_pos",
)
#: The metadata build's parameters the staging reads (releases before DCP staging).
BUILD_METADATA_PARAMETERS = ("num_reqs", "num_tokens")
#: What upstream's fix stores into for the dummy rows: computed lengths, positions.
_STAGED_COLUMNS = ("num_computed_tokens_cpu", "positions")


def layout(sources: SourceReader) -> dict[str, Any]:
    """``stages_at_dcp_helper``: ``_dummy_run`` calls the DCP helper after
    staging ``seq_lens`` (0.27+); before, the staging is read at the build of
    the attention metadata."""
    return {"stages_at_dcp_helper": sources.calls(V1_RUNNER, DUMMY_RUN, DCP_HELPER)}


def points(layout: Layout) -> list[Point]:
    staged_at = DCP_HELPER if layout["stages_at_dcp_helper"] else BUILD_METADATA
    return [
        Point(V1_RUNNER, DUMMY_RUN, DUMMY_RUN_ROLE),
        Point(V1_RUNNER, staged_at, STAGING_ROLE, caller=DUMMY_RUN),
    ]


def reads(layout: Layout) -> list[Requirement]:
    read = [
        (V1_RUNNER, "GPUModelRunner", "input_batch"),
        (V1_RUNNER, "GPUModelRunner", "optimistic_seq_lens_cpu"),
        (V1_RUNNER, "GPUModelRunner", "seq_lens"),
        (V1_INPUT_BATCH, "InputBatch", "num_computed_tokens_cpu"),
    ]
    found: list[Requirement] = [SetsAttribute(*where, DUMMY_RUN) for where in read]
    if layout["stages_at_dcp_helper"]:
        return [
            *found,
            TakesParameters(V1_CP_UTILS, DCP_HELPER, DCP_HELPER_PARAMETERS, DCP_HELPER),
        ]
    return [
        *found,
        SetsAttribute(V1_RUNNER, "GPUModelRunner", "query_start_loc", BUILD_METADATA),
        SetsAttribute(V1_RUNNER, "GPUModelRunner", "positions", BUILD_METADATA),
        TakesParameters(
            V1_RUNNER, BUILD_METADATA, BUILD_METADATA_PARAMETERS, BUILD_METADATA
        ),
    ]


def native_reason(sources: SourceReader) -> str | None:
    dummy_run = sources.function_node(V1_RUNNER, DUMMY_RUN)
    if dummy_run is None:
        return None
    candidates = [DUMMY_RUN] + [
        f"GPUModelRunner.{name}" for name in recognition.self_methods_called(dummy_run)
    ]
    for qualname in candidates:
        node = sources.function_node(V1_RUNNER, qualname)
        if node is not None and all(
            recognition.stores_into_subscript_of(node, column)
            for column in _STAGED_COLUMNS
        ):
            return f"{qualname} stages computed lengths and positions"
    return None


def behaviour(sources: SourceReader) -> Evidence:
    from vllm_graphsafe.fixes.v1_dummy_staging.behaviour import judge_source

    return judge_source(sources)


def live() -> Evidence | None:
    from vllm_graphsafe.fixes.v1_dummy_staging.behaviour import judge_live

    return judge_live()


JUDGE = FixJudge(
    native_summary="the V1 runner's dummy runs stage lengths and positions that agree",
    behaviour=behaviour,
    native_reason=native_reason,
    points=points,
    layout=layout,
    reads=reads,
    live=live,
)
