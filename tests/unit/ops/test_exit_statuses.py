"""Exit statuses: one meaning per number and command, the same in ``--help``,
the README and the docs; and what ``--help`` shows of every option."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe import exit_statuses
from vllm_graphsafe.cli import backport, demo, doctor
from vllm_graphsafe.cli.main import build_parser
from vllm_graphsafe.probe import errors as probe_errors

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = (ROOT / "docs" / "commands.md",)
COMMANDS = tuple(exit_statuses.COMMANDS)


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    return dict(action.choices)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_number_has_one_meaning_per_command(command: str) -> None:
    codes = [status.code for status in exit_statuses.COMMANDS[command]]
    assert len(codes) == len(set(codes)), command
    assert 0 in codes


def test_the_demo_passes_the_probes_statuses_through_and_adds_its_own_apart() -> None:
    probe = {status.code: status.meaning for status in exit_statuses.PROBE}
    demo_statuses = {status.code: status.meaning for status in exit_statuses.DEMO}
    # Every probe status the demo can return means there what it means in the probe.
    for code, meaning in probe.items():
        assert code in demo_statuses, code
        if code not in (exit_statuses.PROBE_OK, exit_statuses.PROBE_BAD_ARGUMENT):
            assert meaning in demo_statuses[code], (code, demo_statuses[code])
    # The demo's own outcomes never borrow a probe number: a server that did not
    # become healthy is not "the probe could not reach it".
    own = (
        demo.EXIT_SERVER_FAILED,
        demo.EXIT_NO_VLLM,
        demo.EXIT_PORT_IN_USE,
        demo.EXIT_HAZARD_NOT_SHOWN,
        exit_statuses.DEMO_INSTALL_FAILED,
    )
    assert not set(own) & set(probe), sorted(set(own) & set(probe))
    assert demo.EXIT_SERVER_FAILED != probe_errors.EXIT_UNREACHABLE


def test_the_probes_numbers_are_the_ones_scripts_read() -> None:
    # Users' scripts compare against these: they never move.
    assert [code for code, _ in probe_errors.EXIT_STATUSES] == [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 130,
    ]  # fmt: skip


def test_backports_table_is_what_backport_returns() -> None:
    assert {
        backport.EXIT_OK,
        backport.EXIT_FIXES_NEEDED,
        backport.EXIT_CANNOT_BIND,
        backport.EXIT_BAD_INPUT,
        backport.EXIT_WRITE_FAILED,
        backport.EXIT_VERIFY_FAILED,
        backport.EXIT_OURS_CHANGED,
        backport.EXIT_CONFLICTS,
    } == {status.code for status in exit_statuses.BACKPORT}
    assert backport.EXIT_CANNOT_BIND == exit_statuses.BACKPORT_CANNOT_BIND
    assert backport.EXIT_BAD_INPUT == exit_statuses.BACKPORT_BAD_INPUT


def test_doctors_constants_are_the_tables() -> None:
    assert doctor.EXIT_BAD_STATS_DIR == exit_statuses.DOCTOR_BAD_STATS_DIR
    assert doctor.EXIT_NO_VLLM == exit_statuses.DOCTOR_NO_VLLM


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_the_commands_table(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_of(command, capsys)
    assert exit_statuses.help_text(command) in text
    flat = " ".join(text.split())
    for status in exit_statuses.COMMANDS[command]:
        assert f"{status.code} {' '.join(status.meaning.split())}" in flat


def test_the_docs_hold_the_current_table() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_graphsafe.catalogue",
            "--check",
            *map(str, DOCUMENTS),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for document in DOCUMENTS:
        assert exit_statuses.markdown() in document.read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_options_default(command: str) -> None:
    parser = subparsers()[command]
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if action.default in (None, False, argparse.SUPPRESS):
            continue
        assert "default" in (action.help or ""), (command, action.option_strings)
        # The default shown is the default used.
        shown = parser._get_formatter()._expand_help(action)
        default = action.default
        expected = f"{default:g}" if isinstance(default, float) else str(default)
        assert expected in shown, (command, action.option_strings, shown)


@pytest.mark.parametrize("command", ["demo", "probe"])
def test_a_json_report_path_is_shown_as_a_path(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--json JSON` says nothing of what goes there.
    text = help_of(command, capsys)
    assert "--json PATH" in text and "--json JSON" not in text


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("doctor", []),
        ("probe", ["--base-url", "http://127.0.0.1:9"]),
        ("demo", []),
    ],
)
def test_an_unknown_option_shows_the_commands_own_usage(
    command: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, *args, "--no-such-option"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: vllm-graphsafe {command} "), err
    assert f"vllm-graphsafe {command}: error: unrecognized arguments: " in err
