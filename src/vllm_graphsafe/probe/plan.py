"""Which prompt lengths the probe sends, and how: pure functions of the settings.

Boundary lengths are K+1, a block (or chunk) plus K+1, and two blocks plus K+1,
each next to controls one token shorter and longer. With 800-token blocks and
K = 3 the first block boundary is the case first reported, an 804-token prompt.
When the served model's context allows them, the reported long prompts join the
plan: 88,800 and 99,200 tokens of context (111 and 124 blocks of 800, rounded up
to whole blocks of the server's size) plus K+1, i.e. 88,804 and 99,204 tokens for
K = 3; they are sent cold and warm, together as a pair, and the first one is
inserted into the ongoing decode, as in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

#: /v1/models, /tokenize (instruction), /tokenize (filler).
BASE_DISCOVERY_REQUESTS = 3
#: The first reported case's cache block size and its long prompts' context lengths.
SEED_BLOCK_SIZE = 800
SEED_LONG_CONTEXTS = (111 * SEED_BLOCK_SIZE, 124 * SEED_BLOCK_SIZE)
# Kept at the end of every padded prompt so that it still ends with the chat
# template's assistant turn, whatever filler sits in between.
INSTRUCTION_TAIL_TOKENS = 4


@dataclass(frozen=True)
class Boundary:
    length: int
    label: str
    controls: tuple[int, ...]
    long: bool = False


@dataclass(frozen=True)
class ProbePlan:
    boundaries: tuple[Boundary, ...]
    groups: tuple[tuple[int, ...], ...]
    decode_inserts: tuple[int, ...]
    discovery_requests: int
    notes: tuple[str, ...] = ()

    @property
    def solo_lengths(self) -> tuple[int, ...]:
        return tuple(
            sorted({n for b in self.boundaries for n in (b.length, *b.controls)})
        )

    @property
    def boundary_lengths(self) -> tuple[int, ...]:
        return tuple(boundary.length for boundary in self.boundaries)

    @property
    def long_lengths(self) -> tuple[int, ...]:
        return tuple(b.length for b in self.boundaries if b.long)

    @property
    def request_count(self) -> int:
        """When every answer carries its token ids."""
        solo = 2 * len(self.solo_lengths)  # cold and warm
        together = sum(len(group) for group in self.groups)
        decode = 2 + len(self.decode_inserts)  # solo, perturbed, inserted prompts
        return self.discovery_requests + solo + together + decode

    def to_json(self) -> dict[str, Any]:
        return {
            "boundaries": [
                dict(asdict(boundary), controls=list(boundary.controls))
                for boundary in self.boundaries
            ],
            "solo_lengths": list(self.solo_lengths),
            "concurrent_groups": [list(group) for group in self.groups],
            "decode_inserts": list(self.decode_inserts),
            "planned_requests": self.request_count,
            "notes": list(self.notes),
        }


def make_plan(
    num_speculative_tokens: int,
    block_size: int,
    chunk_size: int | None,
    concurrency: int,
    needs_vocab_probe: bool,
) -> ProbePlan:
    step = num_speculative_tokens + 1
    first_block = f"block {block_size} + K+1"
    if block_size == SEED_BLOCK_SIZE and step == 4:
        first_block += " (the case first reported)"
    offsets = [
        (0, f"K+1 = {step}"),
        (block_size, first_block),
        (2 * block_size, f"2 x block {block_size} + K+1"),
    ]
    if chunk_size is not None:
        offsets.append((chunk_size, f"chunk {chunk_size} + K+1"))
    labels_by_offset: dict[int, list[str]] = {}
    for offset, label in offsets:
        labels_by_offset.setdefault(offset, []).append(label)

    # K >= 1, so every boundary is at least 2 tokens and has both controls.
    boundaries: list[Boundary] = []
    for offset, labels in sorted(labels_by_offset.items()):
        length = offset + step
        boundaries.append(
            Boundary(length, " = ".join(labels), (length - 1, length + 1))
        )
    lengths = [boundary.length for boundary in boundaries]
    return ProbePlan(
        boundaries=tuple(boundaries),
        groups=concurrent_groups(lengths, concurrency),
        decode_inserts=tuple(lengths),
        discovery_requests=BASE_DISCOVERY_REQUESTS + (1 if needs_vocab_probe else 0),
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


def with_long_prompts(
    plan: ProbePlan,
    num_speculative_tokens: int,
    block_size: int,
    max_model_len: int | None,
    max_tokens: int,
    max_requests: int,
) -> ProbePlan:
    """``plan`` plus the reported long prompts, where the server and budget allow.

    They have no controls: a long prompt one token off would cost as much again.
    """
    longs: list[Boundary] = []
    for context in SEED_LONG_CONTEXTS:
        blocks = -(-context // block_size)  # whole blocks, rounded up
        length = blocks * block_size + num_speculative_tokens + 1
        label = f"long: {blocks} x block {block_size} + K+1"
        longs.append(Boundary(length, label, controls=(), long=True))
    lengths = ", ".join(f"{b.length:,}" for b in longs)
    if max_model_len is None:
        why = "the server states no max_model_len"
    elif any(b.length > max_model_len - max_tokens for b in longs):
        why = (
            f"they do not fit max_model_len {max_model_len} with {max_tokens} "
            f"new tokens"
        )
    else:
        extended = replace(
            plan,
            boundaries=(*plan.boundaries, *longs),
            groups=(*plan.groups, tuple(b.length for b in longs)),
            decode_inserts=(*plan.decode_inserts, longs[0].length),
            notes=(
                *plan.notes,
                f"long prompts {lengths} included; cold, each can take minutes: "
                f"raise --timeout if they time out",
            ),
        )
        if extended.request_count <= max_requests:
            return extended
        why = (
            f"with them the plan needs {extended.request_count} requests, more "
            f"than --max-requests {max_requests}"
        )
    return replace(
        plan, notes=(*plan.notes, f"long prompts ({lengths}) skipped: {why}")
    )


def build_prompt(
    instruction_ids: Sequence[int], filler_id: int, length: int
) -> list[int]:
    """The instruction padded with filler in front of its last few ids to exactly
    ``length`` ids; a length shorter than the instruction keeps its tail."""
    if length <= len(instruction_ids):
        return list(instruction_ids[len(instruction_ids) - length :])
    split = len(instruction_ids) - min(INSTRUCTION_TAIL_TOKENS, len(instruction_ids))
    padding = [filler_id] * (length - len(instruction_ids))
    return [*instruction_ids[:split], *padding, *instruction_ids[split:]]
