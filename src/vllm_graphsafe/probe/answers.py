"""Reading vLLM's answers: served models, choices, token ids, error details."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_graphsafe.probe.errors import (
    EXIT_BAD_RESPONSE,
    EXIT_MODEL_MISMATCH,
    ProbeError,
)

ERROR_DETAIL_CHARS = 200
_HTML_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def error_detail(body: bytes) -> str:
    """The server's own words about an error, on one short line; never raw HTML."""
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("<"):
        title = _HTML_TITLE.search(text)
        heading = " ".join(title.group(1).split()) if title else ""
        return f"an HTML page titled {heading!r}" if heading else "an HTML page"
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        said = (error, payload.get("message"), payload.get("detail"))
        text = next((words for words in said if isinstance(words, str)), text)
    text = " ".join(text.split())
    if len(text) > ERROR_DETAIL_CHARS:
        text = text[: ERROR_DETAIL_CHARS - 3] + "..."
    return text


def token_ids_of(choice: Mapping[str, Any]) -> list[int] | None:
    """Generated ids from ``token_ids``, else from ``token_id:N`` logprob tokens."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return list(ids)
    logprobs = choice.get("logprobs")
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if isinstance(tokens, list) and tokens:
        parsed = [re.fullmatch(r"token_id:(\d+)", str(token)) for token in tokens]
        if all(parsed):
            return [int(match.group(1)) for match in parsed if match]
    return None


def first_choice(payload: Any) -> Mapping[str, Any]:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProbeError(
            EXIT_BAD_RESPONSE,
            "The server's answer to POST /v1/completions has no choices.",
        )
    return choices[0]


def vocab_size_from_message(message: str) -> int | None:
    match = re.search(r"vocabulary size:?\s*(\d+)", message, re.IGNORECASE)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class ServedModel:
    model_id: str
    max_model_len: int | None


def choose_model(entries: list[Any], wanted: str | None) -> ServedModel:
    """The served model to probe: ``wanted`` if given, else the first base model."""
    models = [e for e in entries if isinstance(e, dict) and e.get("id")]
    if not models:
        raise ProbeError(EXIT_BAD_RESPONSE, "The server lists no models at /v1/models.")
    if wanted is not None:
        chosen = next((m for m in models if m["id"] == wanted), None)
        if chosen is None:
            served = ", ".join(repr(str(m["id"])) for m in models)
            raise ProbeError(
                EXIT_MODEL_MISMATCH,
                f"Model mismatch: the server serves {served}, not {wanted!r}.",
            )
    else:
        # LoRA adapters are listed with a parent; the base model has none.
        chosen = next((m for m in models if not m.get("parent")), models[0])
    max_len = chosen.get("max_model_len")
    return ServedModel(str(chosen["id"]), max_len if isinstance(max_len, int) else None)
