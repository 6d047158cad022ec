"""The first reported case and long prompts are in the plan where the server allows.

Expected lengths are the report's own numbers (an 804-token prompt with 800-token
blocks and K = 3; 88,804 and 99,204-token prompts), not values read back from
the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.probe.fake_server import FakeConfig
from tests.unit.probe.test_probe_fake_server import probe_fake
from vllm_graphsafe.probe import errors
from vllm_graphsafe.probe.plan import ProbePlan, make_plan, with_long_prompts

REPORTED_LONG = (88_804, 99_204)
MAX_TOKENS = 24


def reported_plan(max_model_len: int | None, max_requests: int = 200) -> ProbePlan:
    plan = make_plan(3, 800, None, 2, needs_vocab_probe=True)
    return with_long_prompts(plan, 3, 800, max_model_len, MAX_TOKENS, max_requests)


def test_a_large_server_gets_the_first_reported_case_and_the_long_prompts() -> None:
    plan = reported_plan(max_model_len=131_072)

    assert plan.boundary_lengths == (4, 804, 1604, *REPORTED_LONG)
    first_block = plan.boundaries[1]
    assert "the case first reported" in first_block.label
    assert first_block.controls == (803, 805)
    assert plan.long_lengths == REPORTED_LONG
    assert {(804, 804), (804, 1604), REPORTED_LONG} <= set(plan.groups)
    assert plan.decode_inserts == (4, 804, 1604, 88_804)
    # 4 discovery + 11 lengths cold and warm + 6 same-length, 4 mixed and the
    # long pair together + solo and perturbed decode with 4 inserts.
    assert plan.request_count == 4 + 22 + (6 + 4 + 2) + (2 + 4)


@pytest.mark.parametrize("max_model_len", [4096, 32_768, 99_204 + MAX_TOKENS - 1, None])
def test_a_smaller_server_or_unknown_limit_gets_no_long_prompts(
    max_model_len: int | None,
) -> None:
    plan = reported_plan(max_model_len)

    assert plan.long_lengths == ()
    assert 804 in plan.boundary_lengths
    assert any("88,804" in note and "99,204" in note for note in plan.notes)


def test_the_long_prompts_fit_exactly_at_the_limit() -> None:
    assert reported_plan(99_204 + MAX_TOKENS).long_lengths == REPORTED_LONG


def test_long_prompts_stay_out_when_the_request_budget_cannot_hold_them() -> None:
    plan = reported_plan(131_072, max_requests=4 + 22 + 12 + 6 - 1)

    assert plan.long_lengths == ()
    assert any("--max-requests" in note for note in plan.notes)


@pytest.mark.parametrize(
    ("num_speculative_tokens", "block_size", "expected"),
    [
        (3, 16, (88_804, 99_204)),
        (1, 800, (88_802, 99_202)),
        # 88,800 is 1387.5 blocks of 64: rounded up to 1388 blocks.
        (3, 64, (1388 * 64 + 4, 1550 * 64 + 4)),
    ],
)
def test_long_prompts_sit_on_block_boundaries_of_the_server(
    num_speculative_tokens: int, block_size: int, expected: tuple[int, int]
) -> None:
    plan = make_plan(num_speculative_tokens, block_size, None, 2, True)
    plan = with_long_prompts(
        plan, num_speculative_tokens, block_size, 131_072, MAX_TOKENS, 200
    )

    assert plan.long_lengths == expected


def test_long_prompts_are_sent_and_checked_on_a_large_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(max_model_len=131_072, oov_lengths=frozenset({88_804}))
    result, server = probe_fake(capsys, tmp_path, config, "--block-size", "800")

    assert result.status == errors.EXIT_CHECK_FAILED
    assert result.failures() == {("vocab", (88_804,)), ("controls", (88_804,))}
    sent = server.log.completion_prompt_lengths
    assert sent.count(88_804) == 2 + 1 + 1  # cold, warm, with 99,204, in the decode
    assert sent.count(99_204) == 2 + 1
    assert sent.count(804) >= 2


def test_no_long_prompts_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(max_model_len=131_072)
    result, server = probe_fake(
        capsys, tmp_path, config, "--block-size", "800", "--no-long-prompts"
    )

    assert result.status == errors.EXIT_OK
    assert max(server.log.completion_prompt_lengths) < 2000
