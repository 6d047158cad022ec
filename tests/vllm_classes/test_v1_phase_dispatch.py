"""The V1 runner's real dispatch decision, on phase-ambiguous batches.

Each case states the batch's rows; the expected classification is derived from
them: uniform decode iff the shape is uniform at the decode width and no row
is still in prefill. On a vLLM without the fix (negative control:
``VLLM_GRAPHSAFE_DISABLE=all``) every prefill case fails.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.vllm_classes.v1_runner import (
    DispatchRecord,
    Row,
    UntouchableBatch,
    input_batch,
    make_runner,
    run_dispatch,
)

SPEC_TOKENS = [0, 1, 2, 3, 4, 6, 7, 15]


def fresh_prompt(q: int) -> list[Row]:
    return [Row(prompt=q, computed=0, scheduled=q)]


def equal_fresh_prompts(q: int) -> list[Row]:
    return [Row(prompt=q, computed=0, scheduled=q) for _ in range(3)]


def chunked_tail(q: int) -> list[Row]:
    return [Row(prompt=512 + q, computed=512, scheduled=q)]


def prefix_cache_hit(q: int) -> list[Row]:
    return [Row(prompt=64 + q, computed=64, scheduled=q)]


def decodes_plus_prefill(q: int) -> list[Row]:
    decodes = [Row(prompt=20, computed=20 + 9 * i, scheduled=q) for i in range(3)]
    return [*decodes, Row(prompt=q, computed=0, scheduled=q)]


def prefill_between_decodes(q: int) -> list[Row]:
    return [
        Row(prompt=30, computed=41, scheduled=q),
        Row(prompt=100 + q, computed=100, scheduled=q),
        Row(prompt=7, computed=12, scheduled=q),
    ]


def all_decode(q: int) -> list[Row]:
    return [Row(prompt=10 + i, computed=25 + 3 * i, scheduled=q) for i in range(4)]


def just_finished_prompts(q: int) -> list[Row]:
    return [Row(prompt=40, computed=40, scheduled=q) for _ in range(2)]


def optimistic_async_decode(q: int) -> list[Row]:
    return [Row(prompt=16, computed=16 + 2 * q + 5, scheduled=q) for _ in range(2)]


PREFILL_CASES: dict[str, Callable[[int], list[Row]]] = {
    "fresh_prompt": fresh_prompt,
    "equal_fresh_prompts": equal_fresh_prompts,
    "chunked_tail": chunked_tail,
    "prefix_cache_hit": prefix_cache_hit,
    "decodes_plus_prefill": decodes_plus_prefill,
    "prefill_between_decodes": prefill_between_decodes,
}
DECODE_CASES: dict[str, Callable[[int], list[Row]]] = {
    "all_decode": all_decode,
    "just_finished_prompts": just_finished_prompts,
    "optimistic_async_decode": optimistic_async_decode,
}
CASES = {**PREFILL_CASES, **DECODE_CASES}
PATCH_ID = "v1-phase-dispatch"


def case_params(names: list[str]) -> list[object]:
    """Prefill cases are regressions of the fix; decode cases guard FULL graphs."""
    return [
        pytest.param(name, marks=pytest.mark.regression(PATCH_ID))
        if name in PREFILL_CASES
        else name
        for name in names
    ]


def expected_uniform_decode(rows: list[Row], decode_query_len: int) -> bool:
    same_width = all(row.scheduled == decode_query_len for row in rows)
    return same_width and not any(row.in_prefill for row in rows)


@pytest.mark.parametrize("case", case_params(sorted(CASES)))
@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_real_step_classification(case: str, spec_tokens: int) -> None:
    q = spec_tokens + 1
    rows = CASES[case](q)
    record = DispatchRecord()
    runner = make_runner(q, input_batch(rows), record)

    run_dispatch(runner, [row.scheduled for row in rows])

    assert record.uniform_decode == [expected_uniform_decode(rows, q)]


@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_stale_rows_past_the_batch_are_ignored(spec_tokens: int) -> None:
    q = spec_tokens + 1
    rows = all_decode(q)
    stale = [Row(prompt=300, computed=0, scheduled=0)]
    record = DispatchRecord()
    runner = make_runner(q, input_batch(rows, stale_rows=stale), record)

    run_dispatch(runner, [row.scheduled for row in rows])

    assert record.uniform_decode == [True]


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_consecutive_steps_read_the_batch_as_it_is_now(spec_tokens: int) -> None:
    """One runner, same batch size each step: rows change in place, then the batch."""
    q = spec_tokens + 1
    rows = all_decode(q)
    batch = input_batch(rows)
    record = DispatchRecord()
    runner = make_runner(q, batch, record)
    expected = []

    def step() -> None:
        run_dispatch(runner, [row.scheduled for row in rows])
        expected.append(expected_uniform_decode(rows, q))

    step()
    # A finished request's row is reused, in place, by a fresh prompt.
    rows[2] = Row(prompt=q, computed=0, scheduled=q)
    batch.num_computed_tokens_cpu[2], batch.num_prompt_tokens[2] = 0, q
    step()
    # Its prompt computed: the same arrays describe a decode batch again.
    rows[2] = Row(prompt=q, computed=q, scheduled=q)
    batch.num_computed_tokens_cpu[2] = q
    step()
    # The runner gets a new input batch (new arrays) with a prompt in row 0.
    rows[0] = Row(prompt=64 + q, computed=64, scheduled=q)
    runner.input_batch = input_batch(rows)
    step()

    assert expected == [True, False, True, False]
    assert record.uniform_decode == expected


@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("spec_tokens", SPEC_TOKENS)
def test_dummy_and_capture_runs_keep_their_classification(
    spec_tokens: int, forced: bool
) -> None:
    q = spec_tokens + 1
    rows = equal_fresh_prompts(q)
    record = DispatchRecord()
    runner = make_runner(q, input_batch(rows), record)

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
    "case", case_params(["fresh_prompt", "decodes_plus_prefill", "all_decode"])
)
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_dp_sync_receives_the_phase_aware_classification(
    case: str, spec_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.v1.worker.gpu_model_runner as runner_module

    q = spec_tokens + 1
    rows = CASES[case](q)
    record = DispatchRecord()

    def coordinate_batch_across_dp(**kwargs: object) -> tuple[bool, None, int]:
        record.dp_uniform_decode.append(bool(kwargs["uniform_decode"]))
        return False, None, int(kwargs["cudagraph_mode"])  # type: ignore[call-overload]

    monkeypatch.setattr(
        runner_module, "coordinate_batch_across_dp", coordinate_batch_across_dp
    )
    runner = make_runner(q, input_batch(rows), record, dp_size=2)

    run_dispatch(runner, [row.scheduled for row in rows])

    assert record.dp_uniform_decode == [expected_uniform_decode(rows, q)]


def release_classifies_early_in_the_worker() -> bool:
    """0.20-0.31: pipeline + sequence parallel classify from the worker, early."""
    from vllm_graphsafe.registry import SourceReader

    worker = SourceReader().function(
        "vllm.v1.worker.gpu_worker", "Worker.execute_model"
    )
    return "_determine_batch_execution_and_padding(" in (worker or "")


def test_pipeline_plus_sequence_parallel_never_decides_from_stale_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = fresh_prompt(4)
    record = DispatchRecord()
    runner = make_runner(4, input_batch(rows), record)
    runner.parallel_config.pipeline_parallel_size = 2
    runner.compilation_config.pass_config.enable_sp = True

    with caplog.at_level("WARNING", logger="vllm.graphsafe"):
        run_dispatch(runner, [4])
        run_dispatch(runner, [4])

    if release_classifies_early_in_the_worker():
        # Refused with one clear warning: vLLM's own rule, as unpatched.
        assert record.uniform_decode == [True, True]
        refusals = [r for r in caplog.records if "inactive" in r.getMessage()]
        assert len(refusals) == 1
        assert "sequence parallelism" in refusals[0].getMessage()
    else:
        assert record.uniform_decode == [False, False]


def test_a_shape_rule_that_is_not_the_static_one_is_refused() -> None:
    """A release whose rule became a runner method, or the hook itself, is not bound."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_graphsafe.patches.v1_phase_dispatch import bind_phase_aware_shape_rule

    def as_a_method(
        self: object,
        max_num_scheduled_tokens: int,
        uniform_decode_query_len: int,
        num_tokens: int,
        num_reqs: int,
        force_uniform_decode: bool | None = None,
    ) -> bool:
        return False

    with pytest.raises(TypeError, match="static"):
        bind_phase_aware_shape_rule(as_a_method)
    rule = GPUModelRunner.__dict__["_is_uniform_decode"]
    vllm_rule = getattr(rule, "__func__", rule)
    hooked = bind_phase_aware_shape_rule(getattr(vllm_rule, "__wrapped__", vllm_rule))
    with pytest.raises(TypeError, match="static"):
        bind_phase_aware_shape_rule(hooked)
