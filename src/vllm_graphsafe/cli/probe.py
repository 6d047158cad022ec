"""``vllm-graphsafe probe``: check a running vLLM server for graph-dispatch corruption.

With K speculative tokens, a prompt chunk of exactly K+1 tokens has the shape of a
uniform spec-decode batch and can be replayed through the FULL decode CUDA graph
although it is prefill. Hybrid and recurrent models then answer with garbage. The
probe sends prompts whose (chunk) length lands on K+1, or on a block or chunk
boundary plus K+1, next to control prompts one token shorter and longer, and
judges the answers with small pure checks:

``vocab``           no generated token id is outside the model's vocabulary;
``repetition``      no degenerate run at the end unless the controls show one too;
``cold_warm``       the same prompt answers identically cold and from prefix cache;
``controls``        a boundary prompt answers in the same kind as its controls;
``concurrent``      prompts sent together answer as they do alone;
``ongoing_decode``  a long greedy decode is unchanged by boundary prompts inserted
                    while it runs.

Vocabulary size: ``--vocab-size`` wins. Otherwise the probe sends one completion
whose ``logit_bias`` names token id 2**31-1; vLLM (0.8.5 and later) rejects it
with HTTP 400 and a message that states the model's vocabulary size, which is the
width of the logits and therefore the bound on sampled ids. When the server
accepts the request or does not state a size, the ``vocab`` check is skipped and
the report says so; ``controls`` still compares the boundary with its controls.

Prompts: the user message "Probe <salt>. Reply with OK." through the chat template
(or as plain text when the model has none), padded with a filler token in front of
its last four ids to an exact length; a shorter length keeps the instruction's
tail. The random salt keeps an earlier probe's prefix cache out of the "cold" run.

Every request has a timeout, and the whole probe sends at most ``--max-requests``
requests: the plan is counted before the first one, and a shared budget stops
unplanned ones (tokenizing answers that came without token ids).

Only the standard library is used; nothing here imports vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import ipaddress
import json
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from vllm_graphsafe.settings import STATS_DIR_ENV
from vllm_graphsafe.stats import read_stats_dir, render_stats

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_ARGUMENT = 2
EXIT_UNREACHABLE = 3
EXIT_NO_TOKENIZE = 4
EXIT_MODEL_MISMATCH = 5
EXIT_HTTP_ERROR = 6
EXIT_TIMEOUT = 7
EXIT_REQUEST_BUDGET = 8
EXIT_BAD_RESPONSE = 9

PASS = "pass"
FAIL = "fail"
SKIP = "skip"

CHECK_NAMES = (
    "vocab",
    "repetition",
    "cold_warm",
    "controls",
    "concurrent",
    "ongoing_decode",
)

REPETITION_THRESHOLD = 12
INSTRUCTION = "Reply with OK."
DECODE_PROMPT = "1 2 3 4 5 6 7 8 9 10"
# Kept at the end of every padded prompt so that it still ends with the chat
# template's assistant turn, whatever filler sits in between.
INSTRUCTION_TAIL_TOKENS = 4
# Far beyond any real vocabulary, so the server must reject it and name the size.
VOCAB_PROBE_TOKEN_ID = 2**31 - 1
# /v1/models, /tokenize (instruction), /tokenize (filler).
BASE_DISCOVERY_REQUESTS = 3
DEFAULT_NUM_SPECULATIVE_TOKENS = 3
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_TOKENS = 24
DEFAULT_DECODE_TOKENS = 256
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_REQUESTS = 200
DEFAULT_CONCURRENCY = 2
ERROR_DETAIL_CHARS = 200


class ProbeError(Exception):
    """A condition that ends the probe early, with its exit status."""

    def __init__(self, exit_status: int, message: str) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.message = message


class HttpStatusError(ProbeError):
    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        sentence = f"The server answered HTTP {status} to {method} {path}"
        if detail:
            sentence += f": {detail}"
        super().__init__(EXIT_HTTP_ERROR, sentence.rstrip(". ") + ".")
        self.status = status
        self.detail = detail


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None


@dataclass(frozen=True)
class Sample:
    """One answer, with its prompt's length and kind and the phase that asked."""

    length: int
    phase: str
    output: Completion
    prompt: str = "padded instruction"


@dataclass(frozen=True)
class CheckResult:
    name: str
    lengths: tuple[int, ...]
    status: str
    detail: str

    @property
    def length_label(self) -> str:
        return "+".join(str(length) for length in self.lengths) or "-"


@dataclass(frozen=True)
class Boundary:
    length: int
    label: str
    controls: tuple[int, ...]


@dataclass(frozen=True)
class ProbePlan:
    boundaries: tuple[Boundary, ...]
    groups: tuple[tuple[int, ...], ...]
    decode_inserts: tuple[int, ...]
    discovery_requests: int
    notes: tuple[str, ...] = ()

    @property
    def solo_lengths(self) -> tuple[int, ...]:
        lengths = {boundary.length for boundary in self.boundaries}
        for boundary in self.boundaries:
            lengths.update(boundary.controls)
        return tuple(sorted(lengths))

    @property
    def boundary_lengths(self) -> tuple[int, ...]:
        return tuple(boundary.length for boundary in self.boundaries)

    @property
    def request_count(self) -> int:
        """Requests the plan sends when every answer carries its token ids."""
        solo = 2 * len(self.solo_lengths)  # cold and warm
        together = sum(len(group) for group in self.groups)
        decode = 2 + len(self.decode_inserts)  # solo, perturbed, inserted prompts
        return self.discovery_requests + solo + together + decode

    def to_json(self) -> dict[str, Any]:
        return {
            "boundaries": [
                {
                    "length": boundary.length,
                    "label": boundary.label,
                    "controls": list(boundary.controls),
                }
                for boundary in self.boundaries
            ],
            "solo_lengths": list(self.solo_lengths),
            "concurrent_groups": [list(group) for group in self.groups],
            "decode_inserts": list(self.decode_inserts),
            "planned_requests": self.request_count,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class ProbeSettings:
    base_url: str
    model: str | None
    num_speculative_tokens: int
    block_size: int
    chunk_size: int | None
    max_tokens: int
    decode_tokens: int
    timeout: float
    max_requests: int
    concurrency: int
    vocab_size: int | None
    api_key: str | None
    json_path: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "num_speculative_tokens": self.num_speculative_tokens,
            "block_size": self.block_size,
            "chunk_size": self.chunk_size,
            "max_tokens": self.max_tokens,
            "decode_tokens": self.decode_tokens,
            "timeout": self.timeout,
            "max_requests": self.max_requests,
            "concurrency": self.concurrency,
            "repetition_threshold": REPETITION_THRESHOLD,
        }


# ------------------------------------------------------------------------ planning


def make_plan(
    num_speculative_tokens: int,
    block_size: int,
    chunk_size: int | None,
    concurrency: int,
    needs_vocab_probe: bool,
) -> ProbePlan:
    """Boundary lengths, their controls, concurrent groups and decode inserts."""
    step = num_speculative_tokens + 1
    labels_by_offset: dict[int, list[str]] = {0: [f"K+1 = {step}"]}
    offsets = [(block_size, f"block {block_size} + K+1")]
    offsets.append((2 * block_size, f"2 x block {block_size} + K+1"))
    if chunk_size is not None:
        offsets.append((chunk_size, f"chunk {chunk_size} + K+1"))
    for offset, label in offsets:
        labels_by_offset.setdefault(offset, []).append(label)

    notes: list[str] = []
    boundaries: list[Boundary] = []
    for offset in sorted(labels_by_offset):
        length = offset + step
        controls = tuple(c for c in (length - 1, length + 1) if c >= 1)
        if len(controls) < 2:
            notes.append(f"control length {length - 1} skipped: a prompt needs a token")
        label = " = ".join(labels_by_offset[offset])
        boundaries.append(Boundary(length, label, controls))

    lengths = [boundary.length for boundary in boundaries]
    return ProbePlan(
        boundaries=tuple(boundaries),
        groups=concurrent_groups(lengths, concurrency),
        decode_inserts=tuple(lengths),
        discovery_requests=BASE_DISCOVERY_REQUESTS + (1 if needs_vocab_probe else 0),
        notes=tuple(notes),
    )


def concurrent_groups(lengths: Sequence[int], size: int) -> tuple[tuple[int, ...], ...]:
    """Groups sent together: each length with itself, then each with the next ones.

    Equal lengths make a uniform batch (the trigger when the length is K+1);
    neighbouring boundary lengths differ by a block, like N and N+block.
    """
    ordered = sorted(set(lengths))
    same = [(length,) * size for length in ordered]
    mixed = [
        tuple(ordered[(start + offset) % len(ordered)] for offset in range(size))
        for start in range(len(ordered) - 1)
    ]
    return tuple(same + mixed)


def fit_plan(plan: ProbePlan, max_model_len: int | None, max_tokens: int) -> ProbePlan:
    """Drop the lengths whose prompt plus answer would not fit the model."""
    if max_model_len is None:
        return plan
    limit = max_model_len - max_tokens

    notes = list(plan.notes)
    boundaries: list[Boundary] = []
    for boundary in plan.boundaries:
        if boundary.length > limit:
            notes.append(
                f"boundary length {boundary.length} ({boundary.label}) skipped: "
                f"it does not fit max_model_len {max_model_len} with "
                f"{max_tokens} new tokens"
            )
            continue
        controls = tuple(c for c in boundary.controls if c <= limit)
        if controls != boundary.controls:
            notes.append(f"control length {boundary.length + 1} skipped: too long")
        boundaries.append(replace(boundary, controls=controls))
    kept = {boundary.length for boundary in boundaries}
    return replace(
        plan,
        boundaries=tuple(boundaries),
        groups=tuple(g for g in plan.groups if set(g) <= kept),
        decode_inserts=tuple(n for n in plan.decode_inserts if n in kept),
        notes=tuple(notes),
    )


def build_prompt(
    instruction_ids: Sequence[int], filler_id: int, length: int
) -> list[int]:
    """A prompt of exactly ``length`` ids: the instruction padded with filler.

    The filler goes in front of the instruction's last few ids, so the prompt
    still ends with the assistant turn. A length shorter than the instruction
    keeps the instruction's tail.
    """
    if length < 1:
        raise ValueError(f"a prompt needs at least one token, not {length}")
    if length <= len(instruction_ids):
        return list(instruction_ids[len(instruction_ids) - length :])
    split = len(instruction_ids) - min(INSTRUCTION_TAIL_TOKENS, len(instruction_ids))
    padding = [filler_id] * (length - len(instruction_ids))
    return [*instruction_ids[:split], *padding, *instruction_ids[split:]]


# -------------------------------------------------------------------------- checks


def out_of_vocab_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    return [
        token_id for token_id in token_ids if token_id < 0 or token_id >= vocab_size
    ]


def trailing_run(items: Sequence[Any]) -> tuple[Any, int]:
    """The last item and how many times it repeats at the end."""
    if not items:
        return None, 0
    last = items[-1]
    count = 0
    for item in reversed(items):
        if item != last:
            break
        count += 1
    return last, count


def degenerate_repetition(
    output: Completion, threshold: int = REPETITION_THRESHOLD
) -> str | None:
    """Describe a run of one token or one character at the end, if long enough."""
    token, token_count = trailing_run(output.token_ids)
    if token_count >= threshold:
        return f"token {token} repeated {token_count} times"
    char, char_count = trailing_run(output.text)
    if char_count >= threshold:
        return f"{char!r} repeated {char_count} times"
    return None


def anomalies(
    output: Completion, vocab_size: int | None, threshold: int = REPETITION_THRESHOLD
) -> set[str]:
    """The kinds of garbage an answer shows."""
    kinds: set[str] = set()
    if vocab_size is not None and out_of_vocab_ids(output.token_ids, vocab_size):
        kinds.add("out-of-vocabulary ids")
    if degenerate_repetition(output, threshold) is not None:
        kinds.add("degenerate repetition")
    return kinds


def first_difference(left: Sequence[Any], right: Sequence[Any]) -> int | None:
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return index
    if len(left) != len(right):
        return min(len(left), len(right))
    return None


def same_output(left: Completion, right: Completion) -> bool:
    return left.token_ids == right.token_ids and left.text == right.text


def describe_difference(left: Completion, right: Completion) -> str:
    index = first_difference(left.token_ids, right.token_ids)
    if index is None:
        return "same ids but different text"

    def id_at(ids: Sequence[int]) -> str:
        return str(ids[index]) if index < len(ids) else "end"

    return f"token {index}: {id_at(left.token_ids)} vs {id_at(right.token_ids)}"


def check_vocab(
    lengths: tuple[int, ...],
    samples: Sequence[Sample],
    vocab_size: int | None,
    subject: str = "",
) -> CheckResult:
    """No answer holds an id outside the vocabulary; ``subject`` prefixes the detail."""
    if vocab_size is None:
        return CheckResult(
            "vocab",
            lengths,
            SKIP,
            f"{subject}vocabulary size unknown; pass --vocab-size",
        )
    bad_phases: list[str] = []
    bad_ids: set[int] = set()
    for sample in samples:
        found = out_of_vocab_ids(sample.output.token_ids, vocab_size)
        if found:
            if sample.phase not in bad_phases:
                bad_phases.append(sample.phase)
            bad_ids.update(found)
    if bad_ids:
        examples = ", ".join(str(i) for i in sorted(bad_ids)[:5])
        return CheckResult(
            "vocab",
            lengths,
            FAIL,
            f"{subject}ids {examples} >= vocab size {vocab_size} "
            f"in {', '.join(bad_phases)}",
        )
    return CheckResult(
        "vocab",
        lengths,
        PASS,
        f"{subject}{len(samples)} answers, all ids < {vocab_size}",
    )


def check_repetition(
    length: int,
    boundary_outputs: Sequence[Completion],
    control_outputs: Mapping[int, Sequence[Completion]],
    threshold: int = REPETITION_THRESHOLD,
) -> CheckResult:
    found = [p for o in boundary_outputs if (p := degenerate_repetition(o, threshold))]
    if not found:
        return CheckResult(
            "repetition", (length,), PASS, f"no run of {threshold}+ at the end"
        )
    in_controls = [
        p
        for outputs in control_outputs.values()
        for o in outputs
        if (p := degenerate_repetition(o, threshold))
    ]
    if in_controls:
        return CheckResult(
            "repetition",
            (length,),
            PASS,
            f"{found[0]}, as in the controls ({in_controls[0]})",
        )
    controls = ", ".join(str(n) for n in sorted(control_outputs)) or "none"
    return CheckResult(
        "repetition",
        (length,),
        FAIL,
        f"{found[0]}; controls {controls} show no such run",
    )


def check_cold_warm(length: int, cold: Completion, warm: Completion) -> CheckResult:
    if same_output(cold, warm):
        return CheckResult(
            "cold_warm", (length,), PASS, f"identical {len(cold.token_ids)} tokens"
        )
    return CheckResult(
        "cold_warm",
        (length,),
        FAIL,
        f"warm answer differs from cold at {describe_difference(cold, warm)}",
    )


def check_controls(
    length: int,
    boundary_outputs: Sequence[Completion],
    control_outputs: Mapping[int, Sequence[Completion]],
    vocab_size: int | None,
    threshold: int = REPETITION_THRESHOLD,
) -> CheckResult:
    if not control_outputs:
        return CheckResult("controls", (length,), SKIP, "no control lengths")
    controls = ", ".join(str(n) for n in sorted(control_outputs))
    boundary_kinds: set[str] = set()
    for output in boundary_outputs:
        boundary_kinds |= anomalies(output, vocab_size, threshold)
    control_kinds: set[str] = set()
    for outputs in control_outputs.values():
        for output in outputs:
            control_kinds |= anomalies(output, vocab_size, threshold)
    extra = sorted(boundary_kinds - control_kinds)
    if extra:
        return CheckResult(
            "controls",
            (length,),
            FAIL,
            f"{' and '.join(extra)}, unlike controls {controls}",
        )
    return CheckResult(
        "controls", (length,), PASS, f"same kind of answer as controls {controls}"
    )


def check_concurrent(
    group: tuple[int, ...],
    outputs: Sequence[Completion],
    solo: Mapping[int, Completion],
    context: str,
) -> CheckResult:
    for length, output in zip(group, outputs, strict=True):
        if not same_output(output, solo[length]):
            return CheckResult(
                "concurrent",
                group,
                FAIL,
                f"{context}: the {length}-token prompt differs from its solo answer "
                f"at {describe_difference(solo[length], output)}",
            )
    return CheckResult("concurrent", group, PASS, f"{context}: all match solo answers")


def continues_counting(text: str, at_least: int = 5) -> bool:
    """Whether ``text`` goes on with 11, 12, 13, ... after "1 2 ... 10"."""
    numbers = [int(match) for match in re.findall(r"\d+", text)[:at_least]]
    return len(numbers) == at_least and numbers == list(range(11, 11 + at_least))


def check_ongoing_decode(
    lengths: tuple[int, ...],
    solo: Completion,
    perturbed: Completion,
    overlapped_inserts: int,
) -> CheckResult:
    counting = "continues counting" if continues_counting(solo.text) else "not counting"
    if not same_output(solo, perturbed):
        return CheckResult(
            "ongoing_decode",
            lengths,
            FAIL,
            f"with boundary prompts inserted the decode differs from the solo run at "
            f"{describe_difference(solo, perturbed)}",
        )
    if overlapped_inserts == 0:
        return CheckResult(
            "ongoing_decode",
            lengths,
            SKIP,
            "the decode ended before any boundary prompt arrived; "
            "raise --decode-tokens",
        )
    return CheckResult(
        "ongoing_decode",
        lengths,
        PASS,
        f"{len(solo.token_ids)} tokens match the solo run with {overlapped_inserts} "
        f"prompts inserted while it ran ({counting})",
    )


# ---------------------------------------------------------------------------- HTTP


class RequestBudget:
    """A hard, thread-safe bound on the number of HTTP requests."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            if self.used >= self.limit:
                raise ProbeError(
                    EXIT_REQUEST_BUDGET,
                    f"The probe needed more than --max-requests {self.limit} requests "
                    f"(answers without token ids cost extra tokenize requests).",
                )
            self.used += 1


class Progress:
    """A one-line progress bar on a terminal; silent anywhere else."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.enabled = stream.isatty()
        self._lock = threading.Lock()

    def advance(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done += 1
            filled = min(self.done, self.total) * 30 // self.total
            bar = "#" * filled + "." * (30 - filled)
            self.stream.write(f"\rprobe [{bar}] {self.done}/{self.total} requests")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\r" + " " * 70 + "\r")
            self.stream.flush()


def normalize_base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def error_detail(body: bytes) -> str:
    """The server's own words about an error, on one short line."""
    text = body.decode("utf-8", "replace")
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(payload.get("message"), str):
            text = payload["message"]
        elif isinstance(payload.get("detail"), str):
            text = payload["detail"]
    text = " ".join(text.split())
    if len(text) > ERROR_DETAIL_CHARS:
        text = text[: ERROR_DETAIL_CHARS - 3] + "..."
    return text


class ServerClient:
    """JSON over HTTP with one timeout per request and a shared request budget."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        budget: RequestBudget,
        progress: Progress,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.budget = budget
        self.progress = progress
        self.api_key = api_key
        handlers: list[urllib.request.BaseHandler] = []
        if is_loopback(base_url):
            # A proxy from the environment can never serve a loopback address.
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    def get_json(self, path: str) -> Any:
        return self._exchange("GET", path, None)

    def post_json(self, path: str, payload: Mapping[str, Any]) -> Any:
        return self._exchange("POST", path, payload)

    def post_stream(self, path: str, payload: Mapping[str, Any]) -> Iterator[Any]:
        """The JSON events of a server-sent event stream, until ``[DONE]``."""
        deadline = time.monotonic() + self.timeout
        response = self._open("POST", path, payload)
        try:
            while True:
                try:
                    line = response.readline()
                except (TimeoutError, OSError, http.client.HTTPException) as error:
                    raise self._translate(error, "POST", path) from None
                if time.monotonic() > deadline:
                    raise self._timeout("POST", path)
                if not line:
                    return
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue
                data = text[len("data:") :].strip()
                if data == "[DONE]":
                    return
                yield self._decode(data.encode(), "POST", path)
        finally:
            response.close()
            self.progress.advance()

    def _exchange(
        self, method: str, path: str, payload: Mapping[str, Any] | None
    ) -> Any:
        response = self._open(method, path, payload)
        try:
            body = response.read()
        except (TimeoutError, OSError, http.client.HTTPException) as error:
            raise self._translate(error, method, path) from None
        finally:
            response.close()
            self.progress.advance()
        return self._decode(body, method, path)

    def _open(
        self, method: str, path: str, payload: Mapping[str, Any] | None
    ) -> http.client.HTTPResponse:
        self.budget.take()
        headers = {"Accept": "application/json"}
        data = None
        if payload is not None:
            data = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )
        try:
            response: http.client.HTTPResponse = self._opener.open(
                request, timeout=self.timeout
            )
        except urllib.error.HTTPError as error:
            try:
                detail = error_detail(error.read())
            except (TimeoutError, OSError, http.client.HTTPException):
                detail = ""
            finally:
                error.close()
                self.progress.advance()
            raise HttpStatusError(error.code, method, path, detail) from None
        except urllib.error.URLError as error:
            self.progress.advance()
            reason = error.reason
            if isinstance(reason, TimeoutError):
                raise self._timeout(method, path) from None
            if isinstance(reason, ConnectionRefusedError):
                explanation = "connection refused"
            else:
                explanation = str(reason)
            raise ProbeError(
                EXIT_UNREACHABLE,
                f"Cannot reach the server at {self.base_url} ({explanation}).",
            ) from None
        except (TimeoutError, OSError, http.client.HTTPException) as error:
            self.progress.advance()
            raise self._translate(error, method, path) from None
        return response

    def _translate(self, error: BaseException, method: str, path: str) -> ProbeError:
        if isinstance(error, TimeoutError):
            return self._timeout(method, path)
        return ProbeError(
            EXIT_UNREACHABLE,
            f"The server at {self.base_url} dropped the connection during "
            f"{method} {path} ({type(error).__name__}).",
        )

    def _timeout(self, method: str, path: str) -> ProbeError:
        return ProbeError(
            EXIT_TIMEOUT,
            f"{method} {path} got no complete answer within {self.timeout:g} seconds, "
            f"so the server may be hung.",
        )

    def _decode(self, body: bytes, method: str, path: str) -> Any:
        try:
            return json.loads(body)
        except ValueError:
            raise ProbeError(
                EXIT_BAD_RESPONSE,
                f"The server answered {method} {path} with something that is not JSON.",
            ) from None


# ------------------------------------------------------------------ server answers


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


def first_choice(payload: Any, path: str) -> Mapping[str, Any]:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProbeError(
            EXIT_BAD_RESPONSE, f"The server's answer to POST {path} has no choices."
        )
    return choices[0]


def vocab_size_from_message(message: str) -> int | None:
    match = re.search(r"vocabulary size:?\s*(\d+)", message, re.IGNORECASE)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class ServedModel:
    model_id: str
    max_model_len: int | None


def choose_model(payload: Any, wanted: str | None) -> ServedModel:
    """The served model to probe: ``wanted`` if given, else the first base model."""
    entries = payload.get("data") if isinstance(payload, dict) else None
    models = [e for e in entries or [] if isinstance(e, dict) and e.get("id")]
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


# ------------------------------------------------------------------------- session


@dataclass
class ProbeState:
    """Everything learnt so far; the report is written from it even after an error."""

    settings: ProbeSettings
    plan: ProbePlan
    salt: str
    model: ServedModel | None = None
    vocab_size: int | None = None
    vocab_size_source: str = "unknown"
    instruction_source: str = ""
    decode_prompt_tokens: int | None = None
    samples: list[Sample] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)


class ProbeSession:
    def __init__(self, client: ServerClient, state: ProbeState) -> None:
        self.client = client
        self.state = state
        self.settings = state.settings
        self.prompts: dict[int, list[int]] = {}
        self.decode_tokens = state.settings.decode_tokens
        self._samples_lock = threading.Lock()

    @property
    def model_id(self) -> str:
        assert self.state.model is not None
        return self.state.model.model_id

    # discovery

    def discover(self) -> None:
        self.state.model = choose_model(
            self.client.get_json("/v1/models"), self.settings.model
        )
        instruction_ids = self._tokenize_instruction()
        filler_id = self._filler_id()
        if self.settings.vocab_size is not None:
            self.state.vocab_size = self.settings.vocab_size
            self.state.vocab_size_source = "--vocab-size"
        else:
            self.state.vocab_size = self._discover_vocab_size(filler_id)
            if self.state.vocab_size is not None:
                self.state.vocab_size_source = "server (logit_bias validation)"
        self.state.plan = fit_plan(
            self.state.plan, self.state.model.max_model_len, self.settings.max_tokens
        )
        if not self.state.plan.boundaries:
            raise ProbeError(
                EXIT_BAD_ARGUMENT,
                f"No boundary length fits max_model_len "
                f"{self.state.model.max_model_len} of the served model.",
            )
        notes = list(self.state.plan.notes)
        max_model_len = self.state.model.max_model_len
        # Room for the counting prompt, which is a few tokens in any tokenizer.
        if max_model_len is not None and self.decode_tokens > max_model_len - 64:
            self.decode_tokens = max(max_model_len - 64, 1)
            notes.append(f"long decode shortened to {self.decode_tokens} tokens")
        for length in self.state.plan.solo_lengths:
            self.prompts[length] = build_prompt(instruction_ids, filler_id, length)
            if length < len(instruction_ids):
                notes.append(
                    f"length {length} is shorter than the {len(instruction_ids)}-token "
                    f"instruction, so it keeps the instruction's last {length} ids"
                )
        self.state.plan = replace(self.state.plan, notes=tuple(notes))

    def _tokenize(self, payload: Mapping[str, Any]) -> list[int]:
        try:
            answer = self.client.post_json(
                "/tokenize", {"model": self.model_id, **payload}
            )
        except HttpStatusError as error:
            if error.status == 404 and "model" not in error.detail.lower():
                raise ProbeError(
                    EXIT_NO_TOKENIZE,
                    f"The server at {self.client.base_url} has no /tokenize endpoint "
                    f"(HTTP 404), which the probe needs to build exact-length prompts.",
                ) from None
            raise
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ProbeError(
                EXIT_BAD_RESPONSE, "The server's /tokenize answer has no token list."
            )
        return list(tokens)

    def _tokenize_instruction(self) -> list[int]:
        content = f"Probe {self.state.salt}. {INSTRUCTION}"
        try:
            ids = self._tokenize(
                {
                    "messages": [{"role": "user", "content": content}],
                    "add_generation_prompt": True,
                }
            )
            self.state.instruction_source = "chat template"
        except HttpStatusError as error:
            if error.status not in (400, 422):
                raise
            # No chat template: the plain text with the tokenizer's special tokens.
            ids = self._tokenize({"prompt": content, "add_special_tokens": True})
            self.state.instruction_source = "plain prompt (no chat template)"
        if not ids:
            raise ProbeError(
                EXIT_BAD_RESPONSE, "The server tokenized the instruction to no tokens."
            )
        return ids

    def _filler_id(self) -> int:
        ids = self._tokenize({"prompt": " ", "add_special_tokens": False})
        if not ids:
            raise ProbeError(
                EXIT_BAD_RESPONSE, "The server tokenized a single space to no tokens."
            )
        return ids[-1]

    def _discover_vocab_size(self, filler_id: int) -> int | None:
        payload = {
            "model": self.model_id,
            "prompt": [filler_id],
            "max_tokens": 1,
            "temperature": 0,
            "logit_bias": {str(VOCAB_PROBE_TOKEN_ID): 0.0},
        }
        try:
            self.client.post_json("/v1/completions", payload)
        except HttpStatusError as error:
            if error.status in (400, 422):
                return vocab_size_from_message(error.detail)
            raise
        return None

    # completions

    def _completion_payload(
        self, prompt: list[int] | str, max_tokens: int, stream: bool
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model_id,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }
        if stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
            # The long decode must last; greedy output stays deterministic anyway.
            payload["ignore_eos"] = True
        return payload

    def complete(self, length: int, phase: str) -> Completion:
        payload = self._completion_payload(
            self.prompts[length], self.settings.max_tokens, stream=False
        )
        choice = first_choice(
            self.client.post_json("/v1/completions", payload), "/v1/completions"
        )
        text = str(choice.get("text") or "")
        ids = token_ids_of(choice)
        if ids is None:
            ids = self._tokenize({"prompt": text, "add_special_tokens": False})
        output = Completion(tuple(ids), text, choice.get("finish_reason"))
        self._record(Sample(length, phase, output))
        return output

    def stream_decode(
        self, phase: str, on_first_token: Callable[[], None] | None = None
    ) -> Completion:
        payload = self._completion_payload(
            DECODE_PROMPT, self.decode_tokens, stream=True
        )
        pieces: list[str] = []
        ids: list[int] = []
        ids_complete = True
        finish_reason = None
        for event in self.client.post_stream("/v1/completions", payload):
            if not isinstance(event, dict):
                continue
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                self.state.decode_prompt_tokens = usage["prompt_tokens"]
            choices = event.get("choices")
            if not isinstance(choices, list) or not choices:
                continue
            choice = choices[0]
            if not isinstance(choice, dict):
                continue
            text = str(choice.get("text") or "")
            chunk_ids = token_ids_of(choice)
            if chunk_ids is None:
                ids_complete = ids_complete and not text
            else:
                ids.extend(chunk_ids)
            pieces.append(text)
            finish_reason = choice.get("finish_reason") or finish_reason
            if (text or chunk_ids) and on_first_token is not None:
                on_first_token()
                on_first_token = None
        text = "".join(pieces)
        if not ids_complete:
            ids = self._tokenize({"prompt": text, "add_special_tokens": False})
        output = Completion(tuple(ids), text, finish_reason)
        length = self.state.decode_prompt_tokens or 0
        self._record(Sample(length, phase, output, prompt="counting prompt"))
        return output

    def _record(self, sample: Sample) -> None:
        with self._samples_lock:
            self.state.samples.append(sample)

    # phases

    def run_solo(self) -> dict[int, tuple[Completion, Completion]]:
        lengths = self.state.plan.solo_lengths
        cold = {length: self.complete(length, "cold") for length in lengths}
        warm = {length: self.complete(length, "warm") for length in lengths}
        return {length: (cold[length], warm[length]) for length in lengths}

    def run_together(self, group: tuple[int, ...]) -> list[Completion]:
        start_line = threading.Barrier(len(group))

        def send(length: int) -> Completion:
            # A late thread only makes the group less simultaneous; send anyway.
            with contextlib.suppress(threading.BrokenBarrierError):
                start_line.wait(timeout=self.settings.timeout)
            return self.complete(length, f"together {'+'.join(map(str, group))}")

        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            futures = [pool.submit(send, length) for length in group]
            return [future.result() for future in futures]

    def run_decode_with_inserts(
        self,
    ) -> tuple[Completion, list[tuple[int, Completion, bool]]]:
        decoding = threading.Event()
        inserts: list[tuple[int, Completion, bool]] = []
        with ThreadPoolExecutor(max_workers=1) as pool:
            future: Future[Completion] = pool.submit(
                self.stream_decode, "decode with inserts", decoding.set
            )
            while not decoding.wait(0.005) and not future.done():
                pass
            if future.done() and future.exception() is not None:
                future.result()  # the stream failed before it began; raise its error
            for length in self.state.plan.decode_inserts:
                overlapped = not future.done()
                inserts.append((length, self.complete(length, "inserted"), overlapped))
            return future.result(), inserts

    def execute(self) -> list[CheckResult]:
        self.discover()
        plan = self.state.plan
        solo = self.run_solo()
        cold = {length: outputs[0] for length, outputs in solo.items()}
        checks: list[CheckResult] = []
        for group in plan.groups:
            outputs = self.run_together(group)
            checks.append(check_concurrent(group, outputs, cold, "sent together"))
        decode_solo = self.stream_decode("decode solo")
        decode_perturbed, inserts = self.run_decode_with_inserts()
        overlapped = 0
        for length, output, did_overlap in inserts:
            overlapped += did_overlap
            checks.append(
                check_concurrent((length,), [output], cold, "inserted during decode")
            )
        decode_lengths = (
            (self.state.decode_prompt_tokens,)
            if self.state.decode_prompt_tokens
            else ()
        )
        checks.append(
            check_ongoing_decode(
                decode_lengths, decode_solo, decode_perturbed, overlapped
            )
        )
        checks += solo_checks(plan, solo, self.state.vocab_size)
        checks += vocab_checks(self.state.samples, self.state.vocab_size)
        return sorted(checks, key=lambda check: CHECK_NAMES.index(check.name))


def solo_checks(
    plan: ProbePlan,
    solo: Mapping[int, tuple[Completion, Completion]],
    vocab_size: int | None,
) -> list[CheckResult]:
    results = [check_cold_warm(n, *solo[n]) for n in plan.solo_lengths]
    for boundary in plan.boundaries:
        outputs = solo[boundary.length]
        controls = {n: solo[n] for n in boundary.controls}
        results.append(check_repetition(boundary.length, outputs, controls))
        results.append(check_controls(boundary.length, outputs, controls, vocab_size))
    return results


def vocab_checks(
    samples: Sequence[Sample], vocab_size: int | None
) -> list[CheckResult]:
    by_prompt: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        by_prompt.setdefault((sample.prompt, sample.length), []).append(sample)
    return [
        check_vocab(
            (length,) if length else (),
            by_prompt[prompt, length],
            vocab_size,
            subject="" if prompt == Sample.prompt else f"{prompt}: ",
        )
        for prompt, length in sorted(by_prompt, key=lambda key: (key[1], key[0]))
    ]


# -------------------------------------------------------------------------- output


def format_table(checks: Sequence[CheckResult]) -> str:
    rows = [("check", "length", "result", "detail")]
    rows += [(c.name, c.length_label, c.status.upper(), c.detail) for c in checks]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}"
        for row in rows
    ]
    return "\n".join(lines)


def summary_line(checks: Sequence[CheckResult]) -> str:
    counts = {
        status: sum(c.status == status for c in checks) for status in (PASS, FAIL, SKIP)
    }
    verdict = "FAILED" if counts[FAIL] else "passed"
    return (
        f"probe {verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
        f"{counts[SKIP]} skipped"
    )


def build_report(
    state: ProbeState, requests_sent: int, exit_status: int, error: str | None
) -> dict[str, Any]:
    checks = state.checks
    return {
        "tool": "vllm-graphsafe probe",
        "exit_status": exit_status,
        "error": error,
        "server": {
            "base_url": state.settings.base_url,
            "model": state.model.model_id if state.model else None,
            "max_model_len": state.model.max_model_len if state.model else None,
            "vocab_size": state.vocab_size,
            "vocab_size_source": state.vocab_size_source,
            "instruction_source": state.instruction_source,
            "decode_prompt_tokens": state.decode_prompt_tokens,
        },
        "settings": state.settings.to_json(),
        "salt": state.salt,
        "plan": state.plan.to_json(),
        "requests_sent": requests_sent,
        "checks": [
            {
                "name": c.name,
                "lengths": list(c.lengths),
                "status": c.status,
                "passed": c.status != FAIL,
                "detail": c.detail,
            }
            for c in checks
        ],
        "summary": {
            status: sum(c.status == status for c in checks)
            for status in (PASS, FAIL, SKIP)
        },
        "samples": [
            {
                "length": s.length,
                "phase": s.phase,
                "token_ids": list(s.output.token_ids),
                "text": s.output.text,
                "finish_reason": s.output.finish_reason,
            }
            for s in state.samples
        ],
    }


def write_report(path: str, report: Mapping[str, Any]) -> None:
    text = json.dumps(report, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


# ---------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Probe a running vLLM OpenAI-compatible server for the speculative-decoding "
        "CUDA-graph dispatch bug: prompt chunks of exactly K+1 tokens (alone or after "
        "a block/chunk boundary) that are replayed through the decode graph. The "
        "probe compares boundary-length prompts with neighbouring lengths, cold with "
        "prefix-cached runs, concurrent with solo runs, and a long greedy decode of "
        f"{DECODE_PROMPT!r} with and without boundary prompts inserted (with a real "
        "model it should also keep counting). Exit status 0 means every check passed."
    )
    parser.epilog = (
        f"exit status: {EXIT_OK} all checks passed, {EXIT_CHECK_FAILED} a check "
        f"failed, {EXIT_BAD_ARGUMENT} bad argument, {EXIT_UNREACHABLE} server "
        f"unreachable, {EXIT_NO_TOKENIZE} no /tokenize endpoint, "
        f"{EXIT_MODEL_MISMATCH} model mismatch, {EXIT_HTTP_ERROR} HTTP error, "
        f"{EXIT_TIMEOUT} request timed out, {EXIT_REQUEST_BUDGET} --max-requests "
        f"too small, {EXIT_BAD_RESPONSE} answer not like vLLM's"
    )
    parser.add_argument(
        "--base-url", required=True, help="server URL, e.g. http://localhost:8000"
    )
    parser.add_argument(
        "--model", help="served model id to probe (default: the served one)"
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=DEFAULT_NUM_SPECULATIVE_TOKENS,
        metavar="K",
        help="speculative tokens the server uses; vLLM does not publish it "
        f"(default: {DEFAULT_NUM_SPECULATIVE_TOKENS})",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="KV-cache block size; hybrid models often use a larger one "
        f"(default: {DEFAULT_BLOCK_SIZE})",
    )
    parser.add_argument("--chunk-size", type=int, help="prefill chunk size, if chunked")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"tokens generated per probe prompt (default: {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=DEFAULT_DECODE_TOKENS,
        help=f"tokens of the long decode (default: {DEFAULT_DECODE_TOKENS})",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="model vocabulary size (default: asked from the server by one request)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds each request may take (default: {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help=f"hard bound on HTTP requests (default: {DEFAULT_MAX_REQUESTS})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="prompts sent together in each concurrent group "
        f"(default: {DEFAULT_CONCURRENCY}, i.e. pairs)",
    )
    parser.add_argument("--api-key", help="bearer token, if the server wants one")
    parser.add_argument(
        "--json", metavar="PATH", help="write a JSON report to PATH ('-' for stdout)"
    )
    parser.add_argument(
        "--stats-dir",
        default=os.environ.get(STATS_DIR_ENV),
        help="also show the dispatch statistics the server's processes wrote there "
        f"(default: ${STATS_DIR_ENV})",
    )


def settings_from_args(args: argparse.Namespace) -> ProbeSettings:
    """Validated settings; a ``ProbeError`` names the first bad argument."""

    def bad(sentence: str) -> ProbeError:
        return ProbeError(EXIT_BAD_ARGUMENT, sentence)

    base_url = normalize_base_url(str(args.base_url or ""))
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise bad(
            f"--base-url must be an http:// or https:// URL, not {args.base_url!r}."
        )
    at_least = {
        "--num-speculative-tokens": (args.num_speculative_tokens, 1),
        "--block-size": (args.block_size, 1),
        "--max-tokens": (args.max_tokens, 1),
        "--decode-tokens": (args.decode_tokens, 1),
        "--max-requests": (args.max_requests, 1),
        "--concurrency": (args.concurrency, 2),
    }
    if args.chunk_size is not None:
        at_least["--chunk-size"] = (args.chunk_size, 1)
    if args.vocab_size is not None:
        at_least["--vocab-size"] = (args.vocab_size, 1)
    for option, (value, minimum) in at_least.items():
        if value < minimum:
            raise bad(f"{option} must be at least {minimum}, not {value}.")
    if not args.timeout > 0:
        raise bad(
            f"--timeout must be a positive number of seconds, not {args.timeout}."
        )
    return ProbeSettings(
        base_url=base_url,
        model=args.model,
        num_speculative_tokens=args.num_speculative_tokens,
        block_size=args.block_size,
        chunk_size=args.chunk_size,
        max_tokens=args.max_tokens,
        decode_tokens=args.decode_tokens,
        timeout=float(args.timeout),
        max_requests=args.max_requests,
        concurrency=args.concurrency,
        vocab_size=args.vocab_size,
        api_key=args.api_key,
        json_path=args.json,
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ProbeError as error:
        print(error.message, file=sys.stderr)
        return error.exit_status

    plan = make_plan(
        settings.num_speculative_tokens,
        settings.block_size,
        settings.chunk_size,
        settings.concurrency,
        needs_vocab_probe=settings.vocab_size is None,
    )
    state = ProbeState(settings, plan, salt=f"{random.randrange(16**6):06x}")
    budget = RequestBudget(settings.max_requests)
    progress = Progress(plan.request_count, sys.stderr)
    error_message: str | None = None
    try:
        if plan.request_count > settings.max_requests:
            raise ProbeError(
                EXIT_REQUEST_BUDGET,
                f"The probe plan needs {plan.request_count} requests but "
                f"--max-requests is {settings.max_requests}.",
            )
        client = ServerClient(
            settings.base_url, settings.timeout, budget, progress, settings.api_key
        )
        state.checks = ProbeSession(client, state).execute()
        exit_status = (
            EXIT_CHECK_FAILED
            if any(c.status == FAIL for c in state.checks)
            else EXIT_OK
        )
    except ProbeError as error:
        exit_status = error.exit_status
        error_message = error.message
    finally:
        progress.close()

    if error_message is not None:
        print(error_message, file=sys.stderr)
    else:
        table_stream = sys.stderr if settings.json_path == "-" else sys.stdout
        print(format_table(state.checks), file=table_stream)
        print(summary_line(state.checks), file=table_stream)
    dispatch_stats = None
    if args.stats_dir and os.path.isdir(args.stats_dir):
        dispatch_stats = read_stats_dir(args.stats_dir)
        print("\n".join(render_stats(dispatch_stats)), file=sys.stderr)
    if settings.json_path:
        report = build_report(state, budget.used, exit_status, error_message)
        if dispatch_stats is not None:
            report["dispatch_stats"] = dispatch_stats
        try:
            write_report(settings.json_path, report)
        except OSError as error:
            reason = error.strerror or type(error).__name__
            print(
                f"Cannot write the JSON report to {settings.json_path}: {reason}.",
                file=sys.stderr,
            )
            return EXIT_BAD_ARGUMENT if exit_status == EXIT_OK else exit_status
    return exit_status
