"""Every bad input to ``vllm-graphsafe probe``: one sentence, a documented status.

Nothing is sent to the server when an argument is wrong, and no traceback shows.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.unit.probe.fake_server import FakeConfig, RunningFakeServer
from tests.unit.probe.test_probe_fake_server import (
    assert_one_sentence,
    probe_fake,
    run_probe,
)
from vllm_graphsafe.cli.main import build_parser
from vllm_graphsafe.probe import errors


@pytest.mark.parametrize(
    ("base_url", "reason"),
    [
        ("http://[::1", "no closing ']'"),
        ("http://", "names no host"),
        ("http://127.0.0.1:99999", "port must be a number from 1 to 65535"),
        ("http://127.0.0.1:abc", "port must be a number from 1 to 65535"),
        ("http://local host:8000", "'local host' is not a host name"),
        ("ftp://127.0.0.1:8000", "http:// or https://"),
    ],
)
def test_invalid_base_url_is_a_usage_error_in_one_sentence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, base_url: str, reason: str
) -> None:
    result = run_probe(capsys, tmp_path, base_url)

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert result.status != errors.EXIT_CHECK_FAILED
    assert_one_sentence(result.stderr, "The base URL", "is not valid", reason)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert result.report is None


def test_credentials_in_the_base_url_are_refused_without_echoing_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = run_probe(capsys, tmp_path, "http://probe:s3cret-word@127.0.0.1:8000")

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, "VLLM_API_KEY")
    assert "s3cret-word" not in result.stderr


@pytest.mark.parametrize("timeout", ["inf", "1e400", "-1", "nan", "1e300"])
def test_timeout_that_is_not_a_usable_number_of_seconds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, timeout: str
) -> None:
    with RunningFakeServer() as server:
        result = run_probe(capsys, tmp_path, server.url, "--timeout", timeout)

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, "--timeout", "above 0")
    assert server.log.count == 0


def test_plain_web_server_is_not_a_vllm_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path, FakeConfig(plain_web_server=True))

    assert result.status == errors.EXIT_BAD_RESPONSE
    assert_one_sentence(
        result.stderr, "is not a vLLM server", "HTTP 404", "'404 Not Found'"
    )
    assert "<" not in result.stderr
    assert server.log.count == 1


@pytest.mark.parametrize("where", ["/no/dir/x", "a directory"])
def test_unwritable_json_path_is_refused_before_any_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    path = str(tmp_path) if where == "a directory" else where
    with RunningFakeServer() as server:
        result = run_probe(
            capsys, tmp_path, server.url, "--json", path, with_report=False
        )

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, f"Cannot write the JSON report to {path}")
    assert server.log.count == 0


def test_a_report_that_cannot_be_written_after_the_checks_is_one_sentence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # /dev/full accepts the open and refuses the write: the checks run, and pass.
    with RunningFakeServer() as server:
        result = run_probe(
            capsys, tmp_path, server.url, "--json", "/dev/full", with_report=False
        )

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(
        result.stderr, "Cannot write the JSON report to /dev/full", "No space left"
    )
    assert "probe passed" in result.stdout


@pytest.mark.parametrize(
    "content",
    [
        [1, 2, 3],
        {"pid": 1, "counts": ["v1-phase-dispatch"]},
        {"pid": 1, "counts": {"v1-phase-dispatch": {"uniform_decode": "many"}}},
        {"pid": 1, "patches": {"v1-phase-dispatch": ["applied"]}},
    ],
    ids=["list", "counts-list", "count-text", "state-list"],
)
def test_statistics_of_another_shape_are_refused_before_any_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: object
) -> None:
    stats_dir = tmp_path / "stats"
    stats_dir.mkdir()
    (stats_dir / "1.json").write_text(json.dumps(content))

    result, server = probe_fake(capsys, tmp_path, None, "--stats-dir", str(stats_dir))

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, str(stats_dir), "statistics")
    assert "Traceback" not in result.stderr
    assert server.log.count == 0


def test_missing_statistics_directory_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    result, server = probe_fake(capsys, tmp_path, None, "--stats-dir", str(missing))

    assert result.status == errors.EXIT_BAD_ARGUMENT
    assert_one_sentence(result.stderr, str(missing), "does not exist")
    assert server.log.count == 0


def test_server_that_drops_the_connection(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(drop_completions=True))

    assert result.status == errors.EXIT_UNREACHABLE
    assert_one_sentence(result.stderr, "dropped the connection", "/v1/completions")


def test_help_documents_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["probe", "--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())

    codes = [code for code, _ in errors.EXIT_STATUSES]
    assert len(set(codes)) == len(codes)
    assert {errors.EXIT_OK, errors.EXIT_CHECK_FAILED, errors.EXIT_API_KEY} <= set(codes)
    for code, meaning in errors.EXIT_STATUSES:
        assert f"{code} {meaning}" in help_text


def test_ctrl_c_ends_the_probe_in_one_sentence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Ctrl-C while the probe waits on a completion that hangs far longer than
    # a loaded machine could delay the signal (and than the probe's timeout).
    main_thread = threading.main_thread().ident
    assert main_thread is not None
    probe_thread: int = main_thread
    with RunningFakeServer(FakeConfig(completion_hang_s=120)) as server:

        def interrupt_once_waiting() -> None:
            if server.fake.completion_arrived.wait(60):
                time.sleep(0.2)
                signal.pthread_kill(probe_thread, signal.SIGINT)

        interrupter = threading.Thread(target=interrupt_once_waiting, daemon=True)
        interrupter.start()
        result = run_probe(
            capsys, tmp_path, server.url, "--timeout", "90", with_report=False
        )
        interrupter.join(timeout=1)

    assert result.status == errors.EXIT_INTERRUPTED
    assert_one_sentence(result.stderr, "Interrupted")
