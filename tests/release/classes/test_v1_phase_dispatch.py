"""The V1 runner's real dispatch decision, on phase-ambiguous batches.

Each case states the batch's rows; the expected classification is derived from
them: uniform decode iff the shape is uniform at the decode width and the
attention metadata builders see every row as a decode (with K speculative
tokens: the scheduler listed K drafts for it; without: it had computed a token
before). On a vLLM without the fix (negative control:
``VLLM_GRAPHSAFE_DISABLE=all``) every case the fix keeps off the decode graph
fails; with the rule replaced by the prompt-length predicate
(``--prompt-length-rule``) the re-prefill and padded-tail cases fail.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from tests.release import v1_runner
from tests.support.vllm_fakes.v1_runner import (
    DispatchRecord,
    Row,
    UntouchableBatch,
    make_runner,
    run_dispatch,
    runner_over,
    write_step,
)
from vllm_graphsafe import counts, vllm_layout
from vllm_graphsafe.fixes import phase_events

if not v1_runner.installed():
    pytest.skip(v1_runner.ABSENT, allow_module_level=True)

SPEC_TOKENS = [0, 1, 2, 3, 4, 6, 7, 15]


def decoding(prompt: int, computed: int, q: int) -> Row:
    """A request past its prompt that schedules its token and its q - 1 drafts."""
    return Row(prompt=prompt, computed=computed, scheduled=q, drafts=q - 1)


def fresh_prompt(q: int) -> list[Row]:
    return [Row(prompt=q, computed=0, scheduled=q)]


def equal_fresh_prompts(q: int) -> list[Row]:
    return [Row(prompt=q, computed=0, scheduled=q) for _ in range(3)]


def chunked_tail(q: int) -> list[Row]:
    return [Row(prompt=512 + q, computed=512, scheduled=q)]


def prefix_cache_hit(q: int) -> list[Row]:
    return [Row(prompt=64 + q, computed=64, scheduled=q)]


def decodes_plus_prefill(q: int) -> list[Row]:
    decodes = [decoding(20, 20 + 9 * i, q) for i in range(3)]
    return [*decodes, Row(prompt=q, computed=0, scheduled=q)]


def prefill_between_decodes(q: int) -> list[Row]:
    return [
        decoding(30, 41, q),
        Row(prompt=100 + q, computed=100, scheduled=q),
        decoding(7, 12, q),
    ]


def preemption_reprefill(q: int) -> list[Row]:
    """Resumed after preemption: re-computes earlier output tokens, no drafts."""
    return [Row(prompt=10, computed=17, scheduled=q)]


def reprefill_beside_decodes(q: int) -> list[Row]:
    return [decoding(20, 33, q), Row(prompt=10, computed=17, scheduled=q)]


def padded_prompt_tail(q: int) -> list[Row]:
    """All but the last prompt token computed (a full prefix-cache hit, a
    remote-KV admission): the scheduler pads it with q - 1 placeholder drafts."""
    return [Row(prompt=129, computed=128, scheduled=q, drafts=q - 1)]


def padded_tail_beside_decodes(q: int) -> list[Row]:
    return [decoding(40, 52, q), *padded_prompt_tail(q), decoding(8, 9, q)]


def all_decode(q: int) -> list[Row]:
    return [decoding(10 + i, 25 + 3 * i, q) for i in range(4)]


def just_finished_prompts(q: int) -> list[Row]:
    return [decoding(40, 40, q) for _ in range(2)]


def optimistic_async_decode(q: int) -> list[Row]:
    return [decoding(16, 16 + 2 * q + 5, q) for _ in range(2)]


CASES: dict[str, Callable[[int], list[Row]]] = {
    case.__name__: case
    for case in (
        fresh_prompt,
        equal_fresh_prompts,
        chunked_tail,
        prefix_cache_hit,
        decodes_plus_prefill,
        prefill_between_decodes,
        preemption_reprefill,
        reprefill_beside_decodes,
        padded_prompt_tail,
        padded_tail_beside_decodes,
        all_decode,
        just_finished_prompts,
        optimistic_async_decode,
    )
}
PATCH_ID = "v1-phase-dispatch"


def uniform_shape(rows: list[Row], decode_query_len: int) -> bool:
    return all(row.scheduled == decode_query_len for row in rows)


def builders_see_decodes(rows: list[Row], decode_query_len: int) -> bool:
    """Every row a decode to the metadata builders, from the rows alone."""
    if decode_query_len > 1:
        return all(row.drafts == decode_query_len - 1 for row in rows)
    return all(row.computed > 0 for row in rows)


def expected_uniform_decode(rows: list[Row], decode_query_len: int) -> bool:
    return uniform_shape(rows, decode_query_len) and builders_see_decodes(
        rows, decode_query_len
    )


def by_prompt_length(rows: list[Row], decode_query_len: int) -> bool:
    """The earlier predicate: every row had computed its whole prompt."""
    return uniform_shape(rows, decode_query_len) and not any(
        row.in_prefill for row in rows
    )


def classification_params(
    keep: Callable[[list[Row], int], bool] = lambda rows, q: True,
    names: tuple[str, ...] = tuple(CASES),
    spec_tokens_list: tuple[int, ...] = tuple(SPEC_TOKENS),
) -> list[object]:
    """(case, spec_tokens) pairs; where the fix overturns the shape answer the
    pair is a regression of the fix."""
    params: list[object] = []
    for name in names:
        for spec_tokens in spec_tokens_list:
            q = spec_tokens + 1
            rows = CASES[name](q)
            if not keep(rows, q):
                continue
            overturned = uniform_shape(rows, q) and not expected_uniform_decode(rows, q)
            marks = [pytest.mark.regression(PATCH_ID)] if overturned else []
            params.append(
                pytest.param(
                    name, spec_tokens, marks=marks, id=f"{name}-K{spec_tokens}"
                )
            )
    return params


def check_classification(case: str, spec_tokens: int) -> None:
    q = spec_tokens + 1
    rows = CASES[case](q)
    record = DispatchRecord()
    runner = runner_over(rows, q, record)

    counts.STATS.reset()
    run_dispatch(runner, [row.scheduled for row in rows])

    expected = expected_uniform_decode(rows, q)
    assert record.uniform_decode == [expected]
    if patch_is_applied():
        assert counts.STATS.snapshot().get(PATCH_ID) == {expected_event(rows, q): 1}


@pytest.mark.parametrize(("case", "spec_tokens"), classification_params())
def test_real_step_classification(case: str, spec_tokens: int) -> None:
    check_classification(case, spec_tokens)


@pytest.mark.parametrize(
    ("case", "spec_tokens"),
    classification_params(
        lambda rows, q: by_prompt_length(rows, q) != expected_uniform_decode(rows, q)
    ),
)
def test_rows_the_builders_classify_unlike_prompt_length(
    case: str, spec_tokens: int
) -> None:
    """Re-prefills past the prompt stay off the graph; padded prompt tails (and,
    without speculation, one-token prompt tails) keep it."""
    check_classification(case, spec_tokens)


def patch_is_applied() -> bool:
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    return registry().get(PATCH_ID).state is PatchState.APPLIED


def expected_event(rows: list[Row], decode_query_len: int) -> str:
    """The decision counter a step must move: derived from its rows."""
    if not uniform_shape(rows, decode_query_len):
        return phase_events.NON_UNIFORM
    if not builders_see_decodes(rows, decode_query_len):
        return phase_events.KEPT_OFF_DECODE
    return phase_events.UNIFORM_DECODE


@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_stale_rows_past_the_batch_are_ignored(spec_tokens: int) -> None:
    q = spec_tokens + 1
    rows = all_decode(q)
    stale = [Row(prompt=300, computed=0, scheduled=0)]
    record = DispatchRecord()
    runner = runner_over(rows, q, record, stale_rows=stale)

    run_dispatch(runner, [row.scheduled for row in rows])

    assert record.uniform_decode == [True]


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_consecutive_steps_read_the_batch_as_it_is_now(spec_tokens: int) -> None:
    """One runner, same batch size each step: rows change in place, then the batch."""
    q = spec_tokens + 1
    rows = all_decode(q)
    record = DispatchRecord()
    runner = runner_over(rows, q, record)
    expected = []

    def step() -> None:
        write_step(runner, rows)
        run_dispatch(runner, [row.scheduled for row in rows])
        expected.append(expected_uniform_decode(rows, q))

    step()
    # A finished request's row is reused, in place, by a fresh prompt.
    rows[2] = Row(prompt=q, computed=0, scheduled=q)
    step()
    # Its prompt computed: the same arrays describe a decode batch again.
    rows[2] = decoding(q, q, q)
    step()
    # The runner gets new columns (new arrays) with a fresh prompt in row 0.
    rows[0] = Row(prompt=q, computed=0, scheduled=q)
    runner = runner_over(rows, q, record)
    step()

    assert expected == [True, False, True, False]
    assert record.uniform_decode == expected


def release_counts_drafts_only_on_drafting_steps() -> bool:
    """Whether this release's ``_prepare_inputs`` decides to count the rows'
    drafts from the step's scheduled drafts (0.20-0.31), read from its source."""
    runner_class = vllm_layout.load(vllm_layout.V1_RUNNER).GPUModelRunner
    source = inspect.getsource(runner_class._prepare_inputs)
    return "len(scheduler_output.scheduled_spec_decode_tokens)" in source


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize("spec_tokens", [1, 3, 7])
def test_a_step_without_drafts_is_not_read_from_the_last_drafting_step(
    spec_tokens: int,
) -> None:
    """A decode step, then a step that schedules no drafts at all (a K+1-token
    prompt left by a prefix-cache hit, alone): on releases whose
    ``_prepare_inputs`` leaves the draft counts of the decode step in place,
    the prompt step must still leave the decode graph."""
    q = spec_tokens + 1
    counts_every_step = not release_counts_drafts_only_on_drafting_steps()
    decodes = [decoding(40, 50 + i, q) for i in range(2)]
    prompts = [Row(prompt=64 + q, computed=64, scheduled=q) for _ in range(2)]
    record = DispatchRecord()
    runner = runner_over(decodes, q, record)
    for rows in (decodes, prompts, decodes):
        write_step(runner, rows, counts_drafts_without_drafts=counts_every_step)
        run_dispatch(runner, [row.scheduled for row in rows])

    assert record.uniform_decode == [True, False, True]


@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_dummy_and_capture_runs_keep_their_classification(
    spec_tokens: int, forced: bool
) -> None:
    q = spec_tokens + 1
    rows = equal_fresh_prompts(q)
    record = DispatchRecord()
    runner = runner_over(rows, q, record)

    run_dispatch(runner, [row.scheduled for row in rows], force_uniform_decode=forced)

    assert record.uniform_decode == [forced]


@pytest.mark.parametrize(
    "scheduled_for", [lambda q: [q, q + 1], lambda q: [q + 3], lambda q: [q, 2 * q + 1]]
)
@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_non_uniform_shapes_skip_the_request_scan(
    spec_tokens: int, scheduled_for: Callable[[int], list[int]]
) -> None:
    q = spec_tokens + 1
    record = DispatchRecord()
    runner = make_runner(q, UntouchableBatch(), record)

    run_dispatch(runner, scheduled_for(q))

    assert record.uniform_decode == [False]


@pytest.mark.parametrize(
    ("case", "spec_tokens"),
    classification_params(
        names=(
            "fresh_prompt",
            "decodes_plus_prefill",
            "preemption_reprefill",
            "padded_prompt_tail",
            "all_decode",
        ),
        spec_tokens_list=(0, 3),
    ),
)
def test_dp_sync_receives_the_phase_aware_classification(
    case: str, spec_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner_module = vllm_layout.load(vllm_layout.V1_RUNNER)

    q = spec_tokens + 1
    rows = CASES[case](q)
    record = DispatchRecord()

    def coordinate_batch_across_dp(**kwargs: Any) -> tuple[bool, None, int]:
        record.dp_uniform_decode.append(bool(kwargs["uniform_decode"]))
        return False, None, int(kwargs["cudagraph_mode"])

    monkeypatch.setattr(
        runner_module, "coordinate_batch_across_dp", coordinate_batch_across_dp
    )
    runner = runner_over(rows, q, record, dp_size=2)

    run_dispatch(runner, [row.scheduled for row in rows])

    assert record.dp_uniform_decode == [expected_uniform_decode(rows, q)]


def release_classifies_early_in_the_worker() -> bool:
    """0.20-0.31: pipeline + sequence parallel classify from the worker, early."""
    from vllm_graphsafe.sources import SourceReader

    return SourceReader().calls(
        vllm_layout.V1_WORKER,
        "Worker.execute_model",
        "_determine_batch_execution_and_padding",
    )


def parallel_runner(rows: list[Row], record: DispatchRecord, pp: int, sp: bool) -> Any:
    runner = runner_over(rows, 4, record)
    runner.parallel_config.pipeline_parallel_size = pp
    runner.compilation_config.pass_config.enable_sp = sp
    return runner


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize(
    ("pipeline_parallel_size", "sequence_parallel"),
    [(2, False), (1, True), (4, False)],
    ids=["pipeline-only", "sequence-parallel-only", "pipeline-4-only"],
)
def test_pipeline_only_or_sequence_parallel_only_keeps_the_fix(
    pipeline_parallel_size: int,
    sequence_parallel: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the two together make a worker classify early (decided from the
    step's scheduler output: test_v1_phase_dispatch_worker_order.py); either
    alone reads the runner's rows."""
    record = DispatchRecord()
    rows = fresh_prompt(4)
    runner = parallel_runner(
        rows, record, pp=pipeline_parallel_size, sp=sequence_parallel
    )

    with caplog.at_level("WARNING", logger="vllm.graphsafe"):
        run_dispatch(runner, [4])
        rows[0] = decoding(4, 4, 4)
        write_step(runner, rows)
        run_dispatch(runner, [4])

    assert record.uniform_decode == [False, True]
    assert not [r for r in caplog.records if r.name == "vllm.graphsafe"]


# -- calling convention ------------------------------------------------------------

SHAPE_CASES = [
    # (max_num_scheduled_tokens, uniform_decode_query_len, num_tokens, num_reqs,
    #  force_uniform_decode) -> vLLM's shape answer, in closed form
    ((4, 4, 12, 3, None), True),
    ((4, 4, 11, 3, None), False),
    ((5, 4, 10, 2, None), False),
    ((1, 1, 7, 7, None), True),
    ((4, 4, 11, 3, True), True),
    ((4, 4, 12, 3, False), False),
]


@pytest.mark.parametrize(("arguments", "shape_answer"), SHAPE_CASES)
def test_the_shape_rule_answers_on_the_class_without_a_runner(
    arguments: tuple[Any, ...], shape_answer: bool
) -> None:
    GPUModelRunner = vllm_layout.load(vllm_layout.V1_RUNNER).GPUModelRunner

    names = (
        "max_num_scheduled_tokens",
        "uniform_decode_query_len",
        "num_tokens",
        "num_reqs",
        "force_uniform_decode",
    )
    assert GPUModelRunner._is_uniform_decode(*arguments) is shape_answer
    keywords = dict(zip(names, arguments, strict=True))
    assert GPUModelRunner._is_uniform_decode(**keywords) is shape_answer
    if arguments[-1] is None:
        assert GPUModelRunner._is_uniform_decode(*arguments[:-1]) is shape_answer


@pytest.mark.regression(PATCH_ID)
def test_the_rule_on_a_runner_takes_keywords_or_positions() -> None:
    rows = fresh_prompt(4) * 3
    runner = runner_over(rows, 4, DispatchRecord())

    assert runner._is_uniform_decode(4, 4, 12, 3) is False
    assert runner._is_uniform_decode(4, 4, 12, 3, None) is False
    assert (
        runner._is_uniform_decode(
            max_num_scheduled_tokens=4,
            uniform_decode_query_len=4,
            num_tokens=12,
            num_reqs=3,
        )
        is False
    )
    assert runner._is_uniform_decode(4, 4, 12, 3, force_uniform_decode=True) is True


# -- failing open: each thing the rule reads, made unreadable ---------------------


@pytest.fixture
def applied_patch() -> Any:
    """The session's patch, applied; re-applied after a test made it fail."""
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    patch = registry().get(PATCH_ID)
    if patch.state is not PatchState.APPLIED:
        pytest.skip(f"{PATCH_ID} is {patch.state} here (plugin switched off)")
    yield patch
    patch._failed_at_run_time = False
    registry().apply_all()
    assert patch.state is PatchState.APPLIED


class WithoutAttribute:
    """``owner`` with ``name`` unreadable, as a release that renamed it."""

    def __init__(self, owner: Any, name: str) -> None:
        self._owner, self._name = owner, name

    def __getattr__(self, attribute: str) -> Any:
        if attribute == self._name:
            raise AttributeError(f"{type(self).__name__} has no {attribute!r}")
        return getattr(self._owner, attribute)


def drop_batch_column(runner: Any, name: str) -> None:
    runner.input_batch = WithoutAttribute(runner.input_batch, name)


def drop_runner_attribute(runner: Any, name: str) -> None:
    del runner.__dict__[name]


def drop_counts_and_prompt_lengths(runner: Any, name: str) -> None:
    """Neither the builders' draft counts nor the prompt lengths to fall back
    on (a runner with only its draft counts gone is read from its input batch:
    test_v1_phase_dispatch_minimal_runner.py)."""
    drop_runner_attribute(runner, "num_decode_draft_tokens")
    drop_batch_column(runner, name)


def drop_config(runner: Any, name: str) -> None:
    del runner.parallel_config.pipeline_parallel_size


# What the rule reads, how to make it unreadable, and the decode query length
# at which the rule reads it. The runner's ``input_batch`` itself is read by
# vLLM's own dispatch too.
READS = {
    "num_computed_tokens_cpu": (drop_batch_column, 1),
    "num_prompt_tokens": (drop_counts_and_prompt_lengths, 4),
}
# ``pass_config.enable_sp`` is read by vLLM's own dispatch under pipeline parallel.
EARLY_READS = {"pipeline_parallel_size": (drop_config, 4)}
#: Read where the draft counts are left in place on steps without drafts.
DRAFTING_STEP_READS = {"spec_token_ids": (drop_batch_column, 4)}


@pytest.mark.parametrize(
    "name",
    [
        *READS,
        *[
            pytest.param(
                name,
                marks=pytest.mark.skipif(
                    not release_classifies_early_in_the_worker(),
                    reason="this release's worker never classifies early: "
                    "the rule reads no parallel config",
                ),
            )
            for name in EARLY_READS
        ],
        *[
            pytest.param(
                name,
                marks=pytest.mark.skipif(
                    not release_counts_drafts_only_on_drafting_steps(),
                    reason="this release counts the rows' drafts on every step",
                ),
            )
            for name in DRAFTING_STEP_READS
        ],
    ],
)
def test_an_unreadable_input_returns_vllm_answer_and_fails_the_patch(
    name: str, applied_patch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm_graphsafe.judging import PatchState

    drop, q = {**READS, **EARLY_READS, **DRAFTING_STEP_READS}[name]
    record = DispatchRecord()
    # A decode in the first row, so that every read of the rule is reached.
    rows = decodes_plus_prefill(q)
    runner = runner_over(rows, q, record)
    drop(runner, name)

    with caplog.at_level("WARNING", logger="vllm.graphsafe"):
        run_dispatch(runner, [q] * len(rows))
        run_dispatch(runner, [q] * len(rows))

    # vLLM's own shape answer, both times: the second step no longer asks.
    assert record.uniform_decode == [True, True]
    assert applied_patch.state is PatchState.FAILED
    assert name in applied_patch.reason
    warnings = [r.getMessage() for r in caplog.records if r.name == "vllm.graphsafe"]
    assert len(warnings) == 1 and PATCH_ID in warnings[0] and name in warnings[0]
    GPUModelRunner = vllm_layout.load(vllm_layout.V1_RUNNER).GPUModelRunner

    assert isinstance(vars(GPUModelRunner)["_is_uniform_decode"], staticmethod)
    assert "_is_uniform_decode" not in runner.__dict__
