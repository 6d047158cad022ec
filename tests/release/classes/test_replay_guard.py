"""The replay guard on the installed release's real ``CUDAGraphWrapper``.

A real FULL wrapper (and a real PIECEWISE one inside it, as vLLM nests them)
is called inside a real forward context that asks for FULL with a uniform
batch descriptor, its graph entry captured: the replay is a recorder. The
step's attention metadata is the release's own metadata class for gated
delta-net layers (``GDNAttentionMetadata``), with the row counts its builder
sets, beside a full-attention layer whose builder counts no rows. A step
holding a prefill must run without the graph (eagerly, the forward context in
mode NONE for the call) and be counted; a decode step replays. With the plugin
disabled (the negative control) vLLM replays every such step and the tests
marked ``regression`` fail.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_graphsafe import counts, vllm_layout
from vllm_graphsafe.fixes.replay_guard import FELL_BACK, REPLAYED

PATCH_ID = "replay-guard"
regression = pytest.mark.regression(PATCH_ID)

GDN_LAYERS = ("model.layers.0.linear_attn", "model.layers.1.linear_attn")
ATTENTION_LAYER = "model.layers.2.self_attn"
NUM_TOKENS, NUM_REQS = 8, 2


def modes() -> Any:
    return vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")


def gdn_metadata(*, prefills: int, spec_decodes: int, decodes: int = 0) -> Any:
    """The release's GDN metadata with the counts its builder sets for the rows."""
    metadata_class = vllm_layout.load_name(
        vllm_layout.GDN_ATTENTION_BACKEND, "GDNAttentionMetadata"
    )
    prefill_tokens = NUM_TOKENS - 4 * spec_decodes - decodes
    return metadata_class(
        num_prefills=prefills,
        num_prefill_tokens=prefill_tokens if prefills else 0,
        num_decodes=decodes,
        num_decode_tokens=decodes,
        num_spec_decodes=spec_decodes,
        num_spec_decode_tokens=4 * spec_decodes,
        num_actual_tokens=NUM_TOKENS,
    )


def step_metadata(gdn: Any) -> dict[str, Any]:
    """Per layer, as the runner hands it: one object per attention group."""
    full_attention = SimpleNamespace(num_actual_tokens=NUM_TOKENS, max_query_len=4)
    return {**dict.fromkeys(GDN_LAYERS, gdn), ATTENTION_LAYER: full_attention}


class Model:
    """The runnable: records each call and the forward context's mode in it."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        context = vllm_layout.load_name(
            vllm_layout.FORWARD_CONTEXT, "get_forward_context"
        )()
        self.calls.append(context.cudagraph_runtime_mode)
        return ("eager", args, kwargs)


class Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


@dataclasses.dataclass
class Wrapped:
    full: Any
    piecewise: Any
    model: Model
    graph: Graph
    config: Any


@pytest.fixture
def wrapped(monkeypatch: pytest.MonkeyPatch) -> Iterator[Wrapped]:
    """A FULL wrapper around a PIECEWISE one around the model, as vLLM nests
    them; the FULL entry of the test's descriptor captured."""
    cuda_graph = vllm_layout.load(vllm_layout.CUDA_GRAPH)
    platform = vllm_layout.load_name(vllm_layout.PLATFORMS, "current_platform")
    monkeypatch.setattr(type(platform), "get_global_graph_pool", lambda self: None)
    # What the wrapper reads of the configuration (a CUDA build cannot make a
    # VllmConfig on a host without a GPU).
    config = SimpleNamespace(compilation_config=SimpleNamespace())
    model = Model()
    piecewise = cuda_graph.CUDAGraphWrapper(model, config, modes().PIECEWISE)
    full = cuda_graph.CUDAGraphWrapper(piecewise, config, modes().FULL)
    graph = Graph()
    full.concrete_cudagraph_entries[descriptor(uniform=True)] = (
        cuda_graph.CUDAGraphEntry(
            batch_descriptor=descriptor(uniform=True),
            cudagraph=graph,
            output="replayed",
        )
    )
    counts.STATS.reset()
    yield Wrapped(full, piecewise, model, graph, config)
    counts.STATS.reset()


def descriptor(*, uniform: bool) -> Any:
    batch_descriptor = vllm_layout.load_name(
        vllm_layout.FORWARD_CONTEXT, "BatchDescriptor"
    )
    return batch_descriptor(num_tokens=NUM_TOKENS, num_reqs=NUM_REQS, uniform=uniform)


def call(
    wrapped: Wrapped, metadata: Any, *, mode: Any = None, uniform: bool = True
) -> tuple[Any, Any]:
    """The wrapper called in a forward context as the V1 runner sets it for a
    step; returns its output and the context's mode after the call."""
    forward_context = vllm_layout.load(vllm_layout.FORWARD_CONTEXT)
    context = forward_context_of(
        metadata,
        cudagraph_runtime_mode=modes().FULL if mode is None else mode,
        batch_descriptor=descriptor(uniform=uniform),
    )
    with forward_context.override_forward_context(context):
        output = wrapped.full("input_ids", positions="positions")
        return output, forward_context.get_forward_context().cudagraph_runtime_mode


def forward_context_of(metadata: Any, **fields: Any) -> Any:
    """The release's ``ForwardContext`` for one step: the given fields, empty
    mappings for the other fields it requires, its defaults for the rest."""
    context_class = vllm_layout.load_name(vllm_layout.FORWARD_CONTEXT, "ForwardContext")
    required: dict[str, Any] = {
        field.name: {}
        for field in dataclasses.fields(context_class)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    }
    return context_class(**{**required, "attn_metadata": metadata, **fields})


def decided() -> dict[str, int]:
    return counts.STATS.snapshot().get(PATCH_ID, {})


def test_a_decode_step_replays_the_graph(wrapped: Wrapped) -> None:
    output, _ = call(wrapped, step_metadata(gdn_metadata(prefills=0, spec_decodes=2)))
    assert output == "replayed"
    assert wrapped.graph.replays == 1
    assert wrapped.model.calls == []


@regression
def test_a_step_holding_a_prefill_runs_without_the_graph(wrapped: Wrapped) -> None:
    metadata = step_metadata(gdn_metadata(prefills=1, spec_decodes=1))
    output, mode_after = call(wrapped, metadata)
    assert wrapped.graph.replays == 0
    # The runnable ran once, through the PIECEWISE wrapper, in mode NONE, with
    # the padded inputs the runner handed the graph.
    assert wrapped.model.calls == [modes().NONE]
    assert output == ("eager", ("input_ids",), {"positions": "positions"})
    assert mode_after == modes().FULL
    assert not wrapped.piecewise.concrete_cudagraph_entries


@regression
def test_the_fallback_is_counted_and_a_replay_too(wrapped: Wrapped) -> None:
    call(wrapped, step_metadata(gdn_metadata(prefills=1, spec_decodes=1)))
    call(wrapped, step_metadata(gdn_metadata(prefills=0, spec_decodes=2)))
    call(wrapped, step_metadata(gdn_metadata(prefills=2, spec_decodes=0)))
    assert decided() == {FELL_BACK: 2, REPLAYED: 1}


@regression
def test_a_prefill_in_one_microbatch_is_enough(wrapped: Wrapped) -> None:
    metadata = [
        step_metadata(gdn_metadata(prefills=0, spec_decodes=2)),
        step_metadata(gdn_metadata(prefills=1, spec_decodes=1)),
    ]
    call(wrapped, metadata)
    assert wrapped.graph.replays == 0
    assert wrapped.model.calls == [modes().NONE]


@regression
def test_one_warning_per_process_with_the_steps_shape(
    wrapped: Wrapped, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm_graphsafe.fixes.replay_guard import common

    common.WARN_ONCE._done = False
    caplog.set_level(logging.WARNING, logger="vllm.graphsafe")
    for _ in range(3):
        call(wrapped, step_metadata(gdn_metadata(prefills=1, spec_decodes=1)))
    warnings = [r for r in caplog.records if "ran without the graph" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f"num_tokens={NUM_TOKENS}" in message
    assert f"num_reqs={NUM_REQS}" in message
    assert f"named by its first layer: {GDN_LAYERS[0]}: 1" in message


def test_a_mixed_full_graph_replays_over_prefills(wrapped: Wrapped) -> None:
    """A FULL graph captured for mixed batches (descriptor not uniform) runs
    prefills by design: the guard leaves it alone."""
    cuda_graph = vllm_layout.load(vllm_layout.CUDA_GRAPH)
    mixed_graph = Graph()
    wrapped.full.concrete_cudagraph_entries[descriptor(uniform=False)] = (
        cuda_graph.CUDAGraphEntry(
            batch_descriptor=descriptor(uniform=False),
            cudagraph=mixed_graph,
            output="mixed",
        )
    )
    metadata = step_metadata(gdn_metadata(prefills=1, spec_decodes=1))
    output, _ = call(wrapped, metadata, uniform=False)
    assert (output, mixed_graph.replays, wrapped.model.calls) == ("mixed", 1, [])
    assert decided() == {}


def test_piecewise_and_eager_steps_are_untouched(wrapped: Wrapped) -> None:
    metadata = step_metadata(gdn_metadata(prefills=1, spec_decodes=1))
    call(wrapped, metadata, mode=modes().NONE)
    assert wrapped.model.calls == [modes().NONE]
    assert wrapped.graph.replays == 0
    assert decided() == {}


def test_metadata_without_row_counts_replays(wrapped: Wrapped) -> None:
    """A step whose builders count no rows (full attention only) replays."""
    full_attention = SimpleNamespace(num_actual_tokens=NUM_TOKENS)
    output, _ = call(wrapped, {ATTENTION_LAYER: full_attention})
    assert output == "replayed"
    assert decided() == {REPLAYED: 1}


def test_an_error_in_the_guard_fails_open(
    wrapped: Wrapped, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metadata object the guard cannot read: vLLM's own replay, the patch
    turned off in this process, one warning."""
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    patch = registry().get(PATCH_ID)
    if patch.state is not PatchState.APPLIED:
        pytest.skip(f"{PATCH_ID} is {patch.state} here (plugin switched off)")

    class Unreadable:
        @property
        def num_prefills(self) -> int:
            raise RuntimeError("unreadable")

    try:
        output, _ = call(wrapped, {GDN_LAYERS[0]: Unreadable()})
        assert output == "replayed"
        assert state_of(patch) is PatchState.FAILED
        assert "unreadable" in patch.reason
    finally:
        patch._failed_at_run_time = False
        registry().apply_all()
    assert state_of(patch) is PatchState.APPLIED


def state_of(patch: Any) -> Any:
    """The patch's state now (read through a call: a hook may have changed it)."""
    return patch.state
