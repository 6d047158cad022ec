"""Written after ``wrapper.py`` where the tree has Model Runner V2."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.replay_guard.written.wrapper import (
        NUM_TOKENS,
        CUDAGraphMode,
        SimpleNamespace,
        _context,
        _Graph,
        _per_layer,
        dataclasses,
        get_forward_context,
        mock,
        override_forward_context,
    )


import pytest  # noqa: E402

from vllm.v1.worker.gpu import cudagraph_utils  # noqa: E402
from vllm.v1.worker.gpu import model_runner as mrv2_runner  # noqa: E402


def _batch_desc(**fields: object) -> cudagraph_utils.BatchExecutionDescriptor:
    descriptor_class = cudagraph_utils.BatchExecutionDescriptor
    names = {field.name for field in dataclasses.fields(descriptor_class)}
    values = {
        "cg_mode": CUDAGraphMode.FULL,
        "num_tokens": NUM_TOKENS,
        "num_reqs": 2,
        **fields,
    }
    return descriptor_class(
        **{name: value for name, value in values.items() if name in names}
    )


def test_the_descriptor_leaves_the_decode_graph_for_a_prefill() -> None:
    leave = cudagraph_utils.graphsafe_leave_decode_graph_for_prefill
    decode = _batch_desc(uniform_token_count=4)
    assert leave(decode, _per_layer(0)) is decode
    eager = leave(decode, _per_layer(1))
    assert eager.cg_mode == CUDAGraphMode.NONE
    assert eager.num_tokens == NUM_TOKENS
    mixed = _batch_desc()
    assert leave(mixed, _per_layer(1)) is mixed


def _runner(
    batch_desc: cudagraph_utils.BatchExecutionDescriptor,
    attn_metadata: object,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[mrv2_runner.GPUModelRunner, mock.MagicMock, SimpleNamespace]:
    """The runner's own execute_model, run to its replay through vLLM's graph
    manager; everything else it reads is mocked."""
    import torch

    class Runner(mrv2_runner.GPUModelRunner):  # type: ignore[misc]
        def __getattr__(self, name: str) -> mock.MagicMock:
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

    def model(**inputs: object) -> torch.Tensor:
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
    monkeypatch.setattr(mrv2_runner, "build_slot_mappings_by_layer", lambda *a, **k: {})

    def forward_context(
        attn_metadata: object, vllm_config: object, **kwargs: object
    ) -> object:
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


def test_execute_model_runs_a_step_holding_a_prefill_eagerly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leave = cudagraph_utils.graphsafe_leave_decode_graph_for_prefill
    batch_desc = _batch_desc(uniform_token_count=4)
    assert leave(batch_desc, _per_layer(1)).cg_mode == CUDAGraphMode.NONE
    runner, scheduler_output, record = _runner(batch_desc, _per_layer(1), monkeypatch)
    runner.execute_model(scheduler_output)
    assert record.graph.replays == 0
    assert record.modes == [CUDAGraphMode.NONE]
    assert float(runner.execute_model_state.hidden_states[0, 0]) == 2.0


def test_execute_model_replays_a_decode_step(monkeypatch: pytest.MonkeyPatch) -> None:
    leave = cudagraph_utils.graphsafe_leave_decode_graph_for_prefill
    batch_desc = _batch_desc(uniform_token_count=4)
    assert leave(batch_desc, _per_layer(0)) is batch_desc
    runner, scheduler_output, record = _runner(batch_desc, _per_layer(0), monkeypatch)
    runner.execute_model(scheduler_output)
    assert (record.graph.replays, record.modes) == (1, [])
    assert float(runner.execute_model_state.hidden_states[0, 0]) == 1.0
