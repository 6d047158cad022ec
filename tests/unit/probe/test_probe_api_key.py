"""The probe's API key: from the option or the environment, never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.probe.fake_server import FakeConfig
from tests.unit.probe.test_probe_fake_server import (
    ProbeRun,
    assert_one_sentence,
    probe_fake,
)
from vllm_graphsafe.cli.main import build_parser
from vllm_graphsafe.probe import ProbeResult, ProbeSettings, errors
from vllm_graphsafe.probe.checks import CheckResult
from vllm_graphsafe.probe.run import redact

KEY = "sk-graphsafe-7d41c0ffee"
WRONG = "sk-wrong-0000"


@pytest.fixture(autouse=True)
def _no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def everything_shown(result: ProbeRun, tmp_path: Path) -> str:
    report = tmp_path / "report.json"
    return (
        result.stdout + result.stderr + (report.read_text() if report.exists() else "")
    )


@pytest.mark.parametrize(
    ("environment", "option"),
    [
        ({"VLLM_API_KEY": KEY}, None),
        ({"OPENAI_API_KEY": KEY}, None),
        ({"VLLM_API_KEY": KEY, "OPENAI_API_KEY": WRONG}, None),
        ({"VLLM_API_KEY": WRONG}, KEY),
    ],
    ids=["vllm-variable", "openai-variable", "vllm-first", "option-first"],
)
def test_the_key_reaches_a_protected_server_and_is_never_shown(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    option: str | None,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    extra = ("--api-key", option) if option else ()

    result, _ = probe_fake(capsys, tmp_path, FakeConfig(api_key=KEY), *extra)

    assert result.status == errors.EXIT_OK, result.stderr
    assert result.report is not None and result.report["settings"]["api_key_sent"]
    assert KEY not in everything_shown(result, tmp_path)


def test_no_key_for_a_protected_server_is_one_sentence_and_its_own_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result, server = probe_fake(capsys, tmp_path, FakeConfig(api_key=KEY))

    assert result.status == errors.EXIT_API_KEY
    assert result.status not in (errors.EXIT_CHECK_FAILED, errors.EXIT_HTTP_ERROR)
    assert_one_sentence(result.stderr, "The server wants an API key: set VLLM_API_KEY")
    assert server.log.count == 1


def test_a_refused_key_is_one_sentence_and_not_shown(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", WRONG)
    result, _ = probe_fake(capsys, tmp_path, FakeConfig(api_key=KEY))

    assert result.status == errors.EXIT_API_KEY
    assert_one_sentence(result.stderr, "refused the API key", "VLLM_API_KEY")
    assert WRONG not in everything_shown(result, tmp_path)


def test_a_key_echoed_by_the_server_is_redacted(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    config = FakeConfig(api_key=KEY, completion_status=500, echo_authorization=True)
    result, _ = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_HTTP_ERROR
    assert_one_sentence(result.stderr, "HTTP 500", "<api key>")
    assert KEY not in everything_shown(result, tmp_path)


def test_each_string_is_redacted_once(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A key inside the marker: a second redaction would turn the echoed key's
    # "<api key>" into "<<api key>>".
    key = "api key"
    monkeypatch.setenv("VLLM_API_KEY", key)
    config = FakeConfig(api_key=key, completion_status=500, echo_authorization=True)
    result, _ = probe_fake(capsys, tmp_path, config)

    assert result.status == errors.EXIT_HTTP_ERROR
    assert_one_sentence(result.stderr, "(request had Bearer <api key>)")
    assert result.report is not None
    assert result.report["error"] == result.stderr.strip()
    assert "<<" not in everything_shown(result, tmp_path)


def test_a_result_is_redacted_everywhere_and_keeps_its_types() -> None:
    check = CheckResult("vocab", (4, 5), "fail", f"answer quotes {KEY}")
    result = ProbeResult(
        exit_code=errors.EXIT_CHECK_FAILED,
        checks=(check,),
        report={"checks": [{"detail": f"answer quotes {KEY}"}], "lengths": (4,)},
        error=f"ended on {KEY}",
        late_errors=(f"late {KEY}",),
    )

    redacted = redact(result, KEY)

    assert KEY not in repr(redacted)
    assert redacted.checks == (
        CheckResult("vocab", (4, 5), "fail", "answer quotes <api key>"),
    )
    assert redacted.report["lengths"] == (4,)
    assert redacted.error == "ended on <api key>"
    assert redacted.late_errors == ("late <api key>",)
    assert KEY in repr(result)


def test_settings_never_show_the_key() -> None:
    settings = ProbeSettings(base_url="http://127.0.0.1:8000", api_key=KEY)

    assert KEY not in repr(settings)
    assert KEY not in str(settings.to_json())


def test_help_names_the_environment_as_the_safer_place(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["probe", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())

    assert "$VLLM_API_KEY, else $OPENAI_API_KEY" in help_text
    assert "The environment is the safer place" in help_text
