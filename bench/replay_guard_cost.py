"""The replay guard's cost per replayed decode step, beside the replay it guards.

A FULL decode graph replays on every genuine decode step; the guard reads the
step's attention metadata first. Each case is timed the way the replay runs,
on the release's own classes, counting into counts pages as a served process
does (``dispatch_cost.counting_as_a_server_does``):

``replay_v1.vllm``   vLLM's ``CUDAGraphWrapper.__call__`` (FULL, a uniform
                     batch descriptor, its entry captured, the graph's
                     ``replay`` a no-op): the Python side of a V1 replay.
``replay_v1.guard``  the same call through the guard's hook, over a hybrid
                     model's metadata: 48 layers in 4 KV-cache groups (as
                     Qwen3-Next: 36 linear-attention layers in 3 groups and a
                     full-attention group), every row a decode.
``replay_v1.guard_worst``  48 layers, each in a group of its own (one count
                     read per layer).
``replay_mrv2.vllm`` ``ModelCudaGraphManager.run_fullgraph`` called from a
                     step laid out as MRV2's ``execute_model`` (the replay in
                     an if/else on the graph mode, the step's locals around it).
``replay_mrv2.guard`` the same through the guard's hook (it reads the step's
                     ``attn_metadata`` from the caller's frame), 4 groups.

Each case is registered at one batch size (the cost does not depend on it).
:func:`reads_per_replay` counts, on a learned step, how many times the guard
reads a group's ``num_prefills``: the goal is one read per KV-cache group.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from vllm_graphsafe import vllm_layout

LAYERS = 48
GROUPS = 4
NUM_TOKENS, NUM_REQS, WIDTH = 256, 64, 4


class CountedReads:
    """A group's metadata whose ``num_prefills`` reads are tallied."""

    reads = 0

    @property
    def num_prefills(self) -> int:
        CountedReads.reads += 1
        return 0


def reads_per_replay(fail_loudly: Any) -> dict[str, dict[str, int]]:
    """Per guard case: the KV-cache groups, and the count reads of one
    replayed step after the first (the guard learns the groups once)."""
    from vllm_graphsafe.fixes.replay_guard.logic import GroupPrefills

    result: dict[str, dict[str, int]] = {}
    cases = (("replay_v1.guard", GROUPS), ("replay_v1.guard_worst", LAYERS))
    for name, groups in cases:
        objects = [CountedReads() for _ in range(groups)]
        metadata = {f"layer.{i}": objects[i % groups] for i in range(LAYERS)}
        reader = GroupPrefills()
        reader.holds_prefill(metadata)
        CountedReads.reads = 0
        reader.holds_prefill(metadata)
        result[name] = {"groups": groups, "reads": CountedReads.reads}
    result["replay_mrv2.guard"] = dict(result["replay_v1.guard"])
    return result


def _metadata(groups: int) -> dict[str, Any]:
    """``LAYERS`` layers in ``groups`` groups, every row a decode."""
    metadata_class = vllm_layout.load_name(
        vllm_layout.GDN_ATTENTION_BACKEND, "GDNAttentionMetadata"
    )
    objects = [
        metadata_class(
            num_prefills=0,
            num_prefill_tokens=0,
            num_decodes=0,
            num_decode_tokens=0,
            num_spec_decodes=NUM_REQS,
            num_spec_decode_tokens=NUM_TOKENS,
            num_actual_tokens=NUM_TOKENS,
        )
        for _ in range(groups)
    ]
    return {f"model.layers.{i}.attn": objects[i % groups] for i in range(LAYERS)}


class _NoGraph:
    def replay(self) -> None:
        return None


def _forward_context(metadata: dict[str, Any]) -> Any:
    forward_context = vllm_layout.load(vllm_layout.FORWARD_CONTEXT)
    modes = vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")
    descriptor = forward_context.BatchDescriptor(
        num_tokens=NUM_TOKENS, num_reqs=NUM_REQS, uniform=True
    )
    required: dict[str, Any] = {
        field.name: {}
        for field in dataclasses.fields(forward_context.ForwardContext)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    }
    context = forward_context.ForwardContext(
        **{
            **required,
            "attn_metadata": metadata,
            "cudagraph_runtime_mode": modes.FULL,
            "batch_descriptor": descriptor,
        }
    )
    return context, descriptor


def v1_cases(unwrapped: Any, fail_loudly: Any) -> dict[str, Any]:
    from vllm_graphsafe.fixes.replay_guard.hooks import bind_guarded_wrapper_call

    cuda_graph = vllm_layout.load(vllm_layout.CUDA_GRAPH)
    modes = vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")
    wrapper_class = getattr(cuda_graph, vllm_layout.CUDA_GRAPH_WRAPPER_CLASS)
    vllms_call = unwrapped(wrapper_class.__call__)
    guarded_call = bind_guarded_wrapper_call(vllms_call, fail_loudly)
    forward_context = vllm_layout.load(vllm_layout.FORWARD_CONTEXT)
    cases: dict[str, Any] = {}
    for name, call, groups in (
        ("replay_v1.vllm", vllms_call, GROUPS),
        ("replay_v1.guard", guarded_call, GROUPS),
        ("replay_v1.guard_worst", guarded_call, LAYERS),
    ):
        wrapper: Any = object.__new__(wrapper_class)
        context, descriptor = _forward_context(_metadata(groups))
        wrapper.__dict__.update(
            runnable=None,
            runtime_mode=modes.FULL,
            is_debugging_mode=False,
            concrete_cudagraph_entries={
                descriptor: cuda_graph.CUDAGraphEntry(
                    batch_descriptor=descriptor, cudagraph=_NoGraph(), output=None
                )
            },
        )
        cases[name] = _in_context(forward_context, context, call, wrapper)
    return cases


def _in_context(forward_context: Any, context: Any, call: Any, wrapper: Any) -> Any:
    """The call, with ``context`` as the forward context each time (as the
    runner sets it for its step, outside the timed call)."""

    def step() -> Any:
        forward_context._forward_context = context
        return call(wrapper, "input_ids")

    return step


def mrv2_cases(unwrapped: Any, fail_loudly: Any) -> dict[str, Any]:
    from tests.support.vllm_fakes import mrv2_replay
    from vllm_graphsafe.fixes.replay_guard.mrv2 import bind_guarded_replay

    global CUDAGraphMode
    CUDAGraphMode = vllm_layout.load_name(
        vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode"
    )
    utilities = vllm_layout.load(vllm_layout.MRV2_CUDAGRAPH_UTILS)
    model_manager = utilities.ModelCudaGraphManager
    base_class = utilities.CudaGraphManager
    # vLLM's own replays, and the guard's hooks made of them: the target's
    # (the step's site) and every manager's (reached through super()).
    vllms_target = unwrapped(model_manager.run_fullgraph)
    vllms_base = unwrapped(base_class.run_fullgraph)
    guarded_target = bind_guarded_replay(vllms_target, fail_loudly)
    guarded_base = bind_guarded_replay(vllms_base, fail_loudly)
    desc = mrv2_replay.descriptor(uniform_token_count=WIDTH)
    metadata = _metadata(GROUPS)
    cases = {}
    for name, target, base in (
        ("replay_mrv2.vllm", vllms_target, vllms_base),
        ("replay_mrv2.guard", guarded_target, guarded_base),
    ):
        manager_class = type(
            "BenchManager", (model_manager,), {"run_fullgraph": target}
        )
        manager: Any = object.__new__(manager_class)
        manager.__dict__.update(
            vars(mrv2_replay.target_manager(desc, mrv2_replay.ReplayRecord()))
        )
        runner = SimpleNamespace(cudagraph_manager=manager, model=None)

        def step(runner: Any = runner, base: Any = base) -> Any:
            base_class.run_fullgraph = base
            return execute_model(runner, desc, metadata)

        cases[name] = step
    return cases


#: vLLM's graph modes, as the step below reads them (set when cases are built).
CUDAGraphMode: Any = None


def execute_model(self: Any, batch_desc: Any, attn_metadata: Any) -> Any:
    """A step laid out as MRV2's ``execute_model`` around its replay."""
    input_batch = SimpleNamespace(num_tokens_after_padding=NUM_TOKENS)
    model_inputs = {"input_ids": None, "positions": None}
    if batch_desc.cg_mode == CUDAGraphMode.FULL:
        model_output = self.cudagraph_manager.run_fullgraph(batch_desc)
    else:
        model_output = self.model(attn_metadata, **model_inputs)
    return model_output, input_batch
