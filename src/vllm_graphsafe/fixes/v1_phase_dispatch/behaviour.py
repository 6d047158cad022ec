"""Is the V1 dispatch fixed? Run the runner's dispatch on the bug's cases.

Does ``_determine_batch_execution_and_padding`` hand the step the FULL decode
graph (under data parallelism: offer it at the cross-rank sync)? The fake
runner holds the step in every form vLLM and its forks read a row's phase from.
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
from vllm_graphsafe.judging import imported_class
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
    found: list[Case[Step]] = []
    for k in SPECULATIVE_WIDTHS:
        q = k + 1
        fresh, decode = fresh_row(k), decode_row(k)
        kept_off = {
            f"a fresh {q}-token prompt": Step(k, (fresh,)),
            f"two fresh {q}-token prompts together": Step(k, (fresh, fresh)),
            f"a {q}-token prompt beside a decode": Step(k, (decode, fresh)),
        }
        if k:
            # Without speculation one prompt token over prior state is a
            # decode to the builders: only a prompt's first chunk is a hazard.
            kept_off.update((name, Step(k, (row,))) for name, row in chunk_rows(k))
            kept_off[f"{q} output tokens recomputed after preemption"] = Step(
                k, (Row(10, 30, q),)
            )
            kept_off[f"a fresh {q}-token prompt right after a drafting step"] = Step(
                k, (fresh,), after_drafting_step=True
            )
        kept_off[f"a {q}-token prompt on a data-parallel rank whose peer decodes"] = (
            Step(k, (fresh,), dp_size=2)
        )
        kept_on = {
            "a pure decode batch of 3 rows": Step(
                k, (decode, decode_row(k, 1), decode_row(k, 2))
            ),
            "a decode with a prompt's row left past the batch": Step(
                k, (decode,), stale=(fresh,)
            ),
            "a decode on a data-parallel rank": Step(k, (decode,), dp_size=2),
        }
        for expect, steps in ((Expect.KEPT_OFF, kept_off), (Expect.KEPT_ON, kept_on)):
            found += [
                Case(f"{name} (K={k})", expect, step) for name, step in steps.items()
            ]
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
    if step.k:
        counts[:num_reqs] = [_draft_count(row) for row in step.rows]
    schedules_drafts = any(row.drafts for row in step.rows)
    if step.after_drafting_step and counts_only_when_drafting and not schedules_drafts:
        counts[:num_reqs] = step.k
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


def _unsupplied(name: str) -> Any:
    raise CannotRun(f"{DISPATCH} takes {name}, which no case supplies")


class Target(NamedTuple):
    make_runner: Callable[[dict[str, Any]], Any]
    modes: Any
    descriptor_type: Any
    #: The release's ``_prepare_inputs`` leaves the draft counts as they were
    #: on a step that schedules no drafts (0.20-0.31).
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
        scheduled = np.array([row.scheduled for row in step.rows], dtype=np.int32)
        supplied = {
            "num_tokens": int(scheduled.sum()),
            "num_reqs": len(step.rows),
            "num_scheduled_tokens_np": scheduled,
            "max_num_scheduled_tokens": int(scheduled.max()),
            "use_cascade_attn": False,
            "scheduler_output": _scheduler_output(step),
        }
        arguments = keyword_arguments(dispatch, supplied, _unsupplied)
        try:
            result = dispatch(**arguments)
        except ReachedSync as sync:
            full = _offered_full(sync.offered, self.modes)
        else:
            mode = result[0] if isinstance(result, tuple) and result else result
            name = mode_name(mode)
            if name is None:
                if not dispatcher.calls:
                    raise CannotRun(f"{DISPATCH} returned no graph mode")
                name = dispatcher.calls[-1]
            full = name == "FULL"
        said = (
            "got the FULL decode graph" if full else "ran without the FULL decode graph"
        )
        return graph_outcome(case, full, said)


def _offered_full(offered: dict[str, Any], modes: Any) -> bool:
    if "cudagraph_mode" in offered:
        mode = offered["cudagraph_mode"]
        full = member(modes, "FULL")
        return mode == full.value or mode_name(mode) == "FULL"
    return bool(offered.get("uniform_decode"))


def judge_source(sources: SourceReader) -> Evidence:
    target = Target(
        *compiled_runner(sources, V1_RUNNER, V1_RUNNER_CLASS),
        draft_counts_only_on_drafting_steps(sources),
    )
    return judge_cases(cases(), target.run)


def judge_live() -> Evidence | None:
    runner_class = imported_class(V1_RUNNER, V1_RUNNER_CLASS)
    if runner_class is None:
        return None
    target = Target(
        *live_runner(runner_class, OVERRIDES),
        draft_counts_only_on_drafting_steps(SourceReader()),
    )
    return judge_cases(cases(), target.run)
