# <!-- generated:facts:replay-guard -->
# replay-guard: Replay guard: no FULL decode graph over a step holding a prefill.
# What: Where a FULL CUDA graph captured for uniform decode is about to replay (V1: the
#   FULL CUDAGraphWrapper; Model Runner V2: the runner's and the speculators'
#   decode-graph replays), the step's own attention metadata is read: one num_prefills
#   per KV-cache group, as the metadata builders classified the rows, with no GPU
#   synchronisation. If a group holds a prefill row the step runs without the graph
#   (eagerly, same padded token count), is counted, and a warning with the step's shape
#   is logged once per process. Independent of the dispatch fixes; genuine decode
#   replays as before.
# Why: Any way into the decode graph the dispatch fixes do not cover (a fork's own
#   dispatch, a data-parallel peer's agreement, a native fix with a gap) replays it over
#   prefill metadata: hybrid (GDN/Mamba) models silently corrupt their recurrent state.
#   An assert there would stop the server; the guard serves the step right.
# Binds to: CUDAGraphWrapper.__call__ (every FULL wrapper: the V1 runner's model, its
#   DBO wrapper's); Model Runner V2: ModelCudaGraphManager.run_fullgraph and
#   CudaGraphManager.run_fullgraph, where execute_model, a speculator's propose or its
#   draft decode loop replay in an if/else whose else is their eager path (the guard
#   reads the metadata that else runs on, the drafter's own where it builds one, and
#   runs that else)
# Upstream: vllm-project/vllm#55123
# Delete when: vLLM's FULL-graph replay itself runs a step whose attention metadata
#   holds a prefill without the decode graph
# (made from the facts in this folder's __init__.py by
# `python -m vllm_graphsafe.catalogue --write`: edit those, not this)
# <!-- /generated:facts:replay-guard -->
"""The replay guard at ``CUDAGraphWrapper.__call__`` (V1; MRV2: :mod:`.mrv2`).

The step runs the wrapper's runnable with the padded inputs, so TP/DP/EP
collectives keep their shapes."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

from vllm_graphsafe import counts
from vllm_graphsafe.fixes.replay_guard import FELL_BACK, FIX, REPLAYED
from vllm_graphsafe.fixes.replay_guard.common import WARN_ONCE
from vllm_graphsafe.fixes.replay_guard.judge import (
    REPLAY_ROLE,
    TARGET_REPLAY_ROLE,
    WRAPPER_CALL,
    WRAPPER_ROLE,
)
from vllm_graphsafe.fixes.replay_guard.logic import GroupPrefills
from vllm_graphsafe.hook_points import Factory, HookPoint, OnFailure, ReplaceHook
from vllm_graphsafe.judging import Verdict
from vllm_graphsafe.vllm_layout import (
    COMPILATION_CONFIG,
    FORWARD_CONTEXT,
    UNIFORM_BATCH_FLAGS,
    load_name,
)

PATCH_ID = FIX.id
_READING = (
    "CUDAGraphWrapper.runtime_mode and runnable, the forward context's "
    "cudagraph_runtime_mode, batch_descriptor and attn_metadata (num_prefills)"
)


def bind_guarded_wrapper_call(original: Any, on_failure: OnFailure) -> Any:
    parameters = list(inspect.signature(original).parameters.values())
    kinds = [parameter.kind for parameter in parameters]
    if kinds != [
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ]:
        raise TypeError(f"{WRAPPER_CALL} is not (self, *args, **kwargs)")
    modes = load_name(COMPILATION_CONFIG, "CUDAGraphMode")
    full, eager = modes.FULL, modes.NONE
    available = load_name(FORWARD_CONTEXT, "is_forward_context_available")
    current = load_name(FORWARD_CONTEXT, "get_forward_context")
    descriptor_class = load_name(FORWARD_CONTEXT, "BatchDescriptor")
    names = {field.name for field in dataclasses.fields(descriptor_class)}
    flag = next((flag for flag in UNIFORM_BATCH_FLAGS if flag in names), None)
    if flag is None:
        raise TypeError(
            f"BatchDescriptor has none of {UNIFORM_BATCH_FLAGS}: the guard cannot "
            "tell a decode graph from a mixed one"
        )
    count = counts.STATS.counter(PATCH_ID)
    readers: dict[int, GroupPrefills] = {}

    @functools.wraps(original)
    def guarded_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.runtime_mode is not full:
            return original(self, *args, **kwargs)
        context = None
        try:
            if available():
                step = current()
                if (
                    step.cudagraph_runtime_mode is full
                    and (descriptor := step.batch_descriptor) is not None
                    and getattr(descriptor, flag)
                ):
                    reader = readers.get(id(self))
                    if reader is None:
                        reader = readers.setdefault(id(self), GroupPrefills())
                    if reader.holds_prefill(step.attn_metadata):
                        context = step
                        count(FELL_BACK)
                        WARN_ONCE(
                            "a FULL decode CUDA graph",
                            reader,
                            descriptor,
                            step.attn_metadata,
                        )
                    else:
                        count(REPLAYED)
        except Exception as error:
            on_failure(error, _READING)
            return original(self, *args, **kwargs)
        if context is None:
            return original(self, *args, **kwargs)
        # NONE for the call: inner PIECEWISE wrappers and FULL-aware layers
        # then run eagerly too.
        context.cudagraph_runtime_mode = eager
        try:
            return self.runnable(*args, **kwargs)
        finally:
            context.cudagraph_runtime_mode = full

    return guarded_call


def hook_points(verdict: Verdict) -> list[HookPoint]:
    from vllm_graphsafe.fixes.replay_guard import mrv2

    factories: dict[str, Factory] = {
        WRAPPER_ROLE: bind_guarded_wrapper_call,
        TARGET_REPLAY_ROLE: functools.partial(
            mrv2.bind_guarded_replay, require_site=True
        ),
        REPLAY_ROLE: mrv2.bind_guarded_replay,
    }
    return [
        ReplaceHook(point.module, point.qualname, factories[point.role])
        for point in verdict.points
    ]
