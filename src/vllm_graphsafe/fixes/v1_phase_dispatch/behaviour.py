"""Is the V1 dispatch fixed? Run the runner's dispatch on the bug's cases.

The question asked of the target is the one a GPU acts on: given this step,
does ``GPUModelRunner._determine_batch_execution_and_padding`` (with whatever
it consults: ``_is_uniform_decode``, helpers, the dispatcher) hand back the
FULL decode graph? The dispatcher is vLLM's, modelled with FULL_AND_PIECEWISE
graphs captured (:class:`~vllm_graphsafe.behaviour.fakes.GraphDispatcher`);
with data parallelism the step stops at the cross-rank sync, and what this rank
offers there is its answer (every rank then agrees on the least of them).

The runner is a fake holding the step as vLLM's runner holds it when it
dispatches: the input batch's computed and prompt lengths (before the step),
each row's scheduled drafts, the builders' draft counts
(``num_decode_draft_tokens``, as ``_prepare_inputs`` writes them), the request
table and the step's scheduler output, so that a fix reading any of the ways
vLLM's own code and its forks read a row's phase finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from vllm_graphsafe.behaviour.compiled import compiled_runner, keyword_arguments
from vllm_graphsafe.behaviour.fakes import (
    OVERRIDES,
    Fake,
    GraphDispatcher,
    ReachedSync,
    Row,
    chunk_rows,
    decode_row,
    fresh_row,
    member,
    mode_name,
    req_id,
    scheduler_output,
)
from vllm_graphsafe.behaviour.judgement import (
    CannotRun,
    Case,
    Evidence,
    Expect,
    Outcome,
    graph_outcome,
    judge_cases,
)
from vllm_graphsafe.behaviour.live import live_runner
from vllm_graphsafe.fixes.v1_phase_dispatch.drafting import (
    draft_counts_only_on_drafting_steps,
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_RUNNER, V1_RUNNER_CLASS

DISPATCH = "_determine_batch_execution_and_padding"
SPECULATIVE_WIDTHS = (0, 1, 2, 5)
MAX_ROWS = 16


class Step(NamedTuple):
    k: int
    rows: tuple[Row, ...]
    #: Rows the persistent batch still holds past ``num_reqs``.
    stale: tuple[Row, ...] = ()
    dp_size: int = 1
    #: The step before decoded every row with K drafts: on releases whose
    #: ``_prepare_inputs`` counts drafts only on a step that schedules some,
    #: the builders' column still holds that step's counts.
    after_drafting_step: bool = False


def cases() -> list[Case[Step]]:
    """The hazard and its neighbours, for K = 0, 1, 2 and 5."""
    found: list[Case[Step]] = []
    off, on = Expect.KEPT_OFF, Expect.KEPT_ON
    for k in SPECULATIVE_WIDTHS:
        q = k + 1
        fresh, decode = fresh_row(k), decode_row(k)
        named = [
            (f"a fresh {q}-token prompt", off, Step(k, (fresh,))),
            (f"two fresh {q}-token prompts together", off, Step(k, (fresh, fresh))),
            (f"a {q}-token prompt beside a decode", off, Step(k, (decode, fresh))),
        ]
        if k:
            # Without speculation one prompt token over prior state is a
            # decode to the builders: only a prompt's first chunk is a hazard.
            named += [(name, off, Step(k, (row,))) for name, row in chunk_rows(k)]
            named += [
                (
                    f"{q} output tokens recomputed after preemption",
                    off,
                    Step(k, (Row(10, 30, q),)),
                ),
                (
                    f"a fresh {q}-token prompt right after a drafting step",
                    off,
                    Step(k, (fresh,), after_drafting_step=True),
                ),
            ]
        named += [
            (
                f"a {q}-token prompt on a data-parallel rank whose peer decodes",
                off,
                Step(k, (fresh,), dp_size=2),
            ),
            (
                "a pure decode batch of 3 rows",
                on,
                Step(k, (decode, decode_row(k, 1), decode_row(k, 2))),
            ),
            (
                "a decode with a prompt's row left past the batch",
                on,
                Step(k, (decode,), stale=(fresh,)),
            ),
            ("a decode on a data-parallel rank", on, Step(k, (decode,), dp_size=2)),
        ]
        found += [Case(f"{name} (K={k})", expect, step) for name, expect, step in named]
    return found


def _draft_count(row: Row) -> int:
    """The builders' count for the row (``num_decode_draft_tokens``): its
    drafts where it schedules exactly 1 + drafts, 0 for a one-token decode
    past its prompt, -1 (not a decode) otherwise."""
    if row.drafts and row.scheduled == row.drafts + 1:
        return row.drafts
    if row.scheduled == 1 and row.computed >= row.prompt:
        return 0
    return -1


def runner_state(
    step: Step, dispatcher: GraphDispatcher, counts_only_when_drafting: bool
) -> dict[str, Any]:
    """The fake runner's attributes for ``step``; ``counts_only_when_drafting``:
    the release's ``_prepare_inputs`` leaves the draft counts as they were on a
    step that schedules no drafts."""
    rows = [*step.rows, *step.stale]
    num_reqs = len(step.rows)
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prompt = np.zeros(MAX_ROWS, dtype=np.int32)
    counts = np.full(MAX_ROWS, -1, dtype=np.int32)
    drafts: list[list[int]] = [[] for _ in range(MAX_ROWS)]
    for index, row in enumerate(rows):
        computed[index] = row.computed
        prompt[index] = row.prompt
        drafts[index] = [0] * row.drafts
    for index, row in enumerate(step.rows):
        counts[index] = _draft_count(row) if step.k else -1
    schedules_drafts = any(row.drafts for row in step.rows)
    if step.after_drafting_step and counts_only_when_drafting and not schedules_drafts:
        counts[: len(step.rows)] = step.k
    req_ids = [req_id(i) for i in range(len(rows))]
    requests = {
        req_id(i): Fake(
            "CachedRequestState",
            req_id=req_id(i),
            num_prompt_tokens=row.prompt,
            num_computed_tokens=row.computed,
            prompt_token_ids=list(range(row.prompt)),
            num_tokens=max(row.prompt, row.computed) + row.drafts,
        )
        for i, row in enumerate(rows)
    }
    batch = Fake(
        "InputBatch",
        num_reqs=num_reqs,
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        num_computed_tokens_cpu=computed,
        num_prompt_tokens=prompt,
        num_tokens_no_spec=np.maximum(computed, prompt),
        spec_token_ids=drafts,
        lora_id_to_lora_request={},
    )
    parallel = Fake(
        "ParallelConfig",
        data_parallel_size=step.dp_size,
        data_parallel_rank=0,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
    )
    compilation = Fake(
        "CompilationConfig", pass_config=Fake("PassConfig", enable_sp=False)
    )
    speculative = (
        Fake("SpeculativeConfig", num_speculative_tokens=step.k) if step.k else None
    )
    return {
        "uniform_decode_query_len": step.k + 1,
        "input_batch": batch,
        "requests": requests,
        "num_decode_draft_tokens": Fake("CpuGpuBuffer", np=counts, cpu=counts),
        "cudagraph_dispatcher": dispatcher,
        "model_config": Fake("ModelConfig", is_encoder_decoder=False),
        "parallel_config": parallel,
        "compilation_config": compilation,
        "speculative_config": speculative,
        "num_spec_tokens": step.k,
        "vllm_config": Fake(
            "VllmConfig",
            parallel_config=parallel,
            compilation_config=compilation,
            speculative_config=speculative,
            observability_config=Fake("ObservabilityConfig", cudagraph_metrics=False),
        ),
    }


def _scheduler_output(step: Step) -> Fake:
    new = [
        Fake(
            "NewRequestData",
            req_id=req_id(i),
            prompt_token_ids=list(range(row.prompt)),
            num_computed_tokens=row.computed,
        )
        for i, row in enumerate(step.rows)
        if row.new
    ]
    cached = [(req_id(i), row) for i, row in enumerate(step.rows) if not row.new]
    return scheduler_output(
        step.rows,
        scheduled_new_reqs=new,
        scheduled_cached_reqs=Fake(
            "CachedRequestData",
            req_ids=[rid for rid, _ in cached],
            num_computed_tokens=[row.computed for _, row in cached],
            resumed_req_ids=set(),
        ),
    )


def dispatch_arguments(dispatch: Callable[..., Any], step: Step) -> dict[str, Any]:
    """The dispatch's arguments for ``step``, by name; ``CannotRun`` for a
    parameter without a default that no case can supply."""
    scheduled = np.array([row.scheduled for row in step.rows], dtype=np.int32)
    values: dict[str, Any] = {
        "num_tokens": int(scheduled.sum()),
        "num_reqs": len(step.rows),
        "num_scheduled_tokens_np": scheduled,
        "max_num_scheduled_tokens": int(scheduled.max()),
        "use_cascade_attn": False,
        "scheduler_output": _scheduler_output(step),
    }

    def unsupplied(name: str) -> Any:
        raise CannotRun(f"{DISPATCH} takes {name}, which no case supplies")

    return keyword_arguments(dispatch, values, unsupplied)


class Target(NamedTuple):
    """One way of building the runner: compiled from source, or the live class."""

    make_runner: Callable[[dict[str, Any]], Any]
    modes: Any
    descriptor_type: Any
    #: 0.20-0.31 (see :func:`runner_state`).
    counts_only_when_drafting: bool

    def run(self, case: Case[Step]) -> Outcome:
        step = case.step
        dispatcher = GraphDispatcher(self.modes, self.descriptor_type)
        runner = self.make_runner(
            runner_state(step, dispatcher, self.counts_only_when_drafting)
        )
        dispatch = getattr(runner, DISPATCH, None)
        if not callable(dispatch):
            raise CannotRun(f"the runner has no {DISPATCH}")
        arguments = dispatch_arguments(dispatch, step)
        try:
            result = dispatch(**arguments)
        except ReachedSync as sync:
            return _judged(case, _offered_full(sync.offered, self.modes))
        mode = result[0] if isinstance(result, tuple) and result else result
        name = mode_name(mode)
        if name is None:
            if not dispatcher.calls:
                raise CannotRun(f"{DISPATCH} returned no graph mode")
            name = dispatcher.calls[-1]
        return _judged(case, name == "FULL")


def _offered_full(offered: dict[str, Any], modes: Any) -> bool:
    """Whether a rank offers the FULL decode graph at the data-parallel sync."""
    if "cudagraph_mode" in offered:
        mode = offered["cudagraph_mode"]
        full = member(modes, "FULL")
        return mode == full.value or mode_name(mode) == "FULL"
    return bool(offered.get("uniform_decode"))


def _judged(case: Case[Step], full: bool) -> Outcome:
    said = "got the FULL decode graph" if full else "ran without the FULL decode graph"
    return graph_outcome(case, full, said)


def judge_source(sources: SourceReader) -> Evidence:
    target = Target(
        *compiled_runner(sources, V1_RUNNER, V1_RUNNER_CLASS),
        draft_counts_only_on_drafting_steps(sources),
    )
    return judge_cases(cases(), target.run)


def judge_live(runner_class: type, installed: SourceReader) -> Evidence:
    target = Target(
        *live_runner(runner_class, OVERRIDES),
        draft_counts_only_on_drafting_steps(installed),
    )
    return judge_cases(cases(), target.run)
