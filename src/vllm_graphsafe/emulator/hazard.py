"""What the graph-hazard emulator decides, without vLLM: pure and unit-tested.

A step is *hazardous* when the FULL decode graph replays (dispatched as uniform
decode, and nothing ran the step without the graph) while a hybrid model's
metadata builders run a scheduled row as a prefill (:func:`builder_prefill_rows`).
Every request it scheduled is *poisoned* (the decode rows sharing the step too,
the worst case): each token sampled for it is then the first id past the
vocabulary, as an affected GPU server shows, until it finishes (a corrupted
recurrent or KV state does not heal).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: How many hazardous steps an engine process remembers (for tests and logs).
HAZARD_LOG_LENGTH = 1000


def dispatched_uniform_decode(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """The ``uniform_decode`` argument of ``CudagraphDispatcher.dispatch(self,
    num_tokens, uniform_decode=False, ...)``; ``args`` excludes ``self``."""
    if "uniform_decode" in kwargs:
        return bool(kwargs["uniform_decode"])
    return bool(args[1]) if len(args) > 1 else False


def builder_prefill_rows(
    num_scheduled_tokens: Mapping[str, int],
    scheduled_drafts: Mapping[str, Sequence[int]],
    computed_before: Mapping[str, int],
) -> tuple[str, ...]:
    """The scheduled requests a hybrid model's metadata builders run as prefills.

    As vLLM's linear-attention builders classify rows: a decode schedules
    exactly one token plus the drafts the scheduler handed it (placeholder
    drafts included: the scheduler pads a prompt tail that way to keep the
    decode graph), or one token over prior state (the last token of a chunked
    prompt, or a plain decode); anything else (a first prompt chunk, a prompt
    chunk of K+1 tokens, outputs re-computed after preemption) is a prefill.
    """
    prefills = []
    for req_id, width in num_scheduled_tokens.items():
        drafts = scheduled_drafts.get(req_id)
        if drafts is not None and width == len(drafts) + 1:
            continue
        if width == 1 and computed_before.get(req_id, 0) > 0:
            continue
        prefills.append(req_id)
    return tuple(sorted(prefills))


def step_prefill_rows(scheduler_output: Any) -> tuple[str, ...]:
    """:func:`builder_prefill_rows` of one step's scheduler output."""
    computed = {
        new.req_id: int(new.num_computed_tokens)
        for new in scheduler_output.scheduled_new_reqs
    }
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(
        zip(cached.req_ids, map(int, cached.num_computed_tokens), strict=True)
    )
    return builder_prefill_rows(
        scheduler_output.num_scheduled_tokens,
        scheduler_output.scheduled_spec_decode_tokens or {},
        computed,
    )


@dataclass(frozen=True)
class HazardStep:
    """A real step whose FULL decode graph replayed over prefill rows."""

    step: int
    scheduled: tuple[str, ...]
    prefill_rows: tuple[str, ...]


@dataclass
class StepObservation:
    """What one real step handed to the dispatcher (the last call wins)."""

    scheduled: tuple[str, ...]
    prefill_rows: tuple[str, ...] = ()
    uniform_decode: bool | None = None
    replayed: bool = False

    def observe(self, uniform_decode: bool) -> None:
        self.uniform_decode = uniform_decode

    def replay(self) -> None:
        self.replayed = True

    @property
    def hazardous(self) -> bool:
        return self.replayed and bool(self.prefill_rows)


def corrupted_tokens(
    req_ids: Sequence[str],
    sampled_token_ids: Sequence[Sequence[int]],
    poisoned: Iterable[str],
    corrupt_id: int,
) -> list[list[int]] | None:
    """``sampled_token_ids`` with every poisoned row's ids replaced (rows keep
    their length, so the scheduler's accounting of accepted tokens is
    unchanged), or None when no row of this output is poisoned."""
    hit = set(poisoned)
    if not hit.intersection(req_ids):
        return None
    return [
        [corrupt_id] * len(tokens) if req_id in hit else list(tokens)
        for req_id, tokens in zip(req_ids, sampled_token_ids, strict=False)
    ]


@dataclass
class EmulatorState:
    """Per-process record: steps seen, hazardous steps, poisoned requests."""

    real_steps: int = 0
    uniform_decode_steps: int = 0
    corrupted_token_count: int = 0
    poisoned: set[str] = field(default_factory=set)
    hazards: deque[HazardStep] = field(
        default_factory=lambda: deque(maxlen=HAZARD_LOG_LENGTH)
    )
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def forget(self, finished: Iterable[str]) -> None:
        with self.lock:
            self.poisoned.difference_update(finished)

    def finish_step(self, observation: StepObservation) -> HazardStep | None:
        """Count a real step; poison its requests when it was hazardous."""
        if observation.uniform_decode is None:
            return None  # never reached the dispatcher (no forward pass)
        with self.lock:
            self.real_steps += 1
            if observation.uniform_decode:
                self.uniform_decode_steps += 1
            if not observation.hazardous:
                return None
            hazard = HazardStep(
                self.real_steps, observation.scheduled, observation.prefill_rows
            )
            self.hazards.append(hazard)
            self.poisoned.update(observation.scheduled)
            return hazard

    def corrupt(
        self,
        req_ids: Sequence[str],
        sampled_token_ids: Sequence[Sequence[int]],
        corrupt_id: int,
    ) -> list[list[int]] | None:
        with self.lock:
            replaced = corrupted_tokens(
                req_ids, sampled_token_ids, self.poisoned, corrupt_id
            )
            if replaced is not None:
                self.corrupted_token_count += sum(
                    len(tokens)
                    for req_id, tokens in zip(req_ids, replaced, strict=False)
                    if req_id in self.poisoned
                )
            return replaced
