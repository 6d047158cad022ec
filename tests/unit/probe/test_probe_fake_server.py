"""``vllm-graphsafe probe`` against a loopback fake of vLLM's OpenAI server."""

from __future__ import annotations

import argparse
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.unit.probe.fake_server import FakeConfig, RunningFakeServer
from vllm_graphsafe.cli import probe as cli_probe
from vllm_graphsafe.probe import answers, checks, errors, settings
from vllm_graphsafe.probe import plan as probe_plan

# K=3, block 16: boundaries 4, 20, 36 and controls 3, 5, 19, 21, 35, 37.
DEFAULT_PLAN_REQUESTS = 37
BOUNDARIES = (4, 20, 36)


@dataclass
class ProbeRun:
    status: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None

    def failures(self) -> set[tuple[str, tuple[int, ...]]]:
        assert self.report is not None
        return {
            (check["name"], tuple(check["lengths"]))
            for check in self.report["checks"]
            if check["status"] == "fail"
        }

    def statuses(self, name: str) -> dict[tuple[int, ...], str]:
        assert self.report is not None
        return {
            tuple(check["lengths"]): check["status"]
            for check in self.report["checks"]
            if check["name"] == name
        }


def run_probe(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    base_url: str,
    *extra: str,
    with_report: bool = True,
) -> ProbeRun:
    parser = argparse.ArgumentParser()
    cli_probe.add_arguments(parser)
    report_path = tmp_path / "report.json"
    argv = ["--base-url", base_url, "--decode-tokens", "48", "--timeout", "5"]
    if with_report:
        argv += ["--json", str(report_path)]
    status = cli_probe.run(parser.parse_args([*argv, *extra]))
    captured = capsys.readouterr()
    report = None
    if with_report and report_path.exists():
        report = json.loads(report_path.read_text())
    return ProbeRun(status, captured.out, captured.err, report)


def probe_fake(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    config: FakeConfig | None = None,
    *extra: str,
) -> tuple[ProbeRun, RunningFakeServer]:
    with RunningFakeServer(config) as server:
        result = run_probe(capsys, tmp_path, server.url, *extra)
    return result, server


def assert_one_sentence(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].endswith("."), stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr


# --------------------------------------------------------------- healthy servers


def test_healthy_server_passes_every_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path)

    assert result.status == errors.EXIT_OK, result.stdout + result.stderr
    assert result.stderr == ""
    assert result.report is not None
    assert {c["name"] for c in result.report["checks"]} == set(checks.CHECK_NAMES)
    assert all(c["status"] == "pass" for c in result.report["checks"])
    assert result.report["server"]["vocab_size"] == 1000
    assert result.report["server"]["model"] == "fake/hybrid-tiny"
    assert result.report["exit_status"] == 0
    assert result.report["requests_sent"] == server.log.count == DEFAULT_PLAN_REQUESTS
    assert [b["length"] for b in result.report["plan"]["boundaries"]] == [4, 20, 36]
    # Every solo prompt has exactly the planned token length.
    assert set(server.log.completion_prompt_lengths) >= {3, 4, 5, 19, 20, 21, 35, 36}
    header = result.stdout.splitlines()[0].split()
    assert header == ["check", "length", "result", "detail"]
    assert "probe passed" in result.stdout


def test_repetition_shared_with_controls_is_not_a_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(repeat_everywhere=True))

    assert result.status == errors.EXIT_OK, result.stdout
    assert set(result.statuses("repetition").values()) == {"pass"}
    assert set(result.statuses("controls").values()) == {"pass"}


def test_a_check_that_could_not_run_makes_the_probe_incomplete_never_passed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The server does not state its vocabulary size: the vocab check cannot run.
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(states_vocab_size=False))

    assert result.status == errors.EXIT_INCOMPLETE
    assert set(result.statuses("vocab").values()) == {"skip"}
    assert "passed" not in result.stdout + result.stderr
    assert "probe INCOMPLETE" in result.stdout
    assert_one_sentence(result.stderr, "The vocab check could not run", "--vocab-size")
    assert result.report is not None
    assert result.report["server"]["vocab_size"] is None
    assert result.report["exit_status"] == errors.EXIT_INCOMPLETE
    assert result.report["not_run"] == [result.stderr.strip()]
    assert not any(c["passed"] for c in result.report["checks"] if c["name"] == "vocab")


def test_quiet_shows_the_checks_that_could_not_run_and_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(states_vocab_size=False)
    result, _ = probe_fake(capsys, tmp_path, config, "--quiet")

    assert result.status == errors.EXIT_INCOMPLETE
    rows = result.stdout.splitlines()[1:-1]
    assert rows and all(row.split()[0] == "vocab" for row in rows), result.stdout
    assert all("NOT RUN" in row for row in rows)
    assert "passed" not in result.stdout + result.stderr
    assert_one_sentence(result.stderr, "vocab", "could not run")


def test_a_decode_that_would_end_at_once_still_meets_every_inserted_prompt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 16 tokens at 0.5 ms each end long before one inserted prompt (50 ms) is
    # answered: the probe must keep the decode streaming until all three are.
    config = FakeConfig(stream_token_delay_s=0.0005, answer_delay_s=0.05)
    result, server = probe_fake(capsys, tmp_path, config, "--decode-tokens", "16")

    assert result.status == errors.EXIT_OK, result.stdout + result.stderr
    # The server's own account: every boundary prompt inserted into the decode
    # arrived while the decode was streaming and was answered before it stopped.
    inside = [length for length, inside in server.log.inside_a_stream if inside]
    assert sorted(inside) == list(BOUNDARIES)
    assert result.report is not None
    (decode_check,) = [
        c for c in result.report["checks"] if c["name"] == "ongoing_decode"
    ]
    assert decode_check["status"] == "pass"
    assert (
        "3 of 3 boundary prompts were answered while it ran" in decode_check["detail"]
    )
    decodes = [s for s in result.report["samples"] if s["phase"].startswith("decode")]
    assert len({len(s["token_ids"]) for s in decodes}) == 1
    assert len(decodes[0]["token_ids"]) >= 16


def test_a_decode_the_context_cannot_stretch_makes_the_probe_incomplete(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # max_model_len 70 leaves the decode 38 tokens, streamed at once: it ends
    # long before the first inserted prompt (0.1 s) is answered, and nothing can
    # lengthen it.
    config = FakeConfig(max_model_len=70, stream_token_delay_s=0.0, answer_delay_s=0.1)
    result, server = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_INCOMPLETE, result.stdout + result.stderr
    assert not any(inside for _, inside in server.log.inside_a_stream)
    assert set(result.statuses("ongoing_decode").values()) == {"skip"}
    assert "passed" not in result.stdout + result.stderr
    assert_one_sentence(
        result.stderr,
        "The ongoing_decode check could not run",
        "limit of 38 tokens",
        "max_model_len 70",
        "in each of 3 tries",
    )


def test_a_decode_that_ran_out_before_any_answer_is_tried_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The first decode (38 tokens at once) ends before the slow first answer; a
    # loaded server catches up: during the second decode answers come at once.
    config = FakeConfig(
        max_model_len=70,
        stream_token_delay_s=0.002,
        answer_delay_s=0.2,
        slow_answers_for_streams=1,
    )
    result, server = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_OK, result.stdout + result.stderr
    assert set(result.statuses("ongoing_decode").values()) == {"pass"}
    assert any(inside for _, inside in server.log.inside_a_stream)


def test_vocab_size_option_skips_the_discovery_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path, None, "--vocab-size", "1000")

    assert result.status == errors.EXIT_OK
    assert server.log.count == DEFAULT_PLAN_REQUESTS - 1
    assert result.report is not None
    assert result.report["server"]["vocab_size_source"] == "--vocab-size"


def test_server_without_chat_template_gets_a_plain_prompt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path, FakeConfig(chat_template=False))

    assert result.status == errors.EXIT_OK
    assert result.report is not None
    assert result.report["server"]["instruction_source"].startswith("plain prompt")
    assert server.log.count == DEFAULT_PLAN_REQUESTS + 1


def test_answers_without_token_ids_fall_back_to_tokenizing_the_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path, FakeConfig(omit_token_ids=True))

    assert result.status == errors.EXIT_OK, result.stdout + result.stderr
    assert ("POST", "/tokenize") in server.log.requests[4:]


def test_json_to_stdout_is_valid_json_and_the_table_moves_to_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with RunningFakeServer() as server:
        result = run_probe(
            capsys, tmp_path, server.url, "--json", "-", with_report=False
        )

    assert result.status == errors.EXIT_OK
    report = json.loads(result.stdout)
    assert report["exit_status"] == 0
    assert report["summary"]["fail"] == 0
    assert report["plan"]["planned_requests"] == DEFAULT_PLAN_REQUESTS
    assert "cold_warm" in result.stderr


def test_groups_of_three_and_a_chunk_boundary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(
        capsys, tmp_path, None, "--concurrency", "3", "--chunk-size", "24"
    )

    assert result.status == errors.EXIT_OK
    assert result.report is not None
    groups = result.report["plan"]["concurrent_groups"]
    assert [4, 4, 4] in groups and [4, 20, 28] in groups
    assert 28 in [b["length"] for b in result.report["plan"]["boundaries"]]


def test_lengths_past_max_model_len_are_skipped_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Blocks of 64: boundaries 4, 68 and 132; 132 + 24 new tokens exceed 120.
    config = FakeConfig(max_model_len=120)
    result, _ = probe_fake(capsys, tmp_path, config, "--block-size", "64")

    assert result.status == errors.EXIT_OK, result.stdout + result.stderr
    assert result.report is not None
    assert [b["length"] for b in result.report["plan"]["boundaries"]] == [4, 68]
    assert any("132" in note for note in result.report["plan"]["notes"])


# --------------------------------------------------------------- corrupt servers


@pytest.mark.parametrize(
    ("block_size", "boundary"), [(16, 4), (800, 804)], ids=["K+1", "block+K+1"]
)
def test_out_of_vocabulary_ids_at_a_boundary_fail_vocab_and_controls(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, block_size: int, boundary: int
) -> None:
    config = FakeConfig(oov_lengths=frozenset({boundary}))
    result, _ = probe_fake(capsys, tmp_path, config, "--block-size", str(block_size))

    assert result.status == errors.EXIT_CHECK_FAILED
    assert result.failures() == {("vocab", (boundary,)), ("controls", (boundary,))}
    assert "probe FAILED" in result.stdout
    assert result.report is not None
    assert result.report["exit_status"] == errors.EXIT_CHECK_FAILED


def test_repetition_only_at_boundaries_fails_repetition_and_controls(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(repeat_lengths=frozenset(BOUNDARIES))
    result, _ = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_CHECK_FAILED
    expected = {("repetition", (n,)) for n in BOUNDARIES}
    expected |= {("controls", (n,)) for n in BOUNDARIES}
    assert result.failures() == expected


def test_warm_answer_that_differs_from_cold_fails_cold_warm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(cold_warm_lengths=frozenset({20}))
    result, _ = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_CHECK_FAILED
    assert ("cold_warm", (20,)) in result.failures()
    assert {name for name, _ in result.failures()} <= {"cold_warm", "concurrent"}
    assert result.statuses("cold_warm")[(4,)] == "pass"


def test_answers_corrupted_by_overlap_fail_concurrent_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(corrupt_overlapping=True, overlap_window_s=0.02)
    result, _ = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_CHECK_FAILED
    assert {name for name, _ in result.failures()} == {"concurrent"}
    assert ("concurrent", (4, 4)) in result.failures()
    assert result.statuses("ongoing_decode") != {}


def test_decode_perturbed_by_inserted_prompts_fails_ongoing_decode(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(perturb_streams=True))

    assert result.status == errors.EXIT_CHECK_FAILED
    assert {name for name, _ in result.failures()} == {"ongoing_decode"}


# ------------------------------------------------------------------ error paths


def test_missing_tokenize_endpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(tokenize_missing=True))

    assert result.status == errors.EXIT_NO_TOKENIZE
    assert_one_sentence(result.stderr, "/tokenize", "404")
    assert result.stdout == ""
    assert result.report is not None
    assert result.report["error"] == result.stderr.strip()
    assert result.report["exit_status"] == errors.EXIT_NO_TOKENIZE


def test_http_500_on_completions(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(completion_status=500))

    assert result.status == errors.EXIT_HTTP_ERROR
    assert_one_sentence(result.stderr, "HTTP 500", "/v1/completions", "EngineCore")


def test_hung_completions_time_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    result, _ = probe_fake(
        capsys, tmp_path, FakeConfig(completion_hang_s=10), "--timeout", "0.3"
    )

    assert result.status == errors.EXIT_TIMEOUT
    assert_one_sentence(result.stderr, "/v1/completions", "0.3 seconds")
    assert time.monotonic() - started < 3


def test_model_mismatch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result, server = probe_fake(capsys, tmp_path, None, "--model", "other/model")

    assert result.status == errors.EXIT_MODEL_MISMATCH
    assert_one_sentence(result.stderr, "Model mismatch", "fake/hybrid-tiny")
    assert server.log.count == 1


def test_matching_model_is_accepted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(capsys, tmp_path, None, "--model", "fake/hybrid-tiny")

    assert result.status == errors.EXIT_OK


def test_unreachable_server(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_probe(capsys, tmp_path, f"http://127.0.0.1:{port}")

    assert result.status == errors.EXIT_UNREACHABLE
    assert_one_sentence(result.stderr, "connection refused")


@pytest.mark.parametrize(
    "arguments",
    [
        ("--num-speculative-tokens", "0"),
        ("--concurrency", "1"),
        ("--timeout", "0"),
        ("--block-size", "-4"),
    ],
)
def test_bad_arguments(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, arguments: tuple[str, str]
) -> None:
    result = run_probe(capsys, tmp_path, "http://127.0.0.1:9", *arguments)

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, arguments[0])


def test_base_url_without_scheme_is_a_bad_argument(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = run_probe(capsys, tmp_path, "localhost:8000")

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, "--base-url")


# -------------------------------------------------------------- request budget


def test_plan_larger_than_max_requests_sends_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path, None, "--max-requests", "10")

    assert result.status == errors.EXIT_REQUEST_BUDGET
    assert_one_sentence(result.stderr, str(DEFAULT_PLAN_REQUESTS), "10")
    assert server.log.count == 0


def test_plan_that_fits_exactly_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    limit = str(DEFAULT_PLAN_REQUESTS)
    result, server = probe_fake(capsys, tmp_path, None, "--max-requests", limit)

    assert result.status == errors.EXIT_OK
    assert server.log.count == DEFAULT_PLAN_REQUESTS


def test_unplanned_requests_stop_at_max_requests(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = FakeConfig(omit_token_ids=True)
    limit = DEFAULT_PLAN_REQUESTS + 5
    result, server = probe_fake(capsys, tmp_path, config, "--max-requests", str(limit))

    assert result.status == errors.EXIT_REQUEST_BUDGET
    assert_one_sentence(result.stderr, f"--max-requests {limit}")
    assert server.log.count == limit
    assert result.report is not None
    assert result.report["requests_sent"] == limit


# ---------------------------------------------------------------- pure helpers


def test_prompts_have_exactly_the_requested_length() -> None:
    instruction = [1, 2, 50, 51, 52, 53, 3, 4, 5]
    for length in range(1, 40):
        prompt = probe_plan.build_prompt(instruction, 99, length)
        assert len(prompt) == length
        assert prompt[-min(length, 4) :] == instruction[-min(length, 4) :]
    assert probe_plan.build_prompt(instruction, 99, 12) == [
        1,
        2,
        50,
        51,
        52,
        99,
        99,
        99,
        53,
        3,
        4,
        5,
    ]
    assert probe_plan.build_prompt(instruction, 99, 3) == [3, 4, 5]


def test_plan_covers_boundaries_controls_and_merges_equal_offsets() -> None:
    plan = probe_plan.make_plan(3, 800, 800, 2, needs_vocab_probe=True)

    assert plan.boundary_lengths == (4, 804, 1604)
    assert plan.solo_lengths == (3, 4, 5, 803, 804, 805, 1603, 1604, 1605)
    assert "chunk 800" in plan.boundaries[1].label
    assert plan.groups[:3] == ((4, 4), (804, 804), (1604, 1604))
    assert plan.request_count == 4 + 18 + 10 + 5

    tiny = probe_plan.make_plan(1, 16, None, 2, needs_vocab_probe=False)
    assert tiny.boundaries[0].controls == (1, 3)
    single = probe_plan.make_plan(1, 1, None, 2, needs_vocab_probe=False)
    assert single.boundaries[0].controls == (1, 3)


def test_degenerate_repetition_needs_a_long_enough_run() -> None:
    short = checks.Completion((7,) * 11, "x")
    long_tokens = checks.Completion((1, 2) + (7,) * 12, "x")
    long_text = checks.Completion((1, 2, 3), "ok" + "!" * 12)

    assert checks.degenerate_repetition(short) is None
    assert checks.degenerate_repetition(long_tokens) == "token 7 repeated 12 times"
    assert checks.degenerate_repetition(long_text) == "'!' repeated 12 times"


def test_repetition_and_controls_checks_compare_with_controls() -> None:
    garbage = checks.Completion((5,) * 20, "!" * 20)
    fine = checks.Completion(tuple(range(20)), "fine")

    failing = checks.check_repetition(4, [garbage], {3: [fine], 5: [fine]})
    shared = checks.check_repetition(4, [garbage], {3: [garbage], 5: [fine]})
    assert failing.status == checks.FAIL and "controls 3, 5" in failing.detail
    assert shared.status == checks.PASS

    oov = checks.Completion((1, 5000), "x")
    controls = checks.check_controls(4, [oov], {3: [fine]}, vocab_size=1000)
    assert controls.status == checks.FAIL
    assert "out-of-vocabulary" in controls.detail
    unknown_vocab = checks.check_controls(4, [oov], {3: [fine]}, vocab_size=None)
    assert unknown_vocab.status == checks.PASS


def test_cold_warm_and_vocab_checks() -> None:
    cold = checks.Completion((1, 2, 3), "abc")
    warm = checks.Completion((1, 9, 3), "a?c")
    assert checks.check_cold_warm(4, cold, cold).status == checks.PASS
    mismatch = checks.check_cold_warm(4, cold, warm)
    assert mismatch.status == checks.FAIL and "token 1: 2 vs 9" in mismatch.detail

    samples = [checks.Sample(4, "cold", cold), checks.Sample(4, "warm", warm)]
    assert checks.check_vocab((4,), samples, 9).status == checks.FAIL
    assert checks.check_vocab((4,), samples, 10).status == checks.PASS
    assert checks.check_vocab((4,), samples, None).status == checks.SKIP


def test_ongoing_decode_check() -> None:
    counting = checks.Completion((1, 2), " 11 12 13 14 15 16")
    other = checks.Completion((1, 3), " 11 12 13 14 15 17")
    assert checks.continues_counting(counting.text)
    assert not checks.continues_counting("OK OK")
    passed = checks.check_ongoing_decode((12,), counting, counting, 3, 3)
    assert passed.status == checks.PASS and "continues counting" in passed.detail
    assert "3 of 3" in passed.detail
    failed = checks.check_ongoing_decode((12,), counting, other, 3, 3)
    assert failed.status == checks.FAIL
    not_run = checks.check_ongoing_decode((12,), counting, counting, 0, 3, "why")
    assert (not_run.status, not_run.detail) == (checks.SKIP, "why")
    # The stream is cut mid-way: its text may lag its ids; the ids decide.
    cut = checks.Completion((1, 2), " 11 12 13 14 15")
    assert checks.check_ongoing_decode((12,), counting, cut, 1, 3).status == "pass"


def test_each_reason_a_check_could_not_run_is_one_sentence() -> None:
    results = [
        checks.CheckResult("vocab", (3,), checks.SKIP, "size unknown; pass --x"),
        checks.CheckResult("vocab", (4,), checks.SKIP, "size unknown; pass --x"),
        checks.CheckResult("vocab", (5,), checks.PASS, "fine"),
        checks.CheckResult("ongoing_decode", (), checks.SKIP, "it ended early"),
    ]
    assert checks.not_run_sentences(results) == [
        "The vocab check could not run for lengths 3, 4: size unknown; pass --x.",
        "The ongoing_decode check could not run: it ended early.",
    ]
    assert cli_probe.summary_line(results) == (
        "probe INCOMPLETE: 3 of 4 checks could not run; none failed"
    )
    failing = [*results, checks.CheckResult("cold_warm", (4,), checks.FAIL, "x")]
    assert cli_probe.summary_line(failing) == (
        "probe FAILED: 1 of 5 checks failed, 3 could not run"
    )
    assert cli_probe.summary_line(results[2:3]) == "probe passed: all 1 checks passed"


def test_server_answer_parsing() -> None:
    assert answers.token_ids_of({"token_ids": [1, 2]}) == [1, 2]
    logprobs = {"logprobs": {"tokens": ["token_id:7", "token_id:8"]}}
    assert answers.token_ids_of(logprobs) == [7, 8]
    assert answers.token_ids_of({"text": "hi"}) is None
    message = "token_id(s) [2147483647] in logit_bias ... Vocabulary size: 151936"
    assert answers.vocab_size_from_message(message) == 151936
    assert answers.vocab_size_from_message("bad request") is None
    body = json.dumps({"error": {"message": "boom\n  again"}}).encode()
    assert answers.error_detail(body) == "boom again"
    assert settings.normalize_base_url("http://h:8000/v1/") == "http://h:8000"
