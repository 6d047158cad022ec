"""The reference's evidence table as workloads for a real vLLM server.

Each case sends its requests and returns the answer of each *slot* (a named
request) as token ids. The same case runs on a stock server (no emulator: the
controls), then on emulating servers with the plugin disabled and enabled.
Prompts are random ids from a seed per case, so no case shares a cached
prefix with another; K = 3 ngram tokens, block size B and chunk budget C
(the server's ``--max-num-batched-tokens``).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.engine.emulator.step_log import read_steps
from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE, MAX_MODEL_LEN

K = 3
STEP = K + 1
B = BLOCK_SIZE
#: The servers' chunked-prefill budget: not a multiple of B, above 2B + K + 1.
CHUNK = 320
MAX_TOKENS = 16
DECODE_PROMPT_TOKENS = 20
#: The longest decode the server admits: some 500 steps of K+1 tokens, where
#: the inserted prompts need one step each once they arrive.
DECODE_TOKENS = MAX_MODEL_LEN - DECODE_PROMPT_TOKENS
#: Whether the inserted prompts shared a step with the decode is read from the
#: server's step log; an attempt where they did not is run again, this often.
DECODE_ATTEMPTS = 5
#: Steps that scheduled the long decode, by the server's step log, before the
#: dangerous prompts are inserted: enough history for the ngram drafter to
#: propose K tokens (early in the decode it often proposes none, and the step
#: that admits the prompts then has no decode batch's shape).
DECODE_HEAD_STEPS = 64
#: How often the step log is read while waiting for the decode to start.
STEP_LOG_POLL_S = 0.01
FIRST_ORDINARY_ID = 10
REQUEST_TIMEOUT_S = 120.0

Answers = dict[str, list[int]]


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ORDINARY_ID, 2000) for _ in range(length)]


@dataclass
class Finished:
    tokens: list[int]
    finish_reason: str | None


@dataclass
class Client:
    """``step_log``: the server's :mod:`tests.engine.emulator.step_log` directory."""

    base_url: str
    model: str
    step_log: Path | None = None
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_S)

    def complete(
        self,
        ids: Sequence[int],
        max_tokens: int = MAX_TOKENS,
        request_id: str | None = None,
    ) -> list[int]:
        response = self.http.post(
            "/v1/completions",
            json=self._body(ids, max_tokens),
            headers=_id_header(request_id),
        )
        response.raise_for_status()
        return list(response.json()["choices"][0]["token_ids"])

    def complete_finished(
        self, ids: Sequence[int], max_tokens: int, request_id: str | None = None
    ) -> Finished:
        """The answer and why it ended, in one response (nothing streamed)."""
        response = self.http.post(
            "/v1/completions",
            json=self._body(ids, max_tokens),
            headers=_id_header(request_id),
        )
        response.raise_for_status()
        choice = response.json()["choices"][0]
        return Finished(list(choice["token_ids"]), choice.get("finish_reason"))

    def together(
        self,
        prompts: Sequence[Sequence[int]],
        request_ids: Sequence[str | None] | None = None,
    ) -> list[list[int]]:
        """Send the prompts at once, each in its own request."""
        start = threading.Barrier(len(prompts))

        def send(ids: Sequence[int], request_id: str | None) -> list[int]:
            start.wait()
            return self.complete(ids, request_id=request_id)

        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(send, prompts, request_ids or [None] * len(prompts)))

    def _body(self, ids: Sequence[int], max_tokens: int) -> dict[str, object]:
        return {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "return_token_ids": True,
        }


def _id_header(request_id: str | None) -> dict[str, str]:
    """vLLM names the request after ``X-Request-Id`` (``cmpl-<id>-<n>...``)."""
    return {} if request_id is None else {"X-Request-Id": request_id}


# ------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Case:
    """``dangerous``: slots the emulator corrupts with the plugin disabled.

    ``maybe``: slots whose danger depends on how the scheduler happened to
    batch them (concurrent arrivals): clean or corrupted, never anything
    else; ``at_least_one`` of them must be corrupted.
    """

    name: str
    run: Callable[[Client], Answers]
    dangerous: frozenset[str] = frozenset()
    maybe: frozenset[str] = frozenset()
    at_least_one: bool = False


def _cold_then_warm(length: int, seed: int) -> Callable[[Client], Answers]:
    def run(client: Client) -> Answers:
        ids = prompt(length, seed)
        return {"cold": client.complete(ids), "warm": client.complete(ids)}

    return run


def _fresh(length: int, seed: int) -> Callable[[Client], Answers]:
    def run(client: Client) -> Answers:
        return {"answer": client.complete(prompt(length, seed))}

    return run


def _warm_pairs(client: Client) -> Answers:
    """Two pairs of prompts whose last K+1 tokens follow a cached block prefix."""
    lengths = {"a": B + STEP, "b": B + STEP, "c": B + STEP, "d": 2 * B + STEP}
    prompts = {
        slot: prompt(length, 500 + i)
        for i, (slot, length) in enumerate(sorted(lengths.items()))
    }
    for ids in prompts.values():
        client.complete(ids, max_tokens=1)  # fills the prefix cache
    a, b = client.together([prompts["a"], prompts["b"]])
    c, d = client.together([prompts["c"], prompts["d"]])
    return {"a": a, "b": b, "c": c, "d": d}


def _fresh_pair(client: Client) -> Answers:
    first, second = client.together([prompt(STEP, 600), prompt(STEP, 601)])
    return {"first": first, "second": second}


def _ongoing_decode(client: Client) -> Answers:
    """A long greedy decode, with dangerous prompts inserted while it runs.

    That each inserted prompt was computed in a step that also scheduled the
    decode, every row K+1 tokens wide (the decode with its K drafts: the shape
    of a decode batch), is read from the server's step log (the scheduler's own
    record), not inferred from timing; an attempt where it was not is run
    again (where the decode's drafter proposed fewer than K tokens in that step
    the shape differs).
    """
    if client.step_log is None:
        raise AssertionError("this case needs the server's step log")
    warm_insert = prompt(B + STEP, 701)
    client.complete(warm_insert, max_tokens=1)  # its prefix is cached
    inserts = {"insert_fresh": prompt(STEP, 700), "insert_warm": warm_insert}
    missed = []
    for _ in range(DECODE_ATTEMPTS):
        answers, overlap, finish = _decode_with_inserts(
            client, client.step_log, inserts
        )
        if all(overlap.values()):
            return answers
        missed.append(
            f"inserted into the decode: {overlap}; the decode ended "
            f"({finish}) after {len(answers['decode'])} of {DECODE_TOKENS} tokens"
        )
    raise AssertionError(
        f"in {DECODE_ATTEMPTS} attempts the server's step log shows no step "
        f"that computed each inserted prompt beside the ongoing decode, every row "
        f"{STEP} tokens wide: {missed}"
    )


def _decode_with_inserts(
    client: Client, step_log: Path, inserts: Mapping[str, list[int]]
) -> tuple[Answers, dict[str, bool], str | None]:
    """Every slot's answer; per insert, whether a step that computed its
    prompt also scheduled the decode (from the server's step log); and why
    the decode ended.

    The decode is not streamed and the inserts are sent once the step log
    shows the engine decoding: on a loaded host a streamed decode reaches
    the client late, so a client that waits for streamed tokens can send
    its inserts after the engine has finished the decode.
    """
    tag = uuid.uuid4().hex
    names = {slot: f"graphsafe-{slot}-{tag}" for slot in ("decode", *inserts)}
    with ThreadPoolExecutor(1) as pool:
        decode = pool.submit(
            client.complete_finished,
            prompt(DECODE_PROMPT_TOKENS, 702),
            DECODE_TOKENS,
            names["decode"],
        )
        _wait_until_decoding(step_log, names["decode"], decode)
        slots = list(inserts)
        answered = client.together(
            [inserts[slot] for slot in slots], [names[slot] for slot in slots]
        )
        finished = decode.result()
    answers: Answers = dict(zip(slots, answered, strict=True))
    answers["decode"] = finished.tokens
    overlap = dict.fromkeys(slots, False)
    for step in read_steps(step_log):
        if not any(names["decode"] in req_id for req_id in step["scheduled"]):
            continue
        if set(step["widths"]) != {STEP}:
            continue
        for slot in slots:
            if any(names[slot] in req_id for req_id in step["in_prompt"]):
                overlap[slot] = True
    return answers, overlap, finished.finish_reason


def _wait_until_decoding(step_log: Path, name: str, decode: Future[Finished]) -> None:
    """Return once :data:`DECODE_HEAD_STEPS` logged steps scheduled ``name``."""
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while time.monotonic() < deadline:
        if decode.done():
            decode.result()  # raises what went wrong
            return  # it ended before the inserts: the caller's overlap says so
        steps = 0
        if any(step_log.glob("*.jsonl")):
            steps = sum(
                any(name in req_id for req_id in step["scheduled"])
                for step in read_steps(step_log)
            )
        if steps >= DECODE_HEAD_STEPS:
            return
        time.sleep(STEP_LOG_POLL_S)
    raise AssertionError(
        f"the server logged no {DECODE_HEAD_STEPS} steps of the decode in "
        f"{REQUEST_TIMEOUT_S:.0f} s ({step_log})"
    )


CASES: tuple[Case, ...] = (
    Case(
        "block_prefix_hit_then_K+1",
        _cold_then_warm(B + STEP, 101),
        dangerous=frozenset({"warm"}),
    ),
    Case(
        "two_block_prefix_hit_then_K+1",
        _cold_then_warm(2 * B + STEP, 102),
        dangerous=frozenset({"warm"}),
    ),
    Case("neighbour_one_shorter", _cold_then_warm(B + STEP - 1, 103)),
    Case("neighbour_one_longer", _cold_then_warm(B + STEP + 1, 104)),
    Case("fresh_prompt_of_K+1", _fresh(STEP, 105), dangerous=frozenset({"answer"})),
    Case(
        "chunked_prefill_tail_of_K+1",
        _fresh(CHUNK + STEP, 106),
        dangerous=frozenset({"answer"}),
    ),
    Case(
        "concurrent_warm_pairs",
        _warm_pairs,
        maybe=frozenset({"a", "b", "c", "d"}),
        at_least_one=True,
    ),
    Case(
        "concurrent_fresh_pair",
        _fresh_pair,
        maybe=frozenset({"first", "second"}),
        at_least_one=True,
    ),
    Case(
        "ongoing_decode_with_inserts",
        _ongoing_decode,
        dangerous=frozenset({"decode"}),
        maybe=frozenset({"insert_fresh", "insert_warm"}),
    ),
)

CASE_NAMES = tuple(case.name for case in CASES)


def case_named(name: str) -> Case:
    return next(case for case in CASES if case.name == name)


def timed(run: Callable[[Client], Answers], client: Client) -> tuple[Answers, float]:
    started = time.monotonic()
    answers = run(client)
    return answers, time.monotonic() - started
