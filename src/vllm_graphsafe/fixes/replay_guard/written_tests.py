"""CPU tests the backport writes into a tree's ``tests/`` for replay-guard.

They exercise the edited vLLM code directly (no GPU, no model, no plugin):
vLLM's ``CUDAGraphWrapper`` with a captured entry whose replay is a recorder,
and Model Runner V2's own ``execute_model`` run to its replay with mocks for
what it reads on the way. They pass on the edited tree and fail on the
pristine one (which replays every such step, and has no helper to ask). Their
oracles are the metadata they build (how many rows each group's builder ran as
prefills), never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.backport.plan import WRITTEN_TEST_HEADER as HEADER

_WRAPPER = '''\
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


class _GroupMetadata:
    """A builder's metadata: how many of the step's rows it runs as prefills."""

    def __init__(self, num_prefills):
        self.num_prefills = num_prefills


def _per_layer(num_prefills):
    """Two linear-attention layers of one group, and a full-attention layer
    whose builder counts no rows."""
    group = _GroupMetadata(num_prefills)
    return {"linear.0": group, "linear.1": group, "attn.2": SimpleNamespace()}


def _descriptor(uniform):
    return BatchDescriptor(num_tokens=NUM_TOKENS, num_reqs=2, @@FLAG@@=uniform)


def _context(attn_metadata, mode=CUDAGraphMode.FULL, uniform=True):
    required = {
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
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def _wrapped():
    """A FULL wrapper around a model recording the forward context's mode,
    the uniform and the mixed descriptors captured."""
    modes = []

    def model(*args, **kwargs):
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


def test_a_group_holding_a_prefill_is_found():
    has_prefill = cuda_graph.graphsafe_attn_metadata_has_prefill
    assert has_prefill(_per_layer(1))
    assert not has_prefill(_per_layer(0))
    assert not has_prefill({"attn.2": SimpleNamespace()})
    assert not has_prefill(None)
    # Under microbatching: a list of per-layer mappings.
    assert has_prefill([_per_layer(0), _per_layer(2)])


def test_a_step_holding_a_prefill_runs_eagerly():
    wrapper, graph, modes = _wrapped()
    context = _context(_per_layer(1))
    with override_forward_context(context):
        assert wrapper("input_ids", positions="positions") == "eager"
    assert graph.replays == 0
    assert modes == [CUDAGraphMode.NONE]
    assert context.cudagraph_runtime_mode == CUDAGraphMode.FULL


def test_a_decode_step_replays_the_decode_graph():
    assert not cuda_graph.graphsafe_attn_metadata_has_prefill(_per_layer(0))
    wrapper, graph, modes = _wrapped()
    with override_forward_context(_context(_per_layer(0))):
        assert wrapper("input_ids") == "replayed"
    assert (graph.replays, modes) == (1, [])


def test_a_mixed_full_graph_replays_over_a_prefill():
    """A FULL graph captured for mixed batches runs prefills by design."""
    assert cuda_graph.graphsafe_attn_metadata_has_prefill(_per_layer(1))
    wrapper, graph, modes = _wrapped()
    with override_forward_context(_context(_per_layer(1), uniform=False)):
        assert wrapper("input_ids") == "replayed"
    assert (graph.replays, modes) == (1, [])
'''

_MRV2 = '''

# -- Model Runner V2 -------------------------------------------------------------

from vllm.v1.worker.gpu import cudagraph_utils  # noqa: E402
from vllm.v1.worker.gpu import model_runner as mrv2_runner  # noqa: E402


def _batch_desc(**fields):
    descriptor_class = cudagraph_utils.BatchExecutionDescriptor
    names = {field.name for field in dataclasses.fields(descriptor_class)}
    values = {
        "cg_mode": CUDAGraphMode.FULL,
        "num_tokens": NUM_TOKENS,
        "num_reqs": 2,
    }
    values.update(fields)
    return cudagraph_utils.BatchExecutionDescriptor(
        **{name: value for name, value in values.items() if name in names}
    )


def test_the_descriptor_leaves_the_decode_graph_for_a_prefill():
    leave = cudagraph_utils.graphsafe_leave_decode_graph_for_prefill
    decode = _batch_desc(uniform_token_count=4)
    assert leave(decode, _per_layer(0)) is decode
    eager = leave(decode, _per_layer(1))
    assert eager.cg_mode == CUDAGraphMode.NONE
    assert eager.num_tokens == NUM_TOKENS
    mixed = _batch_desc()
    assert leave(mixed, _per_layer(1)) is mixed


def _runner(batch_desc, attn_metadata, monkeypatch):
    """The runner's own execute_model, run to its replay: what it reads on the
    way is mocked, the graph manager is vLLM's with the descriptor captured."""
    import torch

    class Runner(mrv2_runner.GPUModelRunner):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = mock.MagicMock(name=name)
            object.__setattr__(self, name, value)
            return value

    graph = _Graph()
    record = SimpleNamespace(graph=graph, modes=[])
    manager = object.__new__(cudagraph_utils.ModelCudaGraphManager)
    manager.__dict__.update(
        graphs={batch_desc: graph},
        is_last_pp_rank=True,
        use_aux_hidden_state_outputs=False,
        hidden_states=torch.ones(2 * NUM_TOKENS, 4),
        aux_hidden_states=[],
        intermediate_tensors=None,
    )

    def model(**inputs):
        record.modes.append(get_forward_context().cudagraph_runtime_mode)
        return torch.full((NUM_TOKENS, 4), 2.0)

    input_batch = mock.MagicMock(name="input_batch")
    input_batch.num_tokens_after_padding = NUM_TOKENS
    input_batch.num_tokens = NUM_TOKENS
    runner = object.__new__(Runner)
    runner.__dict__.update(
        encoder_cache=None,
        is_encoder_decoder=False,
        lora_config=None,
        pcp_manager=None,
        aux_output_connector=None,
        ubatch_runner=None,
        dcp_size=1,
        is_first_pp_rank=True,
        is_last_pp_rank=True,
        uses_inputs_embeds=False,
        supports_mm_inputs=False,
        use_aux_hidden_state_outputs=False,
        cudagraph_manager=manager,
        model=model,
        prepare_inputs=lambda *args, **kwargs: input_batch,
        prepare_attn=lambda batch: (mock.MagicMock(), mock.MagicMock()),
        gather_batch_req_state=lambda *args: (
            SimpleNamespace(
                num_tokens=NUM_TOKENS, has_prefill=False, decode_graph_eligible=True
            ),
            4,
        ),
        _get_uniform_decode_token_count=lambda *args: 4,
    )
    for name in (
        "update_pp_decode_requests",
        "finish_requests",
        "free_states",
        "add_requests",
        "update_requests",
    ):
        runner.__dict__[name] = lambda *args, **kwargs: None
    runner.observability_config.cudagraph_metrics = False
    runner.model_state.prepare_attn = lambda *args, **kwargs: attn_metadata
    runner.model_state.prepare_inputs = lambda *args, **kwargs: {}
    monkeypatch.setattr(
        mrv2_runner, "dispatch_cg_and_sync_dp", lambda *a, **k: (batch_desc, None)
    )
    monkeypatch.setattr(
        mrv2_runner, "build_slot_mappings_by_layer", lambda *a, **k: {}
    )

    def forward_context(attn_metadata, vllm_config, **kwargs):
        return override_forward_context(
            _context(attn_metadata, mode=kwargs["cudagraph_runtime_mode"])
        )

    monkeypatch.setattr(mrv2_runner, "set_forward_context", forward_context)
    scheduler_output = mock.MagicMock(name="scheduler_output")
    scheduler_output.total_num_scheduled_tokens = NUM_TOKENS
    scheduler_output.num_scheduled_tokens = {"a": 4, "b": 4}
    scheduler_output.scheduled_encoder_inputs = {}
    scheduler_output.finished_req_ids = set()
    return runner, scheduler_output, record


def test_execute_model_runs_a_step_holding_a_prefill_eagerly(monkeypatch):
    leave = cudagraph_utils.graphsafe_leave_decode_graph_for_prefill
    batch_desc = _batch_desc(uniform_token_count=4)
    assert leave(batch_desc, _per_layer(1)).cg_mode == CUDAGraphMode.NONE
    runner, scheduler_output, record = _runner(
        batch_desc, _per_layer(1), monkeypatch
    )
    runner.execute_model(scheduler_output)
    assert record.graph.replays == 0
    assert record.modes == [CUDAGraphMode.NONE]
    assert float(runner.execute_model_state.hidden_states[0, 0]) == 2.0


def test_execute_model_replays_a_decode_step(monkeypatch):
    leave = cudagraph_utils.graphsafe_leave_decode_graph_for_prefill
    batch_desc = _batch_desc(uniform_token_count=4)
    assert leave(batch_desc, _per_layer(0)) is batch_desc
    runner, scheduler_output, record = _runner(
        batch_desc, _per_layer(0), monkeypatch
    )
    runner.execute_model(scheduler_output)
    assert (record.graph.replays, record.modes) == (1, [])
    assert float(runner.execute_model_state.hidden_states[0, 0]) == 1.0
'''


def replay_guard(*, flag: str, mrv2: bool) -> str:
    text = _WRAPPER.replace("@@FLAG@@", flag)
    return HEADER + text + (_MRV2 if mrv2 else "")
