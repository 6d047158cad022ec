"""Benchmark 4: FULL decode-graph coverage on a synthetic scheduler trace.

A small continuous-batching scheduler, seeded, runs for each decode query
width from 1 to 16 (``1 + K`` with K = 0..15 speculative tokens): requests
arrive in bursts with prompts of 1 to 3000 tokens (many of exactly 4 tokens,
and of exactly the decode width), prefills are chunked under a token budget,
and decodes schedule ``1 + drafts`` tokens, drafts 0..K (ngram proposes fewer
when it finds no match). Some requests are aborted mid-prefill, leaving freed
rows that keep their prefill counts.

Every step runs through the installed vLLM release's own dispatch with the
plugin registered, so what is scored is what the patches install:

- V1: the release's ``_determine_batch_execution_and_padding`` on a runner
  whose input batch holds the step's rows (the class tests' fakes,
  ``src/vllm_graphsafe/vllm_fakes/v1_runner.py``); the decision is what reaches the CUDA
  graph dispatcher.
- MRV2: the release's ``execute_model`` over request states filled and
  updated by the release's own code (``src/vllm_graphsafe/vllm_fakes/mrv2_state.py``) up
  to ``dispatch_cg_and_sync_dp``; the decision is the uniform token count it
  receives.

The shape rule beside them is vLLM's own (``_is_uniform_decode``,
``get_uniform_token_count``) on the step's shape. The ground truth comes from
the trace's own request states, computed here and nowhere else: a step holds
a prompt when a scheduled request had not computed its whole prompt before
the step; it is genuine uniform decode when none does and every scheduled
request schedules exactly the width.

    python bench/full_graph_coverage.py --out coverage.json [--steps-per-width N]

Run it with a vLLM venv's python (it registers the plugin in its own process).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.fix_tests import dispatch_fixes

if __package__ in (None, ""):  # run as a script: make bench and tests importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_graphsafe import vllm_layout

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
    prompt_len: int
    #: Tokens computed before this step.
    computed: int
    scheduled: int
    #: First scheduled this step.
    new: bool = False

    @property
    def in_prompt(self) -> bool:
        return self.computed < self.prompt_len


@dataclass(frozen=True)
class TraceStep:
    width: int
    rows: tuple[ScheduledRow, ...]
    #: Live requests this step leaves out (``scheduled`` 0).
    waiting_rows: tuple[ScheduledRow, ...]
    #: Rows freed mid-prefill and not reused yet: (prompt_len, computed).
    freed_rows: tuple[tuple[int, int], ...]


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

    def snapshot(
        self, scheduled: list[tuple[Request, int]], admitted: set[str]
    ) -> TraceStep:
        chosen = {request.req_id for request, _ in scheduled}
        freed = [
            (int(self.table_prefill[row]), int(self.table_computed[row]))
            for row in range(TABLE_ROWS)
            if row not in self.owners
            and self.table_computed[row] < self.table_prefill[row]
        ]
        return TraceStep(
            width=self.width,
            rows=tuple(
                ScheduledRow(
                    r.req_id, r.prompt_len, r.computed, tokens, r.req_id in admitted
                )
                for r, tokens in scheduled
            ),
            waiting_rows=tuple(
                ScheduledRow(r.req_id, r.prompt_len, r.computed, 0)
                for r in self.running
                if r.req_id not in chosen
            ),
            freed_rows=tuple(freed),
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
        seen: set[str] = set()
        for step in range(steps_per_width):
            scheduler.arrive(burst=step % 200 < 40)
            scheduled = scheduler.schedule()
            admitted = {r.req_id for r, _ in scheduled if r.req_id not in seen}
            seen.update(admitted)
            if scheduled:
                trace.append(scheduler.snapshot(scheduled, admitted))
                scheduler.advance(scheduled)
    return trace


# -- ground truth: the trace's own request states -------------------------------


def truth(step: TraceStep) -> dict[str, bool]:
    holds_prompt = any(row.in_prompt for row in step.rows)
    return {
        "holds_prompt": holds_prompt,
        "genuine_decode": not holds_prompt
        and all(row.scheduled == step.width for row in step.rows),
    }


def shape(step: TraceStep) -> tuple[int, int, int]:
    """(num_reqs, num_tokens, max_query_len) of the step."""
    scheduled = [row.scheduled for row in step.rows]
    return len(scheduled), sum(scheduled), max(scheduled)


# -- the installed release's dispatch ---------------------------------------------

#: Decides whether a step runs as uniform decode (the FULL decode graph).
Rule = Callable[[TraceStep], bool]


def v1_rules() -> dict[str, Rule]:
    """vLLM's shape rule, and the V1 dispatch as the plugin left it."""
    from tests.support.vllm_fakes.v1_runner import (
        DispatchRecord,
        Row,
        decode_draft_buffer,
        input_batch,
        make_runner,
        run_dispatch,
    )

    GPUModelRunner = vllm_layout.load(vllm_layout.V1_RUNNER).GPUModelRunner

    # On the class, vLLM's static rule, whatever the plugin installed over it.
    shape_rule = GPUModelRunner._is_uniform_decode

    def vllm_shape_rule(step: TraceStep) -> bool:
        num_reqs, num_tokens, max_query_len = shape(step)
        return bool(
            shape_rule(
                max_num_scheduled_tokens=max_query_len,
                uniform_decode_query_len=step.width,
                num_tokens=num_tokens,
                num_reqs=num_reqs,
                force_uniform_decode=None,
            )
        )

    def installed_dispatch(step: TraceStep) -> bool:
        # A request past its prompt schedules its token and the drafts listed
        # for it; a prompt chunk lists none.
        rows = [
            Row(
                r.prompt_len,
                r.computed,
                r.scheduled,
                r.scheduled - 1 if r.computed >= r.prompt_len else None,
            )
            for r in step.rows
        ]
        freed = [Row(prompt, computed, 0) for prompt, computed in step.freed_rows]
        record = DispatchRecord()
        runner = make_runner(
            step.width,
            input_batch(rows, freed),
            record,
            draft_counts=decode_draft_buffer(rows, freed),
        )
        run_dispatch(runner, [row.scheduled for row in rows])
        (decided,) = record.uniform_decode
        return decided

    return {"shape": vllm_shape_rule, "phase": installed_dispatch}


@contextlib.contextmanager
def mrv2_rules() -> Iterator[dict[str, Rule]]:
    """vLLM's shape count, and MRV2's ``execute_model`` as the plugin left it."""
    from tests.support.vllm_fakes import mrv2_state
    from tests.support.vllm_fakes.mrv2_state import DispatchRecorder, Req, make_step

    cudagraph_utils = vllm_layout.load(vllm_layout.MRV2_CUDAGRAPH_UTILS)

    module: Any = importlib.import_module(mrv2_state.RUNNER_MODULE)
    original = module.dispatch_cg_and_sync_dp
    recorder = DispatchRecorder(original)
    shape_count = cudagraph_utils.get_uniform_token_count

    def vllm_shape_count(step: TraceStep) -> bool:
        return bool(shape_count(*shape(step)) == step.width)

    def installed_execute_model(step: TraceStep) -> bool:
        reqs = {
            row.req_id: Req(
                prefill_len=row.prompt_len,
                computed=row.computed,
                scheduled=row.scheduled,
                drafts=0 if row.in_prompt else row.scheduled - 1,
                new=row.new,
            )
            for row in (*step.rows, *step.waiting_rows)
        }
        freed = {
            f"freed-{index}": Req(prefill_len=prompt, computed=computed, scheduled=0)
            for index, (prompt, computed) in enumerate(step.freed_rows)
        }
        made = make_step({**freed, **reqs}, step.width)
        for req_id in freed:
            made.runner.req_states.remove_request(req_id)
        recorder.calls.clear()
        with contextlib.suppress(mrv2_state.ReachedDispatch):
            made.runner.execute_model(made.scheduler_output, dummy_run=False)
        (count,) = recorder.counts
        return bool(count == step.width)

    module.dispatch_cg_and_sync_dp = recorder
    try:
        yield {"shape": vllm_shape_count, "phase": installed_execute_model}
    finally:
        module.dispatch_cg_and_sync_dp = original


# -- scoring ----------------------------------------------------------------------


def share(numerator: int, denominator: int) -> float | None:
    return 100.0 * numerator / denominator if denominator else None


def tally(labels: list[dict[str, bool]], rules: tuple[str, ...]) -> dict[str, Any]:
    genuine = [label for label in labels if label["genuine_decode"]]
    prompt = [label for label in labels if label["holds_prompt"]]
    return {
        "steps": len(labels),
        "genuine_decode_steps": len(genuine),
        "prompt_steps": len(prompt),
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
    }


def score(
    trace: list[TraceStep], runners: dict[str, dict[str, Rule]]
) -> dict[str, Any]:
    names = tuple(
        f"{runner}.{rule}" for runner, rules in runners.items() for rule in rules
    )
    labels: list[dict[str, bool]] = []
    widths: list[int] = []
    for step in trace:
        label = truth(step)
        for runner, rules in runners.items():
            for rule, decide in rules.items():
                label[f"{runner}.{rule}"] = decide(step)
        labels.append(label)
        widths.append(step.width)
    return {
        **tally(labels, names),
        "shape_collisions": sum(
            label["holds_prompt"]
            and any(label[name] for name in names if name.endswith(".shape"))
            for label in labels
        ),
        "by_width": {
            str(width): tally(
                [lb for lb, w in zip(labels, widths, strict=True) if w == width], names
            )
            for width in WIDTHS
        },
    }


def patch_states() -> dict[str, str]:
    """Register the plugin as vLLM does; each patch's state."""
    from vllm_graphsafe.plugin import register, registry

    register()
    for module in vllm_layout.RUNNERS.values():
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    return {key: str(value) for key, value in registry().states().items()}


def run(seed: int = 0, steps_per_width: int = 1000) -> dict[str, Any]:
    states = patch_states()
    trace = generate_trace(seed, steps_per_width)
    skipped = {
        runner: f"{patch} is {states.get(patch, 'absent')} here, not applied"
        for runner, patch in dispatch_fixes().items()
        if states.get(patch) != "applied"
    }
    with contextlib.ExitStack() as stack:
        runners: dict[str, dict[str, Rule]] = {}
        if "v1" not in skipped:
            runners["v1"] = v1_rules()
        if "mrv2" not in skipped:
            runners["mrv2"] = stack.enter_context(mrv2_rules())
        scored = score(trace, runners)
    return {
        "seed": seed,
        "steps_per_width": steps_per_width,
        "vllm": _vllm_version(),
        "patch_states": states,
        "skipped": skipped,
        **scored,
    }


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--steps-per-width", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run(args.seed, args.steps_per_width)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
