"""The emulator's decisions without vLLM: when a step is hazardous, what it corrupts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_graphsafe.emulator.hazard import (
    EmulatorState,
    StepObservation,
    builder_prefill_rows,
    corrupted_tokens,
    dispatched_uniform_decode,
    step_prefill_rows,
)

VOCAB = 2048


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((16,), {"uniform_decode": True}, True),
        ((16,), {"uniform_decode": False}, False),
        ((16, True), {}, True),
        ((16, False, True), {}, False),
        ((16,), {}, False),  # the dispatcher's default
        ((), {"num_tokens": 4, "uniform_decode": True}, True),
    ],
)
def test_reads_the_uniform_decode_handed_to_dispatch(
    args: tuple[object, ...], kwargs: dict[str, object], expected: bool
) -> None:
    assert dispatched_uniform_decode(args, kwargs) is expected


K = 3


@pytest.mark.parametrize(
    ("width", "drafts", "computed", "prefill"),
    [
        (K + 1, None, 0, True),  # a fresh prompt of K+1 tokens
        (K + 1, None, 128, True),  # the K+1 tail of a prompt after a prefix hit
        (K + 1, None, 140, True),  # K+1 tokens re-computed after preemption
        (K + 1, (0, 0, 0), 131, False),  # a prompt tail padded with placeholders
        (K + 1, (7, 8, 9), 140, False),  # a speculative decode
        (2, (7,), 140, False),  # a decode with one draft
        (1, None, 0, True),  # a fresh one-token prompt (no speculation)
        (1, None, 64, False),  # the last token of a chunked prompt
        (1, (), 140, False),  # a decode the drafter proposed nothing for
        (K + 1, (7,), 140, True),  # more tokens than one plus its drafts
    ],
)
def test_rows_the_builders_run_as_prefills(
    width: int, drafts: tuple[int, ...] | None, computed: int, prefill: bool
) -> None:
    scheduled_drafts = {} if drafts is None else {"r": list(drafts)}
    rows = builder_prefill_rows({"r": width}, scheduled_drafts, {"r": computed})
    assert rows == (("r",) if prefill else ())


def test_prefill_rows_of_a_scheduler_output() -> None:
    output = SimpleNamespace(
        num_scheduled_tokens={"fresh": 4, "decoding": 4, "tail": 1, "resumed": 4},
        scheduled_spec_decode_tokens={"decoding": [1, 2, 3]},
        scheduled_new_reqs=[SimpleNamespace(req_id="fresh", num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["decoding", "tail", "resumed"], num_computed_tokens=[40, 64, 9]
        ),
    )
    assert step_prefill_rows(output) == ("fresh", "resumed")


def observe(
    scheduled: tuple[str, ...], uniform: bool | None, prefill_rows: tuple[str, ...]
) -> StepObservation:
    """A step as the emulator sees it when nothing stands between the dispatch
    and the graph: a uniform-decode step replays its FULL decode graph."""
    observation = StepObservation(scheduled, prefill_rows)
    if uniform is not None:
        observation.observe(uniform)
        if uniform:
            observation.replay()
    return observation


@pytest.mark.parametrize(
    ("uniform", "prefill_rows", "hazardous"),
    [
        (True, ("p",), True),  # the bug: a decode graph over a prompt chunk
        (True, (), False),  # genuine uniform decode
        (False, ("p",), False),  # prefill dispatched as prefill
        (False, (), False),
    ],
)
def test_only_uniform_decode_with_a_prompt_row_is_hazardous(
    uniform: bool, prefill_rows: tuple[str, ...], hazardous: bool
) -> None:
    state = EmulatorState()
    hazard = state.finish_step(observe(("p", "d"), uniform, prefill_rows))
    assert (hazard is not None) is hazardous
    assert state.poisoned == ({"p", "d"} if hazardous else set())
    assert state.real_steps == 1
    assert state.uniform_decode_steps == int(uniform)


def test_a_uniform_step_run_without_the_graph_is_not_hazardous() -> None:
    """Something ran the step before its replay (a guard at the graph): the
    graph never replayed over the prompt row."""
    state = EmulatorState()
    observation = StepObservation(("p", "d"), ("p",))
    observation.observe(True)
    assert state.finish_step(observation) is None
    assert state.poisoned == set()
    assert (state.real_steps, state.uniform_decode_steps) == (1, 1)


def test_a_step_that_never_reached_the_dispatcher_is_not_counted() -> None:
    state = EmulatorState()
    assert state.finish_step(observe(("p",), None, ())) is None
    assert state.real_steps == 0


def test_the_last_dispatch_of_a_step_decides() -> None:
    observation = StepObservation(("p",), ("p",))
    observation.observe(True)
    observation.observe(False)  # re-dispatched, e.g. after DP padding
    assert observation.uniform_decode is False
    assert not observation.hazardous


def test_poisoned_rows_answer_the_first_id_past_the_vocabulary() -> None:
    replaced = corrupted_tokens(
        ["a", "b", "c"], [[5, 6, 7, 8], [9], []], {"a", "c", "gone"}, VOCAB
    )
    assert replaced == [[VOCAB] * 4, [9], []]
    assert corrupted_tokens(["b"], [[9]], {"a"}, VOCAB) is None


def test_a_poisoned_request_stays_poisoned_until_it_finishes() -> None:
    state = EmulatorState()
    state.finish_step(observe(("p", "d"), True, ("p",)))
    later = state.corrupt(["p", "d", "x"], [[1], [2, 3, 4, 5], [6]], VOCAB)
    assert later == [[VOCAB], [VOCAB] * 4, [6]]
    assert state.corrupted_token_count == 5
    state.forget(["p"])
    assert state.corrupt(["p", "d"], [[1], [2]], VOCAB) == [[1], [VOCAB]]
    state.forget(["d"])
    assert state.corrupt(["p", "d"], [[1], [2]], VOCAB) is None
    assert [hazard.prefill_rows for hazard in state.hazards] == [("p",)]
