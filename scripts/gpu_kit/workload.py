"""The device run's requests: the same for every configuration, shaped by K.

K is the number of speculative tokens (ngram); a decode step schedules K+1
tokens per request, so the dangerous prompts leave exactly K+1 tokens to one
step: a fresh prompt of K+1 tokens (alone, and two together), the tail of a
chunked prefill, the tail after a prefix-cache hit, and fresh K+1 prompts that
arrive while other requests decode (their decode neighbours share the step:
with speculation, an insert waits for a step in which every neighbour holds K
drafts).
Controls one token shorter and longer sit beside them, and a decode-only group
closes. The long decodes repeat a pattern of five ids and sample only among
those five (``allowed``): ngram then finds drafts in almost every step, so the
neighbours schedule all K+1 tokens, as a server's do on repetitive text (a
random model left to itself never repeats). Their recurrent state is the
model's own: a corrupted state still changes which of the five comes next.

Everything here is pure: the block size comes from the engine (vLLM settles
it once the model is loaded) and the plan follows. With prefix caching, vLLM
keeps a hybrid model's recurrent state at block boundaries ("align" mode), so
it cuts a prompt of one block and K+1 tokens into a block and a K+1 tail.
"""

from __future__ import annotations

import random
from typing import NamedTuple

FIRST_ID, LAST_ID = 10, 500
MAX_TOKENS = 16
LONG_DECODE = 160
#: Steps the decodes run before each insert may arrive.
INSERT_STEPS = (4, 11, 19)
#: Steps an insert waits for every running request to hold K drafts.
DRAFT_WAIT = 30


class Request(NamedTuple):
    label: str
    prompt: tuple[int, ...]
    max_tokens: int
    #: Steps of its group before it is added (0: at the group's start) ...
    arrive_after: int = 0
    #: ... and then, with K > 0, the first step (within DRAFT_WAIT) for which
    #: every running request holds K drafts: a step of K+1 tokens each.
    waits_for_drafts: bool = False
    #: Its last scheduled chunk is K+1 tokens: the shape of a decode batch.
    boundary: bool = False
    #: Tokens it should find in the prefix cache.
    cached: int = 0
    #: The only ids it may sample (empty: any).
    allowed: tuple[int, ...] = ()


class Group(NamedTuple):
    label: str
    requests: tuple[Request, ...]
    #: Each request runs alone to its end, in order (a prefix to cache first).
    one_by_one: bool = False


def ids(length: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(FIRST_ID, LAST_ID) for _ in range(length))


PERIOD = 5


def repetitive(length: int, seed: int) -> tuple[int, ...]:
    """A prompt that repeats ``PERIOD`` ids: ngram finds drafts in it."""
    pattern = ids(PERIOD, seed)
    return tuple(pattern[i % PERIOD] for i in range(length))


def decode(label: str, length: int, seed: int, max_tokens: int) -> Request:
    """A long decode that samples only its prompt's ids, so that ngram finds
    drafts in almost every step."""
    prompt = repetitive(length, seed)
    return Request(label, prompt, max_tokens, allowed=tuple(sorted(set(prompt))))


def plan(k: int, block_size: int) -> tuple[Group, ...]:
    """Every group of requests for K speculative tokens and the engine's block."""
    step = k + 1
    seed = 1000 * step
    prefix = ids(block_size + k + 3, seed + 7)

    def one(label: str, prompt: tuple[int, ...], boundary: bool = False) -> Group:
        return Group(
            label, (Request(f"{label}/0", prompt, MAX_TOKENS, boundary=boundary),)
        )

    shorter = (one("fresh_one_shorter", ids(step - 1, seed + 3)),) if k else ()
    inserts = tuple(
        Request(
            f"decode_with_inserts/insert{n}",
            ids(step, seed + 40 + n),
            MAX_TOKENS,
            arrive_after=after,
            boundary=True,
            waits_for_drafts=True,
        )
        for n, after in enumerate(INSERT_STEPS)
    )
    decodes = tuple(
        decode(f"decode_with_inserts/decode{n}", 12 + n, seed + 30 + n, LONG_DECODE)
        for n in range(3)
    )
    return (
        one("warmup", repetitive(8, seed + 1)),
        one("fresh_k_plus_1", ids(step, seed + 2), boundary=True),
        *shorter,
        one("fresh_one_longer", ids(step + 1, seed + 4)),
        Group(
            "fresh_pair",
            tuple(
                Request(
                    f"fresh_pair/{n}",
                    ids(step, seed + 5 + n),
                    MAX_TOKENS,
                    boundary=True,
                )
                for n in range(2)
            ),
        ),
        one("block_tail_k_plus_1", ids(block_size + step, seed + 8), boundary=True),
        one("block_tail_one_longer", ids(block_size + step + 1, seed + 9)),
        Group(
            "prefix_tail",
            (
                Request("prefix_tail/prefix", prefix, MAX_TOKENS),
                Request(
                    "prefix_tail/k_plus_1",
                    prefix[:block_size] + ids(step, seed + 11),
                    MAX_TOKENS,
                    boundary=True,
                    cached=block_size,
                ),
                Request(
                    "prefix_tail/one_longer",
                    prefix[:block_size] + ids(step + 1, seed + 12),
                    MAX_TOKENS,
                    cached=block_size,
                ),
            ),
            one_by_one=True,
        ),
        Group("decode_with_inserts", decodes + inserts),
        Group(
            "decode_only",
            tuple(
                decode(f"decode_only/{n}", 9 + 2 * n, seed + 50 + n, LONG_DECODE // 2)
                for n in range(3)
            ),
        ),
    )


def longest_prompt(groups: tuple[Group, ...]) -> int:
    return max(len(r.prompt) + r.max_tokens for g in groups for r in g.requests)


def throughput_requests(count: int, length: int, max_tokens: int) -> list[Request]:
    """The decode-only workload: long decodes, as the neighbours above."""
    return [decode(f"tput/{n}", length, 7 + n, max_tokens) for n in range(count)]
