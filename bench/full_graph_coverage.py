"""Benchmark 4: FULL decode-graph coverage on a synthetic scheduler trace.

A small continuous-batching scheduler, seeded, runs for each decode query
width from 1 to 16 (``1 + K`` with K = 0..15 speculative tokens): requests
arrive in bursts with prompts of 1 to 3000 tokens (many of exactly 4 tokens,
and of exactly the decode width), prefills are chunked under a token budget,
and decodes schedule ``1 + drafts`` tokens, drafts 0..K (ngram proposes fewer
when it finds no match). Some requests are aborted mid-prefill, leaving stale
rows in the request-state table.

Every step is classified three ways with this project's pure functions
(``vllm_graphsafe.logic.phase``): the shape rule alone; the phase rule over the
scheduled rows in batch order (the V1 form); and the phase rule over the whole
request-state table, scanning its rows in prefill (the MRV2 form). The ground
truth comes from the trace itself: a step is genuine uniform decode when every
scheduled request had computed its prompt and schedules exactly the width.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_graphsafe.logic.phase import (
    any_row_scheduled,
    is_uniform_decode,
    rows_in_prefill,
    rows_past_prefill,
    uniform_query_len,
)

WIDTHS = tuple(range(1, 17))
TABLE_ROWS = 64


@dataclass
class Request:
    req_id: str
    prompt_len: int
    max_output: int
    row: int
    computed: int = 0
    generated: int = 0

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prompt_len


@dataclass(frozen=True)
class ScheduledRow:
    req_id: str
    row: int
    prompt_len: int
    computed: int
    scheduled: int


@dataclass(frozen=True)
class TraceStep:
    width: int
    rows: tuple[ScheduledRow, ...]
    #: The request-state table before the step: prefill length and computed
    #: prefill tokens per row, and the owner of each live row.
    table_prefill: np.ndarray
    table_computed: np.ndarray
    owners: dict[int, str]


@dataclass
class Scheduler:
    width: int
    rng: random.Random
    max_num_seqs: int
    token_budget: int
    waiting: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    free_rows: list[int] = field(default_factory=lambda: list(range(TABLE_ROWS)))
    table_prefill: np.ndarray = field(
        default_factory=lambda: np.zeros(TABLE_ROWS, dtype=np.int32)
    )
    table_computed: np.ndarray = field(
        default_factory=lambda: np.zeros(TABLE_ROWS, dtype=np.int32)
    )
    owners: dict[int, str] = field(default_factory=dict)
    next_id: int = 0

    @property
    def num_speculative_tokens(self) -> int:
        return self.width - 1

    def prompt_length(self) -> int:
        roll = self.rng.random()
        if roll < 0.30:
            return 4
        if roll < 0.40:
            return self.width
        if roll < 0.70:
            return self.rng.randint(1, 64)
        if roll < 0.92:
            return self.rng.randint(65, 600)
        return self.rng.randint(601, 3000)

    def arrive(self, burst: bool) -> None:
        count = self.rng.choice((0, 0, 0, 1, 1, 2, 3, 5) if burst else (0,) * 12 + (1,))
        for _ in range(count):
            self.waiting.append(
                Request(
                    req_id=f"req-{self.width}-{self.next_id}",
                    prompt_len=self.prompt_length(),
                    max_output=self.rng.randint(1, 256),
                    row=-1,
                )
            )
            self.next_id += 1

    def drafts(self, request: Request) -> int:
        remaining = request.max_output - request.generated
        if self.rng.random() < 0.9:
            drafts = self.num_speculative_tokens
        else:
            drafts = self.rng.randint(0, self.num_speculative_tokens)
        return max(0, min(drafts, remaining - 1))

    def schedule(self) -> list[tuple[Request, int]]:
        budget = self.token_budget
        scheduled: list[tuple[Request, int]] = []
        for request in self.running:
            if request.in_prefill:
                tokens = min(request.prompt_len - request.computed, budget)
            else:
                tokens = 1 + self.drafts(request)
                if tokens > budget:
                    continue
            if tokens > 0:
                scheduled.append((request, tokens))
                budget -= tokens
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting.pop(0)
            request.row = self.free_rows.pop()
            self.table_prefill[request.row] = request.prompt_len
            self.table_computed[request.row] = 0
            self.owners[request.row] = request.req_id
            self.running.append(request)
            tokens = min(request.prompt_len, budget)
            scheduled.append((request, tokens))
            budget -= tokens
        return scheduled

    def snapshot(self, scheduled: list[tuple[Request, int]]) -> TraceStep:
        return TraceStep(
            width=self.width,
            rows=tuple(
                ScheduledRow(r.req_id, r.row, r.prompt_len, r.computed, tokens)
                for r, tokens in scheduled
            ),
            table_prefill=self.table_prefill.copy(),
            table_computed=self.table_computed.copy(),
            owners=dict(self.owners),
        )

    def advance(self, scheduled: list[tuple[Request, int]]) -> None:
        for request, tokens in scheduled:
            if request.in_prefill:
                request.computed += tokens
                if not request.in_prefill:
                    request.generated += 1  # the prompt's last token samples
            else:
                accepted = sum(self.rng.random() < 0.6 for _ in range(tokens - 1))
                request.computed += 1 + accepted
                request.generated += 1 + accepted
            self.table_computed[request.row] = min(request.computed, request.prompt_len)
        for request in list(self.running):
            finished = request.generated >= request.max_output
            aborted = request.in_prefill and self.rng.random() < 0.01
            if finished or aborted:
                # Freed rows keep their last counts: an aborted prefill stays
                # "in prefill" in the table until the row is reused.
                self.running.remove(request)
                self.owners.pop(request.row, None)
                self.free_rows.insert(0, request.row)


def generate_trace(seed: int, steps_per_width: int) -> list[TraceStep]:
    trace: list[TraceStep] = []
    for width in WIDTHS:
        rng = random.Random(seed * 1000 + width)
        scheduler = Scheduler(
            width=width,
            rng=rng,
            max_num_seqs=rng.choice((4, 8, 16, 32)),
            token_budget=rng.choice((64, 128, 256, 512, 2048, 8192)),
        )
        for step in range(steps_per_width):
            scheduler.arrive(burst=step % 200 < 40)
            scheduled = scheduler.schedule()
            if scheduled:
                trace.append(scheduler.snapshot(scheduled))
                scheduler.advance(scheduled)
    return trace


def classify(step: TraceStep) -> dict[str, bool]:
    scheduled = [row.scheduled for row in step.rows]
    num_reqs, num_tokens, max_len = len(scheduled), sum(scheduled), max(scheduled)
    computed = np.array([row.computed for row in step.rows], dtype=np.int32)
    prompt = np.array([row.prompt_len for row in step.rows], dtype=np.int32)
    scheduled_ids = {row.req_id for row in step.rows}

    def v1_pending() -> bool:
        return not rows_past_prefill(computed, prompt)

    def mrv2_pending() -> bool:
        rows = rows_in_prefill(step.table_computed, step.table_prefill)
        return any_row_scheduled(rows, step.owners, scheduled_ids)

    return {
        "genuine_decode": all(row.computed >= row.prompt_len for row in step.rows)
        and all(tokens == step.width for tokens in scheduled),
        "holds_prompt": any(row.computed < row.prompt_len for row in step.rows),
        "shape": uniform_query_len(num_reqs, num_tokens, max_len) == step.width,
        "phase_v1": is_uniform_decode(
            num_reqs, num_tokens, max_len, step.width, v1_pending
        ),
        "phase_mrv2": is_uniform_decode(
            num_reqs, num_tokens, max_len, step.width, mrv2_pending
        ),
    }


def share(numerator: int, denominator: int) -> float | None:
    return 100.0 * numerator / denominator if denominator else None


def tally(labels: list[dict[str, bool]]) -> dict[str, Any]:
    genuine = [label for label in labels if label["genuine_decode"]]
    prompt = [label for label in labels if label["holds_prompt"]]
    rules = ("shape", "phase_v1", "phase_mrv2")
    return {
        "steps": len(labels),
        "genuine_decode_steps": len(genuine),
        "prompt_steps": len(prompt),
        "shape_collisions": sum(label["shape"] for label in prompt),
        "decode_kept_pct": {
            rule: share(sum(label[rule] for label in genuine), len(genuine))
            for rule in rules
        },
        "prompt_as_decode_pct": {
            rule: share(sum(label[rule] for label in prompt), len(prompt))
            for rule in rules
        },
        "full_graph_steps_pct": {
            rule: share(sum(label[rule] for label in labels), len(labels))
            for rule in rules
        },
        "v1_mrv2_disagreements": sum(
            label["phase_v1"] != label["phase_mrv2"] for label in labels
        ),
    }


def run(seed: int = 0, steps_per_width: int = 1000) -> dict[str, Any]:
    trace = generate_trace(seed, steps_per_width)
    labels = [classify(step) for step in trace]
    by_width: dict[str, Any] = {}
    for width in WIDTHS:
        subset = [
            label
            for step, label in zip(trace, labels, strict=True)
            if step.width == width
        ]
        by_width[str(width)] = tally(subset)
    total = tally(labels)
    return {
        "seed": seed,
        "steps_per_width": steps_per_width,
        **total,
        "by_width": by_width,
        "goals_met": {
            "decode_kept_100pct": total["decode_kept_pct"]["phase_v1"] == 100.0
            and total["decode_kept_pct"]["phase_mrv2"] == 100.0,
            "prompt_as_decode_0pct": total["prompt_as_decode_pct"]["phase_v1"] == 0.0
            and total["prompt_as_decode_pct"]["phase_mrv2"] == 0.0,
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps({k: v for k, v in run().items() if k != "by_width"}, indent=1))
