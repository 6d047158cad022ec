"""Before and after, for an operator: one boundary prompt on emulating servers.

The prompt is the smallest case of the bug at this server's scale: "Reply with
OK." through the chat template, padded with space tokens (in front of its last
four ids) to one block plus K+1 tokens. Sent twice, the second time the block
comes from the prefix cache and only the last K+1 tokens are scheduled: the
shape of a uniform speculative decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

INSTRUCTION = "Reply with OK."
TAIL_TOKENS = 4
MAX_TOKENS = 12
TIMEOUT_S = 120.0
SHOWN_IDS = 8

EMULATION_NOTE = (
    "The corruption below is emulated: a CPU has no CUDA graphs, so the test "
    "instrument GRAPHSAFE_EMULATE_GRAPH_HAZARD=1 makes this server answer with "
    "an out-of-vocabulary id wherever a GPU would replay the FULL decode CUDA "
    "graph over a prompt chunk."
)


class DemoError(RuntimeError):
    """The server could not be asked; the message is one sentence."""


@dataclass(frozen=True)
class BoundaryAnswer:
    label: str
    prompt_tokens: int
    block_size: int
    num_speculative_tokens: int
    vocab_size: int
    first: tuple[int, ...]
    second: tuple[int, ...]
    second_text: str

    @property
    def out_of_vocab(self) -> int:
        return sum(token >= self.vocab_size for token in self.second)

    @property
    def garbage(self) -> bool:
        return self.out_of_vocab > 0 or self.second != self.first


def boundary_answer(
    base_url: str,
    label: str,
    *,
    block_size: int,
    num_speculative_tokens: int = 3,
) -> BoundaryAnswer:
    """Send the boundary prompt twice (cold, then on a prefix hit) and keep both."""
    try:
        with httpx.Client(base_url=base_url.rstrip("/"), timeout=TIMEOUT_S) as client:
            models = client.get("/v1/models")
            models.raise_for_status()
            model = str(models.json()["data"][0]["id"])
            length = block_size + num_speculative_tokens + 1
            ids = _boundary_prompt(client, model, length)
            first = _complete(client, model, ids)
            second = _complete(client, model, ids)
            size = _vocab_size(client, model)
    except httpx.HTTPError as error:
        raise DemoError(f"Cannot ask the server at {base_url}: {error}.") from error
    return BoundaryAnswer(
        label=label,
        prompt_tokens=len(ids),
        block_size=block_size,
        num_speculative_tokens=num_speculative_tokens,
        vocab_size=size,
        first=tuple(first[0]),
        second=tuple(second[0]),
        second_text=second[1],
    )


def render(before: BoundaryAnswer, after: BoundaryAnswer) -> list[str]:
    """A few lines: what was sent, the garbage before, the clean answer after."""
    lines = [
        EMULATION_NOTE,
        f'Prompt: "{INSTRUCTION}" padded to {before.prompt_tokens} tokens = one '
        f"{before.block_size}-token block + K+1 ({before.num_speculative_tokens + 1})"
        "; sent twice: the second time the block is a prefix-cache hit and only "
        f"the last {before.num_speculative_tokens + 1} tokens are scheduled.",
    ]
    for answer in (before, after):
        lines.append(f"  {answer.label}: {_verdict(answer)}")
        lines.append(f"      ids {_ids(answer.second)}  text {answer.second_text!r}")
    return lines


def show(
    disabled_url: str,
    enabled_url: str,
    *,
    block_size: int,
    num_speculative_tokens: int = 3,
) -> bool:
    """Print the before/after lines; True when before is garbage and after clean."""
    shape = {"block_size": block_size, "num_speculative_tokens": num_speculative_tokens}
    before = boundary_answer(disabled_url, "plugin disabled", **shape)
    after = boundary_answer(enabled_url, "plugin enabled ", **shape)
    for line in render(before, after):
        print(line)
    return before.garbage and not after.garbage


def _verdict(answer: BoundaryAnswer) -> str:
    if answer.out_of_vocab:
        return (
            f"GARBAGE: {answer.out_of_vocab} of {len(answer.second)} ids are past "
            f"the vocabulary ({answer.vocab_size} tokens)"
        )
    if answer.second != answer.first:
        return "GARBAGE: the cached answer differs from the first one"
    return "clean: the cached answer is identical to the first one"


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(token) for token in ids[:SHOWN_IDS])
    return f"[{shown}{', ...' if len(ids) > SHOWN_IDS else ''}]"


def _boundary_prompt(client: httpx.Client, model: str, length: int) -> list[int]:
    messages = [{"role": "user", "content": INSTRUCTION}]
    ids: list[int] = _post(client, "/tokenize", {"model": model, "messages": messages})[
        "tokens"
    ]
    space: list[int] = _post(
        client,
        "/tokenize",
        {"model": model, "prompt": " ", "add_special_tokens": False},
    )["tokens"]
    if len(space) != 1 or len(ids) + 1 > length:
        raise DemoError(
            f"The boundary prompt needs {length} tokens but the instruction alone "
            f"has {len(ids)} (or a space is not one token)."
        )
    split = len(ids) - TAIL_TOKENS
    return [*ids[:split], *space * (length - len(ids)), *ids[split:]]


def _complete(
    client: httpx.Client, model: str, ids: Sequence[int]
) -> tuple[list[int], str]:
    body = {
        "model": model,
        "prompt": list(ids),
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    choice = _post(client, "/v1/completions", body)["choices"][0]
    return list(choice["token_ids"]), str(choice["text"])


def _vocab_size(client: httpx.Client, model: str) -> int:
    """vLLM rejects a logit bias on an id past the vocabulary and names the size."""
    body = {
        "model": model,
        "prompt": [1],
        "max_tokens": 1,
        "logit_bias": {str(2**31 - 1): 1},
    }
    from vllm_graphsafe.probe.answers import vocab_size_from_message

    response = client.post("/v1/completions", json=body)
    size = vocab_size_from_message(response.text)
    if response.status_code != 400 or size is None:
        raise DemoError("The server did not state its vocabulary size.")
    return size


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    response.raise_for_status()
    return response.json()
