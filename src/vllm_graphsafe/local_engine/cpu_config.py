"""Engine settings that run the tiny model on vLLM's CPU backend, shared by the
engine tests, the demo and the benchmarks so that they all measure the same
configuration."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vllm_graphsafe import vllm_layout

MAX_MODEL_LEN = 2048
BLOCK_SIZE = 128
#: Environment for any process that runs the tiny model on vLLM's CPU backend.
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def speculative_config(num_speculative_tokens: int) -> dict[str, Any]:
    return {
        "method": "ngram",
        "num_speculative_tokens": num_speculative_tokens,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 2,
    }


def engine_kwargs(num_speculative_tokens: int = 3) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` / the engine args."""
    return {
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": MAX_MODEL_LEN,
        "block_size": BLOCK_SIZE,
        "max_num_seqs": 8,
        "seed": 0,
        "speculative_config": speculative_config(num_speculative_tokens),
    }


def server_command(
    model_dir: Path | str, port: int, num_speculative_tokens: int = 3
) -> list[str]:
    """An OpenAI-compatible vLLM server on loopback with :func:`engine_kwargs`.

    vllm-cpu's ``vllm`` console script cannot find its distribution under that
    name, so the server starts as a module.
    """
    command = [sys.executable, "-m", vllm_layout.OPENAI_API_SERVER]
    command += ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    for name, value in engine_kwargs(num_speculative_tokens).items():
        command.append("--" + name.replace("_", "-"))
        if isinstance(value, dict):
            command.append(json.dumps(value))
        elif value is not True:
            command.append(str(value))
    return command
