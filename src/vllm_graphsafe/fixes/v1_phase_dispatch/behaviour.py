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

from vllm_graphsafe.behaviour.compiled import parameters_of, shared_code
from vllm_graphsafe.behaviour.fakes import (
    OVERRIDES,
    Fake,
    GraphDispatcher,
    ReachedSync,
    member,
    mode_name,
)
from vllm_graphsafe.behaviour.judgement import (
    CannotRun,
    Case,
    Evidence,
    Expect,
    Outcome,
    judge_cases,
)
from vllm_graphsafe.behaviour.live import live_instance
from vllm_graphsafe.fixes.v1_phase_dispatch.drafting import (
    draft_counts_only_on_drafting_steps,
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_RUNNER, V1_RUNNER_CLASS

DISPATCH = "_determine_batch_execution_and_padding"
#: The cross-rank sync the dispatch calls under data parallelism.
SPECULATIVE_WIDTHS = (0, 1, 2, 5)
MAX_ROWS = 16
#: Values of the dispatch's parameters a case supplies, by name.
_SUPPLIED = (
    "num_tokens",
    "num_reqs",
    "num_scheduled_tokens_np",
    "max_num_scheduled_tokens",
    "use_cascade_attn",
    "scheduler_output",
)


class Row(NamedTuple):
    """One request of the step: its prompt, what it computed before the step,
    what the step schedules for it (drafts included) and how many drafts."""

    prompt: int
    computed: int
    scheduled: int
    drafts: int = 0
    #: First scheduled this step (the scheduler output's new requests).
    new: bool = False

    @property
    def draft_count(self) -> int:
        """The builders' count for the row (``num_decode_draft_tokens``): its
        drafts where it schedules exactly 1 + drafts, 0 for a one-token decode
        past its prompt, -1 (not a decode) otherwise."""
        if self.drafts and self.scheduled == self.drafts + 1:
            return self.drafts
        if self.scheduled == 1 and self.computed >= self.prompt:
            return 0
        return -1


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


def _decode(k: int, offset: int = 0) -> Row:
    return Row(prompt=12 + offset, computed=40 + offset, scheduled=k + 1, drafts=k)


def _fresh(k: int) -> Row:
    return Row(prompt=k + 1, computed=0, scheduled=k + 1, new=True)


def cases() -> list[Case[Step]]:
    """The hazard and its neighbours, for K = 0, 1, 2 and 5."""
    found: list[Case[Step]] = []
    off, on = Expect.KEPT_OFF, Expect.KEPT_ON
    for k in SPECULATIVE_WIDTHS:
        q = k + 1
        width = f"K={k}"
        found += [
            Case(f"a fresh {q}-token prompt ({width})", off, Step(k, (_fresh(k),))),
            Case(
                f"two fresh {q}-token prompts together ({width})",
                off,
                Step(k, (_fresh(k), _fresh(k))),
            ),
            Case(
                f"a {q}-token prompt beside a decode ({width})",
                off,
                Step(k, (_decode(k), _fresh(k))),
            ),
        ]
        if k:
            # Without speculation one prompt token over prior state is a
            # decode to the builders: only a prompt's first chunk is a hazard.
            found += [
                Case(
                    f"the {q}-token tail of a chunked {256 + q}-token prompt ({width})",
                    off,
                    Step(k, (Row(256 + q, 256, q),)),
                ),
                Case(
                    f"a {16 + q}-token prompt after a 16-token prefix-cache hit "
                    f"({width})",
                    off,
                    Step(k, (Row(16 + q, 16, q, new=True),)),
                ),
                Case(
                    f"{q} output tokens recomputed after preemption ({width})",
                    off,
                    Step(k, (Row(10, 30, q),)),
                ),
                Case(
                    f"a fresh {q}-token prompt right after a drafting step ({width})",
                    off,
                    Step(k, (_fresh(k),), after_drafting_step=True),
                ),
            ]
        found += [
            Case(
                f"a {q}-token prompt on a data-parallel rank whose peer decodes "
                f"({width})",
                off,
                Step(k, (_fresh(k),), dp_size=2),
            ),
            Case(
                f"a pure decode batch of 3 rows ({width})",
                on,
                Step(k, (_decode(k), _decode(k, 1), _decode(k, 2))),
            ),
            Case(
                f"a decode with a prompt's row left past the batch ({width})",
                on,
                Step(k, (_decode(k),), stale=(_fresh(k),)),
            ),
            Case(
                f"a decode on a data-parallel rank ({width})",
                on,
                Step(k, (_decode(k),), dp_size=2),
            ),
        ]
    return found


# -- the runner, as vLLM holds the step when it dispatches ----------------------


def _req_id(index: int) -> str:
    return f"req-{index}"


def runner_state(
    step: Step, dispatcher: GraphDispatcher, counts_only_when_drafting: bool = False
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
        counts[index] = row.draft_count if step.k else -1
    schedules_drafts = any(row.drafts for row in step.rows)
    if step.after_drafting_step and counts_only_when_drafting and not schedules_drafts:
        counts[: len(step.rows)] = step.k
    req_ids = [_req_id(i) for i in range(len(rows))]
    requests = {
        _req_id(i): Fake(
            "CachedRequestState",
            req_id=_req_id(i),
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


def scheduler_output(step: Step) -> Fake:
    """The step's ``SchedulerOutput``, for a dispatch that reads it."""
    scheduled = {_req_id(i): row.scheduled for i, row in enumerate(step.rows)}
    new = [
        Fake(
            "NewRequestData",
            req_id=_req_id(i),
            prompt_token_ids=list(range(row.prompt)),
            num_computed_tokens=row.computed,
        )
        for i, row in enumerate(step.rows)
        if row.new
    ]
    cached = [(_req_id(i), row) for i, row in enumerate(step.rows) if not row.new]
    return Fake(
        "SchedulerOutput",
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={
            _req_id(i): [0] * row.drafts
            for i, row in enumerate(step.rows)
            if row.drafts
        },
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
        "scheduler_output": scheduler_output(step),
    }
    try:
        parameters = list(parameters_of(dispatch))
    except (TypeError, ValueError) as error:
        raise CannotRun(f"its signature cannot be read ({error})") from error
    arguments: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in values:
            arguments[parameter.name] = values[parameter.name]
        elif parameter.default is parameter.empty:
            raise CannotRun(
                f"{DISPATCH} takes {parameter.name}, which no case supplies"
            )
    return arguments


class Target:
    """One way of building the runner: compiled from source, or the live class."""

    def __init__(
        self,
        make_runner: Callable[[dict[str, Any]], Any],
        modes: Any,
        descriptor_type: Any,
        counts_only_when_drafting: bool,
    ) -> None:
        self.make_runner = make_runner
        self.modes = modes
        self.descriptor_type = descriptor_type
        self.counts_only_when_drafting = counts_only_when_drafting

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
            name = dispatcher.calls[-1].mode
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
    right = (not full) if case.expect is Expect.KEPT_OFF else full
    return Outcome(right, said)


def judge_source(sources: SourceReader) -> Evidence:
    """The cases on the runner compiled from ``sources`` (never imported)."""
    code = shared_code(sources)
    target = Target(
        lambda state: code.instance(V1_RUNNER, V1_RUNNER_CLASS, state),
        code.name_or_none(V1_RUNNER, "CUDAGraphMode"),
        code.name_or_none(V1_RUNNER, "BatchDescriptor"),
        counts_only_when_drafting(sources),
    )
    return judge_cases(cases(), target.run)


def judge_live(runner_class: type, installed: SourceReader) -> Evidence:
    """The cases on the installed runner class's own methods."""
    module_globals = vars(__import__(runner_class.__module__, fromlist=["_"]))
    target = Target(
        lambda state: live_instance(runner_class, state, OVERRIDES),
        module_globals.get("CUDAGraphMode"),
        module_globals.get("BatchDescriptor"),
        counts_only_when_drafting(installed),
    )
    return judge_cases(cases(), target.run)


def counts_only_when_drafting(sources: SourceReader) -> bool:
    """0.20-0.31: ``_prepare_inputs`` counts the rows' drafts only on a step
    that schedules some (see the hooks' own question)."""
    return draft_counts_only_on_drafting_steps(sources)
