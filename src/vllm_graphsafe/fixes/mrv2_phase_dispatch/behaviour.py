"""Is Model Runner V2's dispatch fixed? Run its steps on the bug's cases.

The target's ``execute_model`` and each speculator's draft-prefill ``propose``
run to their CUDA-graph manager's dispatch, which records what the step asks
and stops it. Every decode graph counts as captured: FULL for a uniform batch
of ``decode_query_len`` tokens a request, FULL varlen (0.32 on) for a batch
whose query-length bound is at most that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from vllm_graphsafe import recognition
from vllm_graphsafe.behaviour.compiled import SourceCode, keyword_arguments, shared_code
from vllm_graphsafe.behaviour.fakes import (
    Fake,
    Row,
    chunk_rows,
    decode_row,
    fresh_row,
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
from vllm_graphsafe.behaviour.live import live_instance
from vllm_graphsafe.behaviour.stand_in import StandIn
from vllm_graphsafe.judging import imported_class
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import (
    MRV2_INPUT_BATCH,
    MRV2_RUNNER,
    MRV2_RUNNER_CLASS,
    MRV2_SPECULATORS,
)

TARGET_STEP = "execute_model"
DRAFT_STEP = "propose"
#: What the step's state update does before the dispatch; the fake's request
#: states are already as it leaves them.
STATE_UPDATES = (
    "update_pp_decode_requests",
    "finish_requests",
    "free_states",
    "add_requests",
    "update_requests",
)
TARGET_WIDTHS = (0, 1, 2, 5)
DRAFT_WIDTHS = (1, 2, 5)
MAX_REQS = 32
#: Columns of the target's input batch that say a row's phase; the draft's
#: fake batch carries those the tree's ``InputBatch`` declares.
_PHASE_FIELDS = (
    "is_prefilling_np",
    "has_prefill",
    "decode_graph_eligible",
    "prefill_len_np",
    "num_computed_prefill_tokens_np",
    "num_computed_tokens_np",
    "prefill_runs_as_decode_np",
    "max_query_len",
)


class Step(NamedTuple):
    k: int
    reqs: tuple[Row, ...]
    dp_size: int = 1
    #: Requests in prefill that the step does not schedule.
    unscheduled: tuple[Row, ...] = ()


class ReachedDispatch(Exception):
    def __init__(self, uniform_token_count: Any, max_query_len: Any) -> None:
        super().__init__("reached the CUDA-graph dispatch")
        self.uniform_token_count = uniform_token_count
        self.max_query_len = max_query_len


def _dispatch(
    num_reqs: Any = None,
    num_tokens: Any = None,
    uniform_token_count: Any = None,
    num_active_loras: Any = 0,
    max_query_len: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    raise ReachedDispatch(uniform_token_count, max_query_len)


def graph_manager() -> Fake:
    """vLLM's ``CudaGraphManager``, whose dispatch stops the step."""
    return Fake("CudaGraphManager", dispatch=_dispatch)


def _phase_cases(k: int, *, data_parallel: bool) -> list[Case[Step]]:
    q = k + 1
    fresh, decode = fresh_row(k), decode_row(k)
    off, on = Expect.KEPT_OFF, Expect.KEPT_ON
    named = [
        (f"a fresh {q}-token prompt", off, Step(k, (fresh,))),
        (f"a {q}-token prompt beside a decode", off, Step(k, (decode, fresh))),
    ]
    if k:
        named += [(name, off, Step(k, (row,))) for name, row in chunk_rows(k)]
    decodes = (decode, decode_row(k, 1), decode_row(k, 2))
    beside_waiting = Step(k, (decode,), unscheduled=(Row(300, 64, 0),))
    named += [
        ("a pure decode batch of 3 rows", on, Step(k, decodes)),
        ("a decode beside an unscheduled prompt", on, beside_waiting),
    ]
    if data_parallel:
        prompt_on_rank = f"a {q}-token prompt on a data-parallel rank"
        named += [
            (prompt_on_rank, off, Step(k, (fresh,), dp_size=2)),
            ("a decode on a data-parallel rank", on, Step(k, (decode,), dp_size=2)),
        ]
    return [Case(f"{name} (K={k})", expect, step) for name, expect, step in named]


def _state_index(index: int) -> int:
    # Request states sit in non-contiguous slots, as after other requests left.
    return 3 + 2 * index


def request_states(step: Step) -> Fake:
    prefill_len = np.zeros(MAX_REQS, dtype=np.int32)
    computed_prefill = np.zeros(MAX_REQS, dtype=np.int32)
    computed = np.zeros(MAX_REQS, dtype=np.int32)
    ids: dict[str, int] = {}
    everyone = [*step.reqs, *step.unscheduled]
    for i, req in enumerate(everyone):
        slot = _state_index(i)
        ids[req_id(i)] = slot
        prefill_len[slot] = req.prompt
        computed_prefill[slot] = min(req.computed, req.prompt)
        computed[slot] = req.computed
    return Fake(
        "RequestState",
        req_id_to_index=ids,
        index_to_req_id={slot: rid for rid, slot in ids.items()},
        prefill_len=Fake("UvaBuffer", np=prefill_len),
        prompt_len=Fake("UvaBuffer", np=prefill_len.copy()),
        num_computed_prefill_tokens=computed_prefill,
        num_computed_tokens=Fake("StagedWrites", np=computed),
        num_computed_tokens_np=computed,
        max_seq_len=computed + 64,
        num_speculative_steps=step.k,
    )


def runner_state(step: Step) -> dict[str, Any]:
    return {
        "decode_query_len": step.k + 1,
        "num_speculative_steps": step.k,
        "req_states": request_states(step),
        "cudagraph_manager": graph_manager(),
        "dp_size": step.dp_size,
        "dp_rank": 0,
        "use_pp": False,
        "pcp_manager": None,
        "adaptive_verification": None,
        "lora_config": None,
        "is_encoder_decoder": False,
        "ubatch_runner": None,
        "aux_output_connector": None,
        "speculator": None,
        "parallel_config": Fake(
            "ParallelConfig",
            data_parallel_size=step.dp_size,
            data_parallel_rank=0,
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
        ),
        "observability_config": Fake("ObservabilityConfig", cudagraph_metrics=False),
        **dict.fromkeys(STATE_UPDATES, lambda *args, **kwargs: None),
    }


def draft_batch(step: Step, declared: Iterable[str]) -> Fake:
    reqs = step.reqs
    scheduled = np.array([r.scheduled for r in reqs], dtype=np.int32)
    prefilling = np.array([r.computed < r.prompt for r in reqs], dtype=bool)
    phase: dict[str, Any] = {
        "is_prefilling_np": prefilling,
        "has_prefill": bool(prefilling.any()),
        "decode_graph_eligible": not bool(prefilling.any()),
        "prefill_len_np": np.array([r.prompt for r in reqs], dtype=np.int32),
        "num_computed_prefill_tokens_np": np.array(
            [min(r.computed, r.prompt) for r in reqs], dtype=np.int32
        ),
        "num_computed_tokens_np": np.array([r.computed for r in reqs], dtype=np.int32),
        "prefill_runs_as_decode_np": None,
        "max_query_len": None if prefilling.any() else int(scheduled.max()),
    }
    fields = {name: value for name, value in phase.items() if name in declared}
    idx = np.array([_state_index(i) for i in range(len(reqs))], dtype=np.int32)
    return Fake(
        "InputBatch",
        req_ids=[req_id(i) for i in range(len(reqs))],
        num_reqs=len(reqs),
        num_reqs_after_padding=len(reqs),
        idx_mapping_np=idx,
        num_scheduled_tokens=scheduled,
        num_tokens=int(scheduled.sum()),
        num_tokens_after_padding=int(scheduled.sum()),
        num_draft_tokens=sum(r.drafts for r in reqs),
        num_draft_tokens_per_req=np.array([r.drafts for r in reqs], dtype=np.int32),
        seq_lens_cpu_upper_bound=np.array(
            [r.computed + r.scheduled for r in reqs], dtype=np.int32
        ),
        **fields,
    )


def speculator_state(step: Step) -> dict[str, Any]:
    return {
        "prefill_cudagraph_manager": graph_manager(),
        "cudagraph_manager": graph_manager(),
        "dp_size": step.dp_size,
        "dp_rank": 0,
        "num_speculative_steps": step.k,
        "max_model_len": 4096,
        "max_num_reqs": MAX_REQS,
        "decode_query_len": step.k + 1,
        "pcp_manager": None,
        "adaptive_verification": None,
    }


def _outcome(case: Case[Step], run: Callable[[], Any]) -> Outcome:
    q = case.step.k + 1
    try:
        run()
    except ReachedDispatch as reached:
        # Any uniform count asks for a FULL decode graph: every row of a case
        # schedules q tokens, and a speculator may widen them alike (0.32's
        # standalone draft adds a correction token to each).
        count = reached.uniform_token_count
        uniform = isinstance(count, int | np.integer) and count > 0
        bound = reached.max_query_len
        varlen = isinstance(bound, int | np.integer) and 0 < bound <= q
        full = bool(uniform or varlen)
        said = (
            "got the FULL decode graph"
            if uniform
            else f"got a FULL varlen decode graph (query length bound {bound})"
            if varlen
            else "ran without the FULL decode graph"
        )
        return graph_outcome(case, full, said)
    raise CannotRun("the step ended before it reached the CUDA-graph dispatch")


class Target(NamedTuple):
    make: Callable[[str, str, dict[str, Any]], Any]
    speculators: list[tuple[str, str]]
    #: The phase columns the draft's fake batch carries.
    declared: set[str]

    def run_target(self, case: Case[Step]) -> Outcome:
        runner = self.make(MRV2_RUNNER, MRV2_RUNNER_CLASS, runner_state(case.step))
        step = getattr(runner, TARGET_STEP)
        output = scheduler_output(
            case.step.reqs,
            scheduled_new_reqs=[],
            finished_req_ids=set(),
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[],
        )
        supplied = {"scheduler_output": output, "dummy_run": False}
        arguments = keyword_arguments(step, supplied, StandIn)
        return _outcome(case, lambda: step(**arguments))

    def run_draft(self, module: str, owner: str) -> Callable[[Case[Step]], Outcome]:
        def run(case: Case[Step]) -> Outcome:
            speculator = self.make(module, owner, speculator_state(case.step))
            propose = getattr(speculator, DRAFT_STEP)
            supplied = {
                "input_batch": draft_batch(case.step, self.declared),
                "attn_metadata": {},
                "slot_mappings": {},
                "aux_hidden_states": None,
                "num_tokens_across_dp": None,
                "dummy_run": False,
                "skip_attn_for_dummy_run": False,
                "is_profile": False,
                "mm_inputs": None,
            }
            arguments = keyword_arguments(propose, supplied, StandIn)
            return _outcome(case, lambda: propose(**arguments))

        return run

    def judge(self) -> Evidence:
        runs: dict[Case[Step], Callable[[Case[Step]], Outcome]] = {
            case: self.run_target
            for k in TARGET_WIDTHS
            for case in _phase_cases(k, data_parallel=True)
        }
        for module, owner in self.speculators:
            run = self.run_draft(module, owner)
            for k in DRAFT_WIDTHS:
                for case in _phase_cases(k, data_parallel=False):
                    name = f"{case.name}, {owner}'s draft prefill"
                    runs[Case(name, case.expect, case.step)] = run
        return judge_cases(runs, lambda case: runs[case](case))


#: What a draft prefill computes when it asks for a decode graph by shape
#: (0.20-0.27) or by phase (0.28+).
_DRAFT_PREFILL_COUNTS = frozenset(
    {"get_uniform_token_count", "get_uniform_decode_token_count"}
)


def _speculators_in_source(code: SourceCode) -> list[tuple[str, str]]:
    """Each speculator class whose ``propose`` is a def of its own (a
    subclass that inherits another's is judged with that one) that asks for
    a decode graph for its draft prefill. Left out: a ``propose`` that runs
    its prefill eagerly (0.32's standalone drafter) and one inherited from an
    abstract base (0.34's ``AutoRegressiveSpeculator``, whose subclasses
    draft the prefill)."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for module, owner in MRV2_SPECULATORS:
        if not code.sources.has_class(module, owner):
            continue
        defined = code.defining_class(module, owner, DRAFT_STEP)
        if defined is None or defined in found:
            continue
        node = code.sources.function_node(defined[0], f"{defined[1]}.{DRAFT_STEP}")
        if node is not None and _DRAFT_PREFILL_COUNTS.isdisjoint(
            recognition.referenced_names(node)
        ):
            continue
        found[defined] = (module, owner)
    return list(found.values())


def judge_source(sources: SourceReader) -> Evidence:
    code = shared_code(sources)
    declared = {
        name
        for name in _PHASE_FIELDS
        if sources.sets_attribute(MRV2_INPUT_BATCH, "InputBatch", name)
    }
    return Target(code.instance, _speculators_in_source(code), declared).judge()


def judge_live(draft: bool = True) -> Evidence | None:
    """The target's cases on the imported runner class; the draft prefill's
    (unless ``draft`` is off) compiled from the installed source, as its step
    launches GPU kernels before the dispatch."""
    runner_class = imported_class(MRV2_RUNNER, MRV2_RUNNER_CLASS)
    if runner_class is None:
        return None
    input_batch = imported_class(MRV2_INPUT_BATCH, "InputBatch")
    installed = SourceReader()
    fields = getattr(input_batch, "__dataclass_fields__", {})
    declared = {
        name
        for name in _PHASE_FIELDS
        if input_batch is not None and (name in fields or hasattr(input_batch, name))
    }

    def make(module: str, owner: str, state: dict[str, Any]) -> Any:
        if (module, owner) == (MRV2_RUNNER, MRV2_RUNNER_CLASS):
            return live_instance(runner_class, state, {})
        return shared_code(installed).instance(module, owner, state)

    speculators = _speculators_in_source(shared_code(installed)) if draft else []
    evidence = Target(make, speculators, declared).judge()
    if not speculators:
        return evidence
    return evidence._replace(
        note="the draft prefill's compiled from the installed source (its "
        "kernels need a GPU)",
    )
