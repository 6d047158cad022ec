"""The probe as a library: ``run_probe`` with typed settings, lazy imports, progress."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys

import pytest

from tests.unit.probe.fake_server import RunningFakeServer
from vllm_graphsafe.probe import ProbeSettings, errors, run_probe


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_importing_the_probe_or_the_plugin_imports_neither_httpx_nor_tqdm() -> None:
    code = (
        "import sys, vllm_graphsafe, vllm_graphsafe.probe, vllm_graphsafe.cli.probe\n"
        "import vllm_graphsafe.cli.main, vllm_graphsafe.plugin\n"
        "print(sorted({'httpx', 'tqdm'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_run_probe_returns_checks_and_report_and_prints_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with RunningFakeServer() as server:
        settings = ProbeSettings(base_url=server.url + "/v1/", decode_tokens=48)
        result = run_probe(settings)

    assert result.exit_code == errors.EXIT_OK and result.passed
    assert {check.status for check in result.checks} == {"pass"}
    assert result.report["requests_sent"] == server.log.count
    assert result.report["server"]["base_url"] == server.url
    assert capsys.readouterr() == ("", "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timeout = 1.0  # type: ignore[misc]  # frozen: this must raise


def test_run_probe_refuses_bad_settings_in_one_sentence() -> None:
    result = run_probe(ProbeSettings(base_url="http://[::1", timeout=5))

    assert result.exit_code == errors.EXIT_BAD_ARGUMENT
    assert result.error is not None and result.error.startswith("The base URL")
    assert result.checks == ()


@pytest.mark.parametrize("progress", [True, False])
def test_progress_bar_on_a_terminal_only_when_asked(progress: bool) -> None:
    terminal = Terminal()
    with RunningFakeServer() as server:
        settings = ProbeSettings(
            base_url=server.url, decode_tokens=48, progress=progress
        )
        result = run_probe(settings, progress_stream=terminal)

    assert result.exit_code == errors.EXIT_OK
    shown = terminal.getvalue()
    if progress:
        assert "probe" in shown and f"/{server.log.count}" in shown
    else:
        assert shown == ""
