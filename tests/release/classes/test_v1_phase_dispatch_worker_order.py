"""Pipeline plus sequence parallel: the worker's real call order, step by step.

vLLM 0.20-0.31's ``Worker.execute_model`` calls the runner's dispatch itself
under pipeline and sequence parallelism, before the runner updates its
request state, then the runner dispatches again after ``_prepare_inputs``.
Here the release's real ``Worker.execute_model`` runs each step on a runner
that holds only what the dispatch reads; the runner's ``execute_model``
updates its request table and columns as ``_update_states`` does, runs the
release's own draft-counting statements of ``_prepare_inputs`` (taken from
its source) and dispatches as the runner does. Every step follows a step
whose columns say the opposite, so a decision read from the columns at the
worker's call is wrong.

Truth, per step: a fresh K+1-token prompt and a K+1-token re-prefill after
preemption are prefills; a genuine decode is a decode; a padded prompt tail is
whatever the release's own counting makes of it. Every dispatch of the step
must give that answer (releases whose worker does not classify give one).
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.release import v1_runner
from tests.support.vllm_fakes.v1_runner import (
    MAX_ROWS,
    DispatchRecord,
    input_batch,
    make_runner,
)
from vllm_graphsafe import vllm_layout
from vllm_graphsafe.fixes.scheduled_rows import decode_draft_count
from vllm_graphsafe.fixes.v1_phase_dispatch.drafting import recognise_draft_counting
from vllm_graphsafe.sources import SourceReader

if not v1_runner.installed():
    pytest.skip(v1_runner.ABSENT, allow_module_level=True)

PATCH_ID = "v1-phase-dispatch"
SPEC_TOKENS = 3
Q = SPEC_TOKENS + 1


@dataclass(frozen=True)
class Scheduled:
    """One request of a step, as the scheduler sends it."""

    req_id: str
    prompt: int
    computed: int
    scheduled: int
    drafts: int | None = None
    new: bool = False


def decode(req_id: str, prompt: int, computed: int) -> Scheduled:
    return Scheduled(req_id, prompt, computed, Q, drafts=SPEC_TOKENS)


def fresh_prompt(req_id: str) -> Scheduled:
    return Scheduled(req_id, prompt=Q, computed=0, scheduled=Q, new=True)


# Two steps each; the second is checked. Every first step leaves the columns
# saying the opposite of the second step's truth in the rows it reuses.
SCENARIOS: dict[str, tuple[list[Scheduled], list[Scheduled]]] = {
    # A decoding request finishes; a fresh K+1-token prompt takes its row.
    "prompt_after_a_decode": ([decode("a", 10, 25)], [fresh_prompt("b")]),
    # A fresh prompt computed, the request now decodes with K drafts.
    "decode_after_its_prompt": (
        [fresh_prompt("b")],
        [decode("b", Q, Q)],
    ),
    # Resumed after preemption: K+1 of its earlier output tokens, no drafts.
    "reprefill_after_a_decode": (
        [decode("a", 10, 25)],
        [Scheduled("r", prompt=10, computed=17, scheduled=Q)],
    ),
    # All but its last prompt token computed (a full prefix-cache hit): the
    # scheduler pads it with K placeholder drafts beside a running decode.
    "padded_tail_beside_a_decode": (
        [decode("a", 10, 25), fresh_prompt("d")],
        [
            decode("a", 10, 25 + Q),
            Scheduled("c", 129, 128, Q, drafts=SPEC_TOKENS, new=True),
        ],
    ),
}
#: Steps whose truth every release shares (closed forms); the padded tail's
#: depends on how the release counts drafts, read from its own statements.
SHARED_TRUTH = {
    "prompt_after_a_decode": False,
    "decode_after_its_prompt": True,
    "reprefill_after_a_decode": False,
}
#: The fix overturns vLLM's shape answer there: regressions of the fix.
REGRESSIONS = [name for name, truth in SHARED_TRUTH.items() if truth is False]


def scheduler_output(step: list[Scheduled]) -> SimpleNamespace:
    cached = [request for request in step if not request.new]
    return SimpleNamespace(
        num_scheduled_tokens={request.req_id: request.scheduled for request in step},
        total_num_scheduled_tokens=sum(request.scheduled for request in step),
        scheduled_spec_decode_tokens={
            request.req_id: [-1] * request.drafts
            for request in step
            if request.drafts is not None
        },
        scheduled_new_reqs=[
            SimpleNamespace(
                req_id=request.req_id,
                num_computed_tokens=request.computed,
                prompt_token_ids=list(range(request.prompt)),
                prompt_embeds=None,
            )
            for request in step
            if request.new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[request.req_id for request in cached],
            num_computed_tokens=[request.computed for request in cached],
        ),
        scheduled_encoder_inputs={},
    )


# -- the release's own draft counting --------------------------------------------


@dataclass(frozen=True)
class DraftCountingCode:
    """``use_spec_decode = ...``, the test that picks the counting branch, and the
    branch's statements before its spec-decode metadata."""

    decision: CodeType
    runs_branch: CodeType
    counting: CodeType


@functools.cache
def release_draft_counting() -> DraftCountingCode:
    runner_class = vllm_layout.load_name(
        vllm_layout.V1_RUNNER, vllm_layout.V1_RUNNER_CLASS
    )
    source = textwrap.dedent(inspect.getsource(runner_class._prepare_inputs))
    function = ast.parse(source).body[0]

    def names(node: ast.AST) -> set[str]:
        return {
            child.id if isinstance(child, ast.Name) else child.attr
            for child in ast.walk(node)
            if isinstance(child, ast.Name | ast.Attribute)
        }

    decisions = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and [getattr(target, "id", None) for target in node.targets]
        == ["use_spec_decode"]
    ]
    branches = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.If) and "use_spec_decode" in names(node.test)
    ]
    if not decisions or not branches:
        pytest.fail("this release's _prepare_inputs has no use_spec_decode branch")
    branch = branches[0]
    counts_in_body = "num_decode_draft_tokens" in names(ast.Module(branch.body, []))
    statements = list(
        itertools.takewhile(
            lambda statement: "_calc_spec_decode_metadata" not in names(statement),
            branch.body if counts_in_body else branch.orelse,
        )
    )
    test = branch.test if counts_in_body else ast.UnaryOp(ast.Not(), branch.test)
    return DraftCountingCode(
        decision=compile(
            ast.fix_missing_locations(ast.Module([decisions[0]], [])),
            "<decision>",
            "exec",
        ),
        runs_branch=compile(
            ast.fix_missing_locations(ast.Expression(test)), "<test>", "eval"
        ),
        counting=compile(
            ast.fix_missing_locations(ast.Module(statements, [])), "<counting>", "exec"
        ),
    )


def draft_counts_of_the_release(
    step: list[Scheduled], batch: Any, step_output: SimpleNamespace
) -> np.ndarray | None:
    """What the release's ``_prepare_inputs`` counts for the step's rows; None
    when it leaves the runner's column as it was (no drafts in the step, on
    releases that count only then)."""
    code = release_draft_counting()
    namespace: dict[str, Any] = {
        "np": np,
        "self": SimpleNamespace(input_batch=batch, speculative_config=object()),
        "scheduler_output": step_output,
        "num_reqs": len(step),
        "num_scheduled_tokens": np.array([r.scheduled for r in step], dtype=np.int32),
    }
    exec(code.decision, namespace)
    if not eval(code.runs_branch, namespace):
        return None
    exec(code.counting, namespace)
    counts: np.ndarray = namespace["num_decode_draft_tokens"]
    return counts


# -- a worker and its runner --------------------------------------------------------


class StepRunner:
    """The runner side of a step: request table, columns, draft counts, dispatch."""

    def __init__(self, record: DispatchRecord) -> None:
        self.record = record
        self.batch = input_batch([])
        self.batch.req_id_to_index = {}
        self.draft_counts = SimpleNamespace(np=np.full(MAX_ROWS, -1, dtype=np.int32))
        self.runner = make_runner(Q, self.batch, record, draft_counts=self.draft_counts)
        self.runner.__dict__.update(requests={}, execute_model=self.execute_model)
        self.runner.parallel_config.pipeline_parallel_size = 2
        self.runner.compilation_config.pass_config.enable_sp = True
        #: What the release's own counting gave the step's rows (None: untouched).
        self.counted: np.ndarray | None = None
        self.step: list[Scheduled] = []

    def execute_model(self, step_output: Any, intermediate_tensors: Any = None) -> None:
        step = self.step
        for request in step_output.scheduled_new_reqs:
            self.runner.requests[request.req_id] = SimpleNamespace(
                num_prompt_tokens=len(request.prompt_token_ids)
            )
        self.batch.req_id_to_index = {r.req_id: row for row, r in enumerate(step)}
        for row, request in enumerate(step):
            self.batch.num_computed_tokens_cpu[row] = request.computed
            self.batch.num_prompt_tokens[row] = request.prompt
        self.batch.num_reqs = len(step)
        self.counted = draft_counts_of_the_release(step, self.batch, step_output)
        if self.counted is not None:
            self.draft_counts.np[: len(step)] = self.counted
            self.draft_counts.np[len(step) :] = -1
        scheduled = [request.scheduled for request in step]
        dispatch = self.runner._determine_batch_execution_and_padding
        # A backported tree's runner hands its dispatch the step, as here.
        step_argument = (
            {"scheduler_output": step_output}
            if "scheduler_output" in inspect.signature(dispatch).parameters
            else {}
        )
        dispatch(
            num_tokens=sum(scheduled),
            num_reqs=len(scheduled),
            num_scheduled_tokens_np=np.array(scheduled, dtype=np.int32),
            max_num_scheduled_tokens=max(scheduled),
            use_cascade_attn=False,
            **step_argument,
        )


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, StepRunner]]:
    """A real ``Worker`` on one pipeline stage, with sequence parallelism on."""
    worker_module = vllm_layout.load(vllm_layout.V1_WORKER)
    single_stage = SimpleNamespace(is_first_rank=True, is_last_rank=True)
    monkeypatch.setattr(worker_module, "get_pp_group", lambda: single_stage)
    # Where the worker classifies early it sizes the residual from the answer.
    monkeypatch.setattr(
        worker_module,
        "is_residual_scattered_for_sp",
        lambda config, tokens: False,
        raising=False,
    )
    side = StepRunner(DispatchRecord())
    worker = object.__new__(worker_module.Worker)
    worker.__dict__.update(
        _pp_send_work=[],
        vllm_config=side.runner.vllm_config,
        use_v2_model_runner=False,
        profiler=None,
        model_runner=side.runner,
    )
    yield worker, side


def run_step(worker: Any, side: StepRunner, step: list[Scheduled]) -> list[bool]:
    """Every dispatch answer of one step, in call order."""
    side.step = step
    for request in step:
        if not request.new:  # a cached request's state is the runner's since it was new
            side.runner.requests.setdefault(
                request.req_id, SimpleNamespace(num_prompt_tokens=request.prompt)
            )
    before = len(side.record.uniform_decode)
    worker.execute_model(scheduler_output(step))
    return side.record.uniform_decode[before:]


def worker_classifies_early() -> bool:
    return SourceReader().calls(
        vllm_layout.V1_WORKER,
        "Worker.execute_model",
        "_determine_batch_execution_and_padding",
    )


def truth_after_prepare_inputs(side: StepRunner) -> bool:
    """Every row a decode of K drafts as the release's own counting left them
    (the builders get no counts when it counted nothing: no decode of K)."""
    counted = side.counted
    return counted is not None and bool((counted == SPEC_TOKENS).all())


def scenario_params(names: list[str]) -> list[Any]:
    return [
        pytest.param(
            name,
            marks=[pytest.mark.regression(PATCH_ID)] if name in REGRESSIONS else [],
            id=name,
        )
        for name in names
    ]


@pytest.mark.parametrize("scenario", scenario_params(list(SCENARIOS)))
def test_both_dispatches_of_a_step_give_the_answer_of_its_rows(
    scenario: str, worker: tuple[Any, StepRunner]
) -> None:
    real_worker, side = worker
    first, second = SCENARIOS[scenario]

    run_step(real_worker, side, first)
    answers = run_step(real_worker, side, second)

    truth = SHARED_TRUTH.get(scenario, truth_after_prepare_inputs(side))
    assert truth == truth_after_prepare_inputs(side)
    assert answers == [truth] * (2 if worker_classifies_early() else 1)


@pytest.mark.regression(PATCH_ID)
def test_a_run_of_steps_keeps_every_prefill_off_the_decode_graph(
    worker: tuple[Any, StepRunner],
) -> None:
    """Decode, then a prompt, then its decodes, then a re-prefill: one runner."""
    real_worker, side = worker
    steps = [
        [decode("a", 10, 25)],
        [fresh_prompt("b")],
        [decode("b", Q, Q)],
        [decode("b", Q, 2 * Q)],
        [Scheduled("r", prompt=10, computed=17, scheduled=Q)],
        [decode("r", 10, 17 + Q)],
    ]
    per_call = 2 if worker_classifies_early() else 1

    answers = [run_step(real_worker, side, step) for step in steps]

    expected = [True, False, True, True, False, True]
    assert answers == [[truth] * per_call for truth in expected]


def test_a_runner_classifying_outside_its_worker_fails_open(
    worker: tuple[Any, StepRunner], caplog: pytest.LogCaptureFixture
) -> None:
    """Under pipeline + sequence parallel the rule needs the worker's step: a
    dispatch reached some other way gets vLLM's answer and one warning."""
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    patch = registry().get(PATCH_ID)
    if patch.state is not PatchState.APPLIED or not worker_classifies_early():
        pytest.skip("only where the plugin applies and the worker classifies early")
    _, side = worker
    side.step = [fresh_prompt("b")]
    try:
        with caplog.at_level("WARNING", logger="vllm.graphsafe"):
            side.execute_model(scheduler_output(side.step))
        assert side.record.uniform_decode == [True]
        assert registry().get(PATCH_ID).state is PatchState.FAILED
        assert "no scheduler output is held" in patch.reason
        warnings = [r for r in caplog.records if r.name == "vllm.graphsafe"]
        assert len(warnings) == 1
    finally:
        patch._failed_at_run_time = False
        registry().apply_all()
    assert patch.state is PatchState.APPLIED


def test_workers_without_early_classification_keep_vllm_execute_model(
    worker: tuple[Any, StepRunner],
) -> None:
    """Pipeline parallel alone: the worker runs vLLM's own method, unwrapped."""
    real_worker, side = worker
    side.runner.compilation_config.pass_config.enable_sp = False
    worker_class = type(real_worker)
    vllm_method = inspect.unwrap(inspect.getattr_static(worker_class, "execute_model"))

    bound: Callable[..., Any] = real_worker.execute_model

    assert inspect.unwrap(bound.__func__) is vllm_method  # type: ignore[attr-defined]
    assert run_step(real_worker, side, [fresh_prompt("b")]) == [False]


def test_the_counting_read_from_the_release_matches_its_own_statements() -> None:
    """Rows on which the two ways of counting, and zero-draft decodes, differ:
    the plugin's count from what it recognised equals the release's own."""
    runner_class = vllm_layout.load_name(
        vllm_layout.V1_RUNNER, vllm_layout.V1_RUNNER_CLASS
    )
    prepare_inputs = ast.parse(
        textwrap.dedent(inspect.getsource(runner_class._prepare_inputs))
    )
    counting = recognise_draft_counting(prepare_inputs)
    assert counting is not None
    step = [
        decode("decode", 10, 25),
        Scheduled("padded-tail", 129, 128, Q, drafts=SPEC_TOKENS, new=True),
        Scheduled("wider-than-drafts", 10, 30, Q + 1, drafts=SPEC_TOKENS),
        Scheduled("zero-draft-decode", 10, 30, 1),
        Scheduled("one-token-prompt-chunk", 40, 30, 1),
        Scheduled("fewer-drafts", 10, 30, 2, drafts=1),
        Scheduled("reprefill", 10, 17, Q),
    ]
    batch = input_batch([])
    batch.req_id_to_index = {request.req_id: row for row, request in enumerate(step)}
    for row, request in enumerate(step):
        batch.num_computed_tokens_cpu[row] = request.computed
        batch.num_prompt_tokens[row] = request.prompt

    release_counts = draft_counts_of_the_release(step, batch, scheduler_output(step))

    assert release_counts is not None
    assert release_counts.tolist() == [
        decode_draft_count(r.scheduled, r.drafts, r.computed, r.prompt, counting)
        for r in step
    ]


def drop_cached_requests(step_output: SimpleNamespace) -> None:
    del step_output.scheduled_cached_reqs


def drop_cached_computed_counts(step_output: SimpleNamespace) -> None:
    del step_output.scheduled_cached_reqs.num_computed_tokens


@pytest.mark.parametrize(
    ("unreadable", "drop"),
    [
        ("scheduled_cached_reqs", drop_cached_requests),
        ("num_computed_tokens", drop_cached_computed_counts),
    ],
)
def test_an_unreadable_step_returns_vllm_answer_and_fails_the_patch(
    unreadable: str,
    drop: Callable[[SimpleNamespace], None],
    worker: tuple[Any, StepRunner],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    patch = registry().get(PATCH_ID)
    if patch.state is not PatchState.APPLIED or not worker_classifies_early():
        pytest.skip("only where the plugin applies and the worker classifies early")
    real_worker, side = worker
    side.step = [fresh_prompt("b")]
    step_output = scheduler_output(side.step)
    drop(step_output)
    try:
        with caplog.at_level("WARNING", logger="vllm.graphsafe"):
            real_worker.execute_model(step_output)
        # vLLM's own shape answer at the worker's call and the runner's.
        assert side.record.uniform_decode == [True, True]
        assert registry().get(PATCH_ID).state is PatchState.FAILED
        assert unreadable in patch.reason
        warnings = [
            r.getMessage() for r in caplog.records if r.name == "vllm.graphsafe"
        ]
        assert len(warnings) == 1 and PATCH_ID in warnings[0]
    finally:
        patch._failed_at_run_time = False
        registry().apply_all()
    assert patch.state is PatchState.APPLIED
