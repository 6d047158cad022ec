"""One probe of one server: discovery, the planned requests, the checks.

Prompts are the user message "Probe <salt>. Reply with OK." through the chat
template (plain text when the model has none), padded to exact lengths
(``plan.build_prompt``); the random salt keeps an earlier probe's prefix cache out
of the "cold" run.

Vocabulary size: unless given, the probe sends one completion whose
``logit_bias`` names token id 2**31-1; vLLM (0.8.5 and later) rejects it with
HTTP 400 and a message that states the model's vocabulary size, the width of the
logits and so the bound on sampled ids. Without it the ``vocab`` check cannot run.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_graphsafe.probe import answers, errors
from vllm_graphsafe.probe.checks import (
    CHECK_NAMES,
    CheckResult,
    Completion,
    Sample,
    check_cold_warm,
    check_concurrent,
    check_controls,
    check_ongoing_decode,
    check_repetition,
    check_vocab,
)
from vllm_graphsafe.probe.client import ServerClient
from vllm_graphsafe.probe.errors import HttpStatusError, ProbeError
from vllm_graphsafe.probe.overlap import DecodeWatch, InsertSpan
from vllm_graphsafe.probe.plan import (
    ProbePlan,
    build_prompt,
    fit_plan,
    with_long_prompts,
)
from vllm_graphsafe.probe.settings import ProbeSettings

INSTRUCTION = "Reply with OK."
DECODE_PROMPT = "1 2 3 4 5 6 7 8 9 10"
# Far beyond any real vocabulary, so the server must reject it and name the size.
VOCAB_PROBE_TOKEN_ID = 2**31 - 1
#: Room left in the context for the counting prompt: about 20 tokens in any
#: tokenizer, one per character at worst, plus its special tokens.
DECODE_PROMPT_ROOM = 32
#: Without a stated max_model_len, the long decode may run to this many times
#: --decode-tokens.
UNKNOWN_CONTEXT_DECODE_FACTOR = 16
#: Decodes with inserts tried before the ongoing-decode check is given up: a
#: loaded server can stream the whole decode before it answers an inserted prompt.
DECODE_ATTEMPTS = 3


@dataclass(frozen=True)
class DecodeRun:
    """The decode with prompts inserted, each inserted prompt's answer and span."""

    decode: Completion
    inserts: tuple[tuple[InsertSpan, Completion], ...]
    #: Tokens the stream gave, counted as the spans count them.
    streamed: int

    @property
    def overlapped(self) -> int:
        return sum(
            span.sent_at > 0 and span.answered_at < self.streamed
            for span, _ in self.inserts
        )


@dataclass
class ProbeState:
    """Everything learnt so far; the report is written from it even after an error."""

    settings: ProbeSettings
    base_url: str
    plan: ProbePlan
    salt: str
    model: answers.ServedModel | None = None
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
        self.decode_limit = self.decode_tokens * UNKNOWN_CONTEXT_DECODE_FACTOR
        self.decode_attempts = 0
        self._samples_lock = threading.Lock()

    @property
    def model_id(self) -> str:
        assert self.state.model is not None
        return self.state.model.model_id

    def discover(self) -> None:
        self.state.model = self._served_model()
        max_model_len = self.state.model.max_model_len
        instruction_ids = self._tokenize_instruction()
        filler_id = self._filler_id()
        if self.settings.vocab_size is not None:
            self.state.vocab_size = self.settings.vocab_size
            self.state.vocab_size_source = "--vocab-size"
        else:
            self.state.vocab_size = self._discover_vocab_size(filler_id)
            if self.state.vocab_size is not None:
                self.state.vocab_size_source = "server (logit_bias validation)"
        self.state.plan = self._fitted_plan(max_model_len)
        self.client.progress.total = max(self.state.plan.request_count, 1)
        self.client.progress.refresh()
        notes = list(self.state.plan.notes)
        if max_model_len is not None:
            self.decode_limit = max(max_model_len - DECODE_PROMPT_ROOM, 1)
            if self.decode_tokens > self.decode_limit:
                self.decode_tokens = self.decode_limit
                notes.append(f"long decode shortened to {self.decode_tokens} tokens")
        for length in self.state.plan.solo_lengths:
            self.prompts[length] = build_prompt(instruction_ids, filler_id, length)
            if length < len(instruction_ids):
                notes.append(
                    f"length {length} is shorter than the {len(instruction_ids)}-token "
                    f"instruction, so it keeps the instruction's last {length} ids"
                )
        self.state.plan = replace(self.state.plan, notes=tuple(notes))

    def _served_model(self) -> answers.ServedModel:
        """The model to probe; anything but vLLM's model list is not a vLLM server."""
        try:
            listing = self.client.request_json("/v1/models")
        except HttpStatusError as error:
            if not 400 <= error.status < 500:
                raise
            answer = f" with {error.detail}" if error.detail else ""
            why = f"answered HTTP {error.status}{answer}"
        except ProbeError as error:
            if error.exit_status != errors.EXIT_BAD_RESPONSE:
                raise
            why = "answered with something not JSON"
        else:
            entries = listing.get("data") if isinstance(listing, dict) else None
            if isinstance(entries, list):
                return answers.choose_model(entries, self.settings.model)
            why = "answered without a list of models"
        raise ProbeError(
            errors.EXIT_BAD_RESPONSE,
            f"The server at {self.client.base_url} is not a vLLM server: "
            f"GET /v1/models {why}.",
        )

    def _fitted_plan(self, max_model_len: int | None) -> ProbePlan:
        settings = self.settings
        plan = fit_plan(self.state.plan, max_model_len, settings.max_tokens)
        if not plan.boundaries:
            raise ProbeError(
                errors.EXIT_BAD_ARGUMENT,
                f"No boundary length fits max_model_len {max_model_len} "
                f"of the served model.",
            )
        if not settings.long_prompts:
            note = "long prompts skipped: --no-long-prompts"
            return replace(plan, notes=(*plan.notes, note))
        return with_long_prompts(
            plan,
            settings.num_speculative_tokens,
            settings.block_size,
            max_model_len,
            settings.max_tokens,
            settings.max_requests,
        )

    def _tokenize(self, payload: Mapping[str, Any], what: str = "") -> list[int]:
        """The ids of ``payload``; if ``what`` is named, a ``ProbeError`` for none."""
        try:
            answer = self.client.request_json(
                "/tokenize", {"model": self.model_id, **payload}
            )
        except HttpStatusError as error:
            if error.status == 404 and "model" not in error.detail.lower():
                raise ProbeError(
                    errors.EXIT_NO_TOKENIZE,
                    f"The server at {self.client.base_url} has no /tokenize endpoint "
                    f"(HTTP 404), which the probe needs to build exact-length prompts.",
                ) from None
            raise
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ProbeError(
                errors.EXIT_BAD_RESPONSE,
                "The server's /tokenize answer has no token list.",
            )
        if what and not tokens:
            sentence = f"The server tokenized {what} to no tokens."
            raise ProbeError(errors.EXIT_BAD_RESPONSE, sentence)
        return list(tokens)

    def _tokenize_instruction(self) -> list[int]:
        content = f"Probe {self.state.salt}. {INSTRUCTION}"
        try:
            ids = self._tokenize(
                {
                    "messages": [{"role": "user", "content": content}],
                    "add_generation_prompt": True,
                },
                "the instruction",
            )
            self.state.instruction_source = "chat template"
        except HttpStatusError as error:
            if error.status not in (400, 422):
                raise
            # No chat template: the plain text with the tokenizer's special tokens.
            plain = {"prompt": content, "add_special_tokens": True}
            ids = self._tokenize(plain, "the instruction")
            self.state.instruction_source = "plain prompt (no chat template)"
        return ids

    def _filler_id(self) -> int:
        space = {"prompt": " ", "add_special_tokens": False}
        return self._tokenize(space, "a single space")[-1]

    def _discover_vocab_size(self, filler_id: int) -> int | None:
        payload = {
            "model": self.model_id,
            "prompt": [filler_id],
            "max_tokens": 1,
            "temperature": 0,
            "logit_bias": {str(VOCAB_PROBE_TOKEN_ID): 0.0},
        }
        try:
            self.client.request_json("/v1/completions", payload)
        except HttpStatusError as error:
            if error.status in (400, 422):
                return answers.vocab_size_from_message(error.detail)
            raise
        return None

    def _completion_payload(
        self, prompt: list[int] | str, max_tokens: int
    ) -> dict[str, Any]:
        return {
            "model": self.model_id,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }

    def complete(self, length: int, phase: str) -> Completion:
        prompt = self.prompts[length]
        payload = self._completion_payload(prompt, self.settings.max_tokens)
        answer = self.client.request_json("/v1/completions", payload)
        choice = answers.first_choice(answer)
        text = str(choice.get("text") or "")
        ids = answers.token_ids_of(choice)
        if ids is None:
            ids = self._tokenize({"prompt": text, "add_special_tokens": False})
        output = Completion(tuple(ids), text, choice.get("finish_reason"))
        self._record(Sample(length, phase, output))
        return output

    def stream_decode(self, max_tokens: int, watch: DecodeWatch) -> Completion:
        """The counting prompt's greedy decode, streamed; ``watch`` follows it
        and may have the probe close the stream before the server ends it."""
        payload = {
            **self._completion_payload(DECODE_PROMPT, max_tokens),
            "stream": True,
            # Usage on every event counts the tokens, with or without their ids.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            # The long decode must last; greedy output stays deterministic anyway.
            "ignore_eos": True,
        }
        pieces: list[str] = []
        ids: list[int] = []
        ids_complete = True
        finish_reason = None
        streamed = 0
        # The decode may last while each inserted prompt takes up to --timeout.
        inserts = len(self.state.plan.decode_inserts)
        events = self.client.post_stream(
            "/v1/completions", payload, limit_s=self.settings.timeout * (inserts + 1)
        )
        try:
            for event in events:
                if not isinstance(event, dict):
                    continue
                usage = event.get("usage")
                usage = usage if isinstance(usage, dict) else {}
                if isinstance(usage.get("prompt_tokens"), int):
                    self.state.decode_prompt_tokens = usage["prompt_tokens"]
                choices = event.get("choices")
                choice = choices[0] if isinstance(choices, list) and choices else None
                if not isinstance(choice, dict):
                    continue
                text = str(choice.get("text") or "")
                chunk_ids = answers.token_ids_of(choice)
                if chunk_ids is None:
                    ids_complete = ids_complete and not text
                    streamed += bool(text)
                else:
                    ids.extend(chunk_ids)
                    streamed += len(chunk_ids)
                if isinstance(usage.get("completion_tokens"), int):
                    streamed = usage["completion_tokens"]
                pieces.append(text)
                finish_reason = choice.get("finish_reason") or finish_reason
                watch.streamed(streamed)
                if watch.may_stop():
                    break
        finally:
            events.close()
            watch.started.set()
        text = "".join(pieces)
        if not ids_complete:
            ids = self._tokenize({"prompt": text, "add_special_tokens": False})
        return Completion(tuple(ids), text, finish_reason)

    def _record_decode(self, phase: str, output: Completion) -> None:
        length = self.state.decode_prompt_tokens or 0
        self._record(Sample(length, phase, output, prompt="counting prompt"))

    def _record(self, sample: Sample) -> None:
        with self._samples_lock:
            self.state.samples.append(sample)

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

    def run_decode_with_inserts(self) -> DecodeRun:
        """The long decode, with each boundary prompt sent in turn while it streams
        (``overlap``: it runs until every inserted prompt is answered)."""
        self.decode_attempts += 1
        watch = DecodeWatch()
        spans: list[tuple[InsertSpan, Completion]] = []
        with ThreadPoolExecutor(max_workers=1) as pool:
            future: Future[Completion] = pool.submit(
                self.stream_decode, self.decode_limit, watch
            )
            try:
                while not watch.started.wait(0.005) and not future.done():
                    pass
                if future.done() and future.exception() is not None:
                    future.result()  # the stream failed before it began
                for length in self.state.plan.decode_inserts:
                    sent_at = watch.tokens()
                    output = self.complete(length, "inserted")
                    spans.append((InsertSpan(length, sent_at, watch.tokens()), output))
                watch.inserts_answered(self.decode_tokens)
            except BaseException:
                watch.abandon()  # the stream must not run on to its limit
                raise
            decode = future.result()
        return DecodeRun(decode, tuple(spans), watch.tokens())

    def why_no_overlap(self, run: DecodeRun) -> str:
        """Why no inserted prompt was answered while the decode ran, in a clause."""
        streamed = run.streamed
        if streamed >= self.decode_limit:
            context = self.state.model.max_model_len if self.state.model else None
            limit = f"max_model_len {context}" if context else "the probe"
            tries = self.decode_attempts
            return (
                f"the decode reached its limit of {self.decode_limit} tokens (set by "
                f"{limit}) before any inserted prompt was answered"
                + (f", in each of {tries} tries" if tries > 1 else "")
            )
        ending = run.decode.finish_reason or "no reason given"
        return (
            f"the server ended the decode after {streamed} tokens ({ending}) before "
            f"any inserted prompt was answered"
        )

    def execute(self) -> list[CheckResult]:
        self.discover()
        plan = self.state.plan
        lengths = plan.solo_lengths
        cold = {length: self.complete(length, "cold") for length in lengths}
        warm = {length: self.complete(length, "warm") for length in lengths}
        solo = {length: (cold[length], warm[length]) for length in lengths}
        checks: list[CheckResult] = []
        for group in plan.groups:
            outputs = self.run_together(group)
            checks.append(check_concurrent(group, outputs, cold, "sent together"))
        perturbed = self.run_decode_with_inserts()
        while (
            not perturbed.overlapped
            and perturbed.streamed >= self.decode_limit
            and self.decode_attempts < DECODE_ATTEMPTS
        ):
            perturbed = self.run_decode_with_inserts()
        try:
            # As long as the perturbed stream ran: greedy, so its prefix repeats.
            solo_tokens = max(perturbed.streamed, 1)
            decode_solo = self.stream_decode(solo_tokens, DecodeWatch())
        finally:
            self._record_decode("decode with inserts", perturbed.decode)
        self._record_decode("decode solo", decode_solo)
        checks += [
            check_concurrent((span.length,), [output], cold, "inserted during decode")
            for span, output in perturbed.inserts
        ]
        prompt_tokens = self.state.decode_prompt_tokens
        checks.append(
            check_ongoing_decode(
                (prompt_tokens,) if prompt_tokens else (),
                decode_solo,
                perturbed.decode,
                perturbed.overlapped,
                len(perturbed.inserts),
                self.why_no_overlap(perturbed),
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
    """cold_warm for every length; repetition and controls for every boundary.
    A long prompt has no controls of its own; it is compared with all the others."""
    results = [check_cold_warm(n, *solo[n]) for n in plan.solo_lengths]
    every_control = {n: solo[n] for b in plan.boundaries for n in b.controls}
    for boundary in plan.boundaries:
        outputs = solo[boundary.length]
        controls = (
            every_control if boundary.long else {n: solo[n] for n in boundary.controls}
        )
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
