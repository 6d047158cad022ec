"""The emulator's decisions without vLLM: when a step is hazardous, what it corrupts."""

from __future__ import annotations

import pytest

from vllm_graphsafe.emulator.hazard import (
    EmulatorState,
    StepObservation,
    corrupted_tokens,
    dispatched_uniform_decode,
    rows_in_prompt,
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


def test_a_row_is_in_its_prompt_until_it_has_computed_all_of_it() -> None:
    req_ids = ["fresh", "tail", "done", "decoding", None]
    computed = [0, 128, 132, 140, 0]
    prompt = [4, 132, 132, 132, 9]
    assert rows_in_prompt(req_ids, computed, prompt) == ("fresh", "tail")


def observe(
    scheduled: tuple[str, ...], uniform: bool | None, in_prompt: tuple[str, ...]
) -> StepObservation:
    observation = StepObservation(scheduled)
    if uniform is not None:
        observation.observe(uniform, in_prompt)
    return observation


@pytest.mark.parametrize(
    ("uniform", "in_prompt", "hazardous"),
    [
        (True, ("p",), True),  # the bug: a decode graph over a prompt chunk
        (True, (), False),  # genuine uniform decode
        (False, ("p",), False),  # prefill dispatched as prefill
        (False, (), False),
    ],
)
def test_only_uniform_decode_with_a_prompt_row_is_hazardous(
    uniform: bool, in_prompt: tuple[str, ...], hazardous: bool
) -> None:
    state = EmulatorState()
    hazard = state.finish_step(observe(("p", "d"), uniform, in_prompt))
    assert (hazard is not None) is hazardous
    assert state.poisoned == ({"p", "d"} if hazardous else set())
    assert state.real_steps == 1
    assert state.uniform_decode_steps == int(uniform)


def test_a_step_that_never_reached_the_dispatcher_is_not_counted() -> None:
    state = EmulatorState()
    assert state.finish_step(observe(("p",), None, ())) is None
    assert state.real_steps == 0


def test_the_last_dispatch_of_a_step_decides() -> None:
    observation = StepObservation(("p",))
    observation.observe(True, ("p",))
    observation.observe(False, ("p",))  # re-dispatched, e.g. after DP padding
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
    assert [hazard.in_prompt for hazard in state.hazards] == [("p",)]
