"""The demo's before/after lines, from answers built by hand."""

from __future__ import annotations

from vllm_graphsafe.emulator.demo import BoundaryAnswer, render

VOCAB = 2048


def answer(label: str, first: list[int], second: list[int]) -> BoundaryAnswer:
    return BoundaryAnswer(
        label=label,
        prompt_tokens=132,
        block_size=128,
        num_speculative_tokens=3,
        vocab_size=VOCAB,
        first=tuple(first),
        second=tuple(second),
        second_text="",
    )


def test_before_is_garbage_after_is_clean() -> None:
    before = answer("plugin disabled", [7, 8, 9], [VOCAB] * 3)
    after = answer("plugin enabled", [7, 8, 9], [7, 8, 9])
    assert before.garbage and before.out_of_vocab == 3
    assert not after.garbage
    lines = render(before, after)
    assert "emulated" in lines[0] and "no CUDA graphs" in lines[0]
    assert "132 tokens" in lines[1] and "128-token block" in lines[1]
    assert "plugin disabled: GARBAGE: 3 of 3 ids are past" in lines[2]
    assert f"[{VOCAB}, {VOCAB}, {VOCAB}]" in lines[3]
    assert "plugin enabled: clean" in lines[4]
    assert len(lines) == 6


def test_a_cached_answer_that_differs_is_garbage_too() -> None:
    changed = answer("plugin disabled", [7, 8, 9], [7, 5, 9])
    assert changed.garbage and changed.out_of_vocab == 0
    assert "differs from the first" in render(changed, changed)[2]
