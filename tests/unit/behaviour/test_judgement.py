"""How a verdict is reached from the cases, and what it says.

The last tests run the V1 fix's real cases on a small synthetic runner (numpy
only, no vLLM): one that dispatches by shape, one fixed, and look-alikes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vllm_graphsafe.behaviour.judgement import (
    BEHAVIOUR,
    READING,
    CannotRun,
    Case,
    Evidence,
    Expect,
    Outcome,
    by_reading,
    judge_cases,
    settled,
)
from vllm_graphsafe.fixes.v1_phase_dispatch import behaviour as v1
from vllm_graphsafe.judging import Point, Verdict
from vllm_graphsafe.sources import SourceReader

OFF, ON = Expect.KEPT_OFF, Expect.KEPT_ON


def cases(*expects: Expect) -> list[Case[int]]:
    return [Case(f"case {i}", expect, i) for i, expect in enumerate(expects)]


def test_every_case_right_is_native() -> None:
    evidence = judge_cases(cases(OFF, ON), lambda c: Outcome(True, "right"))
    assert evidence.native and settled(evidence)
    assert evidence.text() == "behaviour: 2/2 cases"


def test_the_first_wrong_case_is_named() -> None:
    evidence = judge_cases(
        cases(OFF, OFF, ON), lambda c: Outcome(c.step != 1, "got the FULL decode graph")
    )
    assert not evidence.native and settled(evidence)
    assert evidence.text() == "behaviour: case 1 got the FULL decode graph; 2/3 cases"


def test_sending_every_batch_off_the_graph_is_not_the_fix() -> None:
    evidence = judge_cases(
        cases(OFF, ON, ON),
        lambda c: Outcome(c.expect is OFF, "ran without the FULL decode graph"),
    )
    assert not evidence.native
    assert evidence.failed is not None
    assert evidence.failed.startswith("every genuine decode batch lost")


def test_a_case_that_cannot_run_leaves_the_behaviour_unknown() -> None:
    def run(case: Case[int]) -> Outcome:
        if case.step == 1:
            raise CannotRun("it needs CUDA")
        return Outcome(True, "right")

    evidence = judge_cases(cases(OFF, OFF), run)
    assert not evidence.native and not settled(evidence)
    assert evidence.could_not_run == "case 1: it needs CUDA"


def test_a_wrong_case_decides_even_where_another_cannot_run() -> None:
    def run(case: Case[int]) -> Outcome:
        if case.step == 0:
            raise ValueError("boom")
        return Outcome(False, "got the FULL decode graph")

    evidence = judge_cases(cases(OFF, OFF), run)
    assert settled(evidence) and not evidence.native


def test_reading_alone_never_says_native() -> None:
    found = by_reading("the dispatch compares computed with prompt", "it raised")
    assert not found.native and found.how == READING
    assert found.text() == (
        "reading: the dispatch compares computed with prompt, but its behaviour "
        "is unconfirmed; could not run: it raised"
    )
    assert by_reading(None, "x").reading == "no fix found in the code"


@pytest.mark.parametrize(
    "evidence",
    [
        Evidence(BEHAVIOUR, passed=3, total=3),
        Evidence(BEHAVIOUR, passed=1, total=3, failed="case 1 got FULL"),
        Evidence(BEHAVIOUR, passed=3, total=3, note="the draft compiled"),
        by_reading("x", "y"),
    ],
)
def test_evidence_travels_in_kept_verdicts(evidence: Evidence) -> None:
    verdict = Verdict(
        anchor_exists=True,
        evidence=evidence,
        points=(Point("m", "C.f", "role", "C.g"), Point("m", "f", "other")),
        layout={"flag": True, "rows": [["m", "C.f"]]},
    )
    assert Verdict.from_json(verdict.to_json()) == verdict
    assert Evidence.from_json(evidence.to_json()) == evidence


def test_damaged_evidence_is_no_verdict() -> None:
    data = Verdict(True, evidence=Evidence(BEHAVIOUR, 1, 1)).to_json()
    data["evidence"]["passed"] = "one"
    assert Verdict.from_json(data) is None


# -- the V1 fix's cases on a synthetic runner ----------------------------------------

RUNNER = """
class GPUModelRunner:
    @staticmethod
    def _is_uniform_decode(
        max_num_scheduled_tokens, uniform_decode_query_len, num_tokens, num_reqs,
        force_uniform_decode=None,
    ):
        return (
            max_num_scheduled_tokens == uniform_decode_query_len
            and num_tokens == max_num_scheduled_tokens * num_reqs
        )

    def _determine_batch_execution_and_padding(
        self, num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens,
        force_uniform_decode=None,
    ):
        uniform_decode = self._is_uniform_decode(
            max_num_scheduled_tokens, self.uniform_decode_query_len, num_tokens,
            num_reqs, force_uniform_decode,
        )
        {CHECK}
        mode, descriptor = self.cudagraph_dispatcher.dispatch(
            num_tokens=num_tokens, uniform_decode=uniform_decode
        )
        return mode, descriptor
"""
COMPLETE = """
        if uniform_decode and force_uniform_decode is None:
            batch = self.input_batch
            k = self.uniform_decode_query_len - 1
            uniform_decode = bool(
                (batch.num_computed_tokens_cpu[:num_reqs]
                 >= batch.num_prompt_tokens[:num_reqs]).all()
            ) and all(len(batch.spec_token_ids[i]) == k for i in range(num_reqs))
"""
REVERSED = COMPLETE.replace(">= batch.num_prompt_tokens", "< batch.num_prompt_tokens")
PROMPT_ONLY = COMPLETE.replace(
    ") and all(len(batch.spec_token_ids[i]) == k for i in range(num_reqs))", ")"
)


def judged(tmp_path: Path, check: str) -> Evidence:
    runner = tmp_path / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    runner.parent.mkdir(parents=True)
    for package in ("vllm", "vllm/v1", "vllm/v1/worker"):
        (tmp_path / package / "__init__.py").write_text("")
    code = textwrap.dedent(RUNNER).replace(
        "        {CHECK}\n", textwrap.indent(textwrap.dedent(check), " " * 8)
    )
    runner.write_text(code)
    return v1.judge_source(SourceReader(root=tmp_path))


def test_a_shape_only_dispatch_is_needed(tmp_path: Path) -> None:
    evidence = judged(tmp_path, "pass\n")
    assert not evidence.native and settled(evidence)
    assert evidence.failed == "a fresh 1-token prompt (K=0) got the FULL decode graph"


def test_a_complete_phase_check_is_native(tmp_path: Path) -> None:
    evidence = judged(tmp_path, COMPLETE)
    assert evidence.native, evidence.text()
    assert evidence.total == len(v1.cases())


def test_a_reversed_comparison_is_needed(tmp_path: Path) -> None:
    evidence = judged(tmp_path, REVERSED)
    assert not evidence.native and settled(evidence)


def test_prompt_lengths_alone_miss_a_recompute_after_preemption(tmp_path: Path) -> None:
    evidence = judged(tmp_path, PROMPT_ONLY)
    assert evidence.failed == (
        "2 output tokens recomputed after preemption (K=1) got the FULL decode graph"
    )
