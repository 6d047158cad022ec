"""A step's attention metadata, built by the release's own hybrid-model code.

Model Runner V2 builds a hybrid model's metadata in
``MambaHybridModelState.prepare_attn``: from the step's input batch
(:func:`~tests.support.vllm_fakes.mrv2_state.input_batch`, the release's own
``gather_batch_req_state`` behind it) through ``build_attn_metadata`` to the
release's real gated delta-net (``GDNAttentionMetadataBuilder``) or Mamba2
(``Mamba2AttentionMetadataBuilder``) builder, on CPU. Which rows count as
prefills is the release's own decision. The builders are made by their own
``__init__`` from a configuration holding what they read; the model state with
``object.__new__`` and what ``prepare_attn`` reads.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from tests.support.vllm_fakes import mrv2_state
from vllm_graphsafe import vllm_layout

#: The two layers of the hybrid group, sharing its metadata.
LAYERS = ("model.layers.0.linear_attn", "model.layers.1.linear_attn")
#: Builder kind -> (its backend module, backend class, builder class).
BUILDERS = {
    "gdn": (
        vllm_layout.GDN_ATTENTION_BACKEND,
        "GDNAttentionBackend",
        vllm_layout.GDN_BUILDER_CLASS,
    ),
    "mamba2": (
        vllm_layout.MAMBA2_ATTENTION_BACKEND,
        "Mamba2AttentionBackend",
        "Mamba2AttentionMetadataBuilder",
    ),
}
MAX_SEQS = 8
BLOCKS_PER_REQ = 4


def has_one_token_extension() -> bool:
    """Whether the release's Model Runner V2 runs a one-token prompt extension
    over prior state as a decode (``prefill_runs_as_decode_np``, 0.31+)."""
    input_batch = vllm_layout.load_name(vllm_layout.MRV2_INPUT_BATCH, "InputBatch")
    return "prefill_runs_as_decode_np" in {
        f.name for f in dataclasses.fields(input_batch)
    }


def config(num_speculative_tokens: int) -> SimpleNamespace:
    """What the builders and the model state read of a ``VllmConfig`` (a CUDA
    build cannot make one without a GPU): FULL and piecewise graphs, no
    prefix caching of Mamba state, ``num_speculative_tokens`` drafts."""
    import torch

    modes = vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")
    speculative = (
        SimpleNamespace(
            num_speculative_tokens=num_speculative_tokens,
            enable_adaptive_verification=False,
            max_num_new_slots_for_drafting=0,
            parallel_drafting=False,
            use_eagle_block_drop=lambda: False,
        )
        if num_speculative_tokens
        else None
    )
    return SimpleNamespace(
        compilation_config=SimpleNamespace(
            cudagraph_mode=modes.FULL_AND_PIECEWISE,
            max_cudagraph_capture_size=MAX_SEQS * (num_speculative_tokens + 1),
        ),
        speculative_config=speculative,
        num_speculative_tokens=num_speculative_tokens,
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS),
        cache_config=SimpleNamespace(
            mamba_cache_mode="none",
            use_replayssm=False,
            replayssm_buffer_len=0,
            use_kda_recoverssm=False,
        ),
        model_config=SimpleNamespace(
            hf_text_config=SimpleNamespace(),
            dtype=torch.float32,
            get_mamba_chunk_size=lambda: 16,
        ),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        additional_config={},
        num_hash_lookahead_tokens=0,
        use_flashinfer_replayssm=False,
        use_v2_model_runner=True,
    )


def _state_spec() -> Any:
    import torch

    mamba_spec = vllm_layout.load_name(vllm_layout.KV_CACHE_INTERFACE, "MambaSpec")
    return mamba_spec(block_size=16, shapes=((4, 4),), dtypes=(torch.float32,))


def _group(kind: str, vllm_config: Any) -> Any:
    """The release's ``AttentionGroup`` of the hybrid layers, with its builder."""
    import torch

    module, backend, builder_class = BUILDERS[kind]
    spec = _state_spec()
    builder = vllm_layout.load_name(module, builder_class)(
        spec, list(LAYERS), vllm_config, torch.device("cpu")
    )
    group_class = vllm_layout.load_name(vllm_layout.V1_WORKER_UTILS, "AttentionGroup")
    fields = {
        "backend": vllm_layout.load_name(module, backend),
        "layer_names": list(LAYERS),
        "kv_cache_spec": spec,
        "kv_cache_group_id": 0,
        "metadata_builders": [builder],
    }
    names = {f.name for f in dataclasses.fields(group_class)}
    return group_class(
        **{name: value for name, value in fields.items() if name in names}
    )


def step_metadata(
    reqs: dict[str, mrv2_state.Req],
    num_speculative_tokens: int,
    kind: str,
    monkeypatch: Any,
) -> dict[str, Any]:
    """Per layer, the metadata the release builds for a real step over
    ``reqs`` (MRV2's order and phase columns), its hybrid group's builder of
    ``kind`` (``gdn``, ``mamba2``); its graph mode FULL."""
    import torch

    # CUDA builds stage their host-to-device copies in pinned memory: no driver here.
    for module in (vllm_layout.TORCH_UTILS, vllm_layout.ATTENTION_BACKEND_UTILS):
        monkeypatch.setattr(
            vllm_layout.load(module), "PIN_MEMORY", False, raising=False
        )
    step = mrv2_state.make_step(reqs, num_speculative_tokens + 1)
    batch = mrv2_state.unpadded_input_batch(step)
    vllm_config = config(num_speculative_tokens)
    state_class = vllm_layout.load_name(
        vllm_layout.MRV2_MAMBA_HYBRID_STATE, "MambaHybridModelState"
    )
    model_state: Any = object.__new__(state_class)
    model_state.__dict__.update(
        vllm_config=vllm_config,
        cache_config=vllm_config.cache_config,
        max_model_len=mrv2_state.MAX_TOKENS,
        num_accepted_tokens_gpu=torch.ones(mrv2_state.MAX_REQS, dtype=torch.int32),
        _align_mode=False,
        _use_flashinfer_replayssm=False,
        recoverssm=None,
    )
    group = _group(kind, vllm_config)
    modes = vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")
    kv_cache_config = SimpleNamespace(
        kv_cache_groups=[
            SimpleNamespace(kv_cache_spec=group.kv_cache_spec, layer_names=list(LAYERS))
        ]
    )
    num_reqs = batch.num_reqs
    block_table = torch.arange(num_reqs * BLOCKS_PER_REQ, dtype=torch.int32)
    metadata: dict[str, Any] = model_state.prepare_attn(
        batch,
        modes.FULL,
        (block_table.reshape(num_reqs, BLOCKS_PER_REQ),),
        torch.zeros(1, batch.num_tokens, dtype=torch.int64),
        [[group]],
        kv_cache_config,
    )
    return metadata
