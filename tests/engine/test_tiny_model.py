"""The tiny Qwen3 fixture: byte-for-byte deterministic, and servable by vLLM on CPU."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_graphsafe.local_engine.tiny_model import build_tiny_model

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")

CPU_ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
NGRAM_SPECULATION = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 2,
}
PROMPTS = (
    "The graph cache token model engine batch",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "Hello world, hello world, hello",
)


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


def vocab_size_of(model_dir: Path) -> int:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    return int(config["vocab_size"])


def test_same_seed_builds_identical_files(model_dir: Path, tmp_path: Path) -> None:
    rebuilt = build_tiny_model(tmp_path, seed=0)

    assert rebuilt != model_dir
    for name in MODEL_FILES:
        assert (rebuilt / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_existing_build_is_reused(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path, seed=3)
    weights_mtime = (first / "model.safetensors").stat().st_mtime_ns

    second = build_tiny_model(tmp_path, seed=3)

    assert second == first
    assert (second / "model.safetensors").stat().st_mtime_ns == weights_mtime
    assert [path.name for path in tmp_path.iterdir()] == [first.name]


def test_other_seed_changes_weights_not_tokenizer(
    model_dir: Path, tmp_path: Path
) -> None:
    other = build_tiny_model(tmp_path, seed=1)

    assert other.name != model_dir.name
    assert (other / "model.safetensors").read_bytes() != (
        model_dir / "model.safetensors"
    ).read_bytes()
    for name in TOKENIZER_FILES:
        assert (other / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_tokenizer_round_trips_and_has_chat_template(model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = "Hello world, 1 2 3 ... 200! The graph cache: verify each draft token?"

    token_ids = tokenizer.encode(text, add_special_tokens=False)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi there"}],
        tokenize=False,
        add_generation_prompt=True,
    )

    assert tokenizer.decode(token_ids) == text
    assert len(tokenizer) == vocab_size_of(model_dir)
    assert tokenizer.bos_token_id is not None and tokenizer.eos_token_id is not None
    assert chat == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"


def test_weights_match_transformers_qwen3_layout(model_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    config = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(config)
    expected = {name: tuple(param.shape) for name, param in model.named_parameters()}
    with safe_open(model_dir / "model.safetensors", framework="pt") as weights:
        names = weights.keys()
        stored = {name: tuple(weights.get_slice(name).get_shape()) for name in names}

    assert isinstance(config, transformers.Qwen3Config)
    assert config.head_dim >= 32
    assert stored == expected


@pytest.fixture(scope="module")
def cpu_engine(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    vllm = pytest.importorskip("vllm")
    with pytest.MonkeyPatch.context() as env:
        for name, value in CPU_ENGINE_ENV.items():
            env.setenv(name, value)
        if not os.environ.get("VLLM_CACHE_ROOT"):
            cache_root = tmp_path_factory.mktemp("vllm-cache-root")
            env.setenv("VLLM_CACHE_ROOT", str(cache_root))
        engine = vllm.LLM(
            model=str(model_dir),
            dtype="float32",
            enforce_eager=True,
            max_model_len=2048,
            seed=0,
            disable_log_stats=False,
            speculative_config=NGRAM_SPECULATION,
        )
        yield engine
        del engine


def spec_decode_drafts(engine: Any) -> int:
    return sum(
        int(metric.value)
        for metric in engine.get_metrics()
        if metric.name == "vllm:spec_decode_num_drafts"
    )


def test_engine_greedy_generation_is_deterministic(
    cpu_engine: Any, model_dir: Path
) -> None:
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    first = [
        list(out.outputs[0].token_ids)
        for out in cpu_engine.generate(list(PROMPTS), greedy)
    ]
    second = [
        list(out.outputs[0].token_ids)
        for out in cpu_engine.generate(list(PROMPTS), greedy)
    ]

    assert first == second
    assert all(len(token_ids) == 32 for token_ids in first)
    assert all(
        0 <= token_id < vocab_size_of(model_dir) for ids in first for token_id in ids
    )
    assert spec_decode_drafts(cpu_engine) > 0
