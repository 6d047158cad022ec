"""A FULL CUDA graph captured for uniform decode never replays over a step
whose attention metadata holds a prefill row: the step runs eagerly, with the
same padded inputs (vllm-graphsafe replay guard)."""

import dataclasses
from types import SimpleNamespace
from unittest import mock

from vllm.compilation import cuda_graph
from vllm.config import CUDAGraphMode
from vllm.forward_context import (
    BatchDescriptor,
    ForwardContext,
    get_forward_context,
    override_forward_context,
)
from vllm.platforms import current_platform

NUM_TOKENS = 8
#: The batch descriptor's uniform decode flag in this tree (set by the backport).
UNIFORM_FLAG = "uniform"


def _per_layer(num_prefills: int) -> dict[str, object]:
    """Two linear-attention layers of one group, and a full-attention layer
    whose builder counts no rows."""
    group = SimpleNamespace(num_prefills=num_prefills)
    return {"linear.0": group, "linear.1": group, "attn.2": SimpleNamespace()}


def _descriptor(uniform: bool) -> BatchDescriptor:
    return BatchDescriptor(num_tokens=NUM_TOKENS, num_reqs=2, **{UNIFORM_FLAG: uniform})


def _context(
    attn_metadata: object,
    mode: CUDAGraphMode = CUDAGraphMode.FULL,
    uniform: bool = True,
) -> ForwardContext:
    required: dict[str, object] = {
        field.name: {}
        for field in dataclasses.fields(ForwardContext)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    }
    return ForwardContext(
        **{
            **required,
            "attn_metadata": attn_metadata,
            "cudagraph_runtime_mode": mode,
            "batch_descriptor": _descriptor(uniform),
        }
    )


class _Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def _wrapped() -> tuple[cuda_graph.CUDAGraphWrapper, _Graph, list[CUDAGraphMode]]:
    """A FULL wrapper, uniform and mixed graphs captured, around a model that
    records the forward context's mode."""
    modes = []

    def model(*args: object, **kwargs: object) -> str:
        modes.append(get_forward_context().cudagraph_runtime_mode)
        return "eager"

    with mock.patch.object(
        type(current_platform), "get_global_graph_pool", return_value=None
    ):
        wrapper = cuda_graph.CUDAGraphWrapper(
            model,
            SimpleNamespace(compilation_config=SimpleNamespace()),
            CUDAGraphMode.FULL,
        )
    graph = _Graph()
    for uniform in (True, False):
        wrapper.concrete_cudagraph_entries[_descriptor(uniform)] = (
            cuda_graph.CUDAGraphEntry(
                batch_descriptor=_descriptor(uniform),
                cudagraph=graph,
                output="replayed",
            )
        )
    return wrapper, graph, modes


def test_a_group_holding_a_prefill_is_found() -> None:
    has_prefill = cuda_graph.graphsafe_attn_metadata_has_prefill
    assert has_prefill(_per_layer(1))
    assert not has_prefill(_per_layer(0))
    assert not has_prefill({"attn.2": SimpleNamespace()})
    assert not has_prefill(None)
    # Under microbatching: a list of per-layer mappings.
    assert has_prefill([_per_layer(0), _per_layer(2)])


def test_a_step_holding_a_prefill_runs_eagerly() -> None:
    wrapper, graph, modes = _wrapped()
    context = _context(_per_layer(1))
    with override_forward_context(context):
        assert wrapper("input_ids", positions="positions") == "eager"
    assert graph.replays == 0
    assert modes == [CUDAGraphMode.NONE]
    assert context.cudagraph_runtime_mode == CUDAGraphMode.FULL


def test_a_decode_step_replays_the_decode_graph() -> None:
    assert not cuda_graph.graphsafe_attn_metadata_has_prefill(_per_layer(0))
    wrapper, graph, modes = _wrapped()
    with override_forward_context(_context(_per_layer(0))):
        assert wrapper("input_ids") == "replayed"
    assert (graph.replays, modes) == (1, [])


def test_a_mixed_full_graph_replays_over_a_prefill() -> None:
    """A FULL graph captured for mixed batches runs prefills by design."""
    assert cuda_graph.graphsafe_attn_metadata_has_prefill(_per_layer(1))
    wrapper, graph, modes = _wrapped()
    with override_forward_context(_context(_per_layer(1), uniform=False)):
        assert wrapper("input_ids") == "replayed"
    assert (graph.replays, modes) == (1, [])
