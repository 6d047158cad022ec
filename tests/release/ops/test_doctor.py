"""``vllm-graphsafe doctor``: fast, one sentence per bad input, documented statuses.

Doctor runs as its own process, as an operator runs it, so that the patches it
decides never reach this test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_graphsafe.cli import doctor
from vllm_graphsafe.cli.main import build_parser

_OURS = ("GRAPHSAFE_", "VLLM_GRAPHSAFE_")


def run_doctor(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    return subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.cli.main", "doctor", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def one_sentence(text: str) -> bool:
    lines = text.strip().splitlines()
    return len(lines) == 1 and "Traceback" not in text and lines[0].endswith(".")


def test_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["doctor", "--help"])
    text = capsys.readouterr().out
    assert "exit status:" in text
    for status in (
        doctor.EXIT_OK,
        doctor.EXIT_FIX_MISSING,
        doctor.EXIT_NO_VLLM,
        doctor.EXIT_BAD_STATS_DIR,
        doctor.EXIT_BAD_SETTING,
    ):
        assert f"\n  {status}  " in text


def test_default_answer_is_quick_and_quiet() -> None:
    started = time.monotonic()
    result = run_doctor()
    elapsed = time.monotonic() - started
    assert result.returncode == doctor.EXIT_OK, result.stdout + result.stderr
    assert "every fix this vLLM needs is active" in result.stdout
    # Nothing of vLLM's import-time notices (Triton, platform): vLLM is not imported.
    assert result.stderr == ""
    print(f"doctor answered in {elapsed:.1f} s")


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: (d.write_text("x"), d)[1], "is not a directory"),
        (
            lambda d: (d.mkdir(), (d / "1.json").write_text("{oops"), d)[2],
            "is not valid JSON",
        ),
        (
            lambda d: (d.mkdir(), (d / "1.json").write_text('{"rows": []}'), d)[2],
            "is not a vllm-graphsafe statistics record",
        ),
    ],
    ids=["a-file", "corrupt-json", "another-shape"],
)
def test_a_bad_stats_dir_is_one_sentence(
    tmp_path: Path, make: Callable[[Path], Path], expected: str
) -> None:
    directory = make(tmp_path / "stats")
    result = run_doctor("--stats-dir", str(directory))
    assert result.returncode == doctor.EXIT_BAD_STATS_DIR
    assert result.stdout == ""
    assert one_sentence(result.stderr) and expected in result.stderr, result.stderr


def test_bad_settings_are_named_and_change_the_status() -> None:
    result = run_doctor(
        env={"GRAPHSAFE_DISABLE": "nonsense-id", "GRAPHSAFE_STRICT": "maybe"}
    )
    assert result.returncode == doctor.EXIT_BAD_SETTING
    assert "'nonsense-id'" in result.stdout
    assert "GRAPHSAFE_STRICT='maybe'" in result.stdout
    assert "Traceback" not in result.stderr


def test_old_names_are_reported_as_deprecated() -> None:
    result = run_doctor("--json", env={"VLLM_GRAPHSAFE_DISABLE": "v1-dummy-staging"})
    report = json.loads(result.stdout)
    assert report["settings"]["deprecated"] == ["VLLM_GRAPHSAFE_DISABLE"]
    states = {patch["id"]: patch["state"] for patch in report["patches"]}
    assert states["v1-dummy-staging"] == "disabled"


def release_has_native(report: dict[str, Any]) -> list[str]:
    return [p["id"] for p in report["patches"] if p["state"] == "native"]


@pytest.fixture(scope="module")
def plain() -> dict[str, Any]:
    report: dict[str, Any] = json.loads(run_doctor("--json").stdout)
    return report


def test_disabling_a_natively_fixed_patch_reports_native_and_exits_0(
    plain: dict[str, Any],
) -> None:
    native = release_has_native(plain)
    if not native:
        pytest.skip("this vLLM has no natively fixed patch")  # 0.27.1: none native
    result = run_doctor("--json", env={"GRAPHSAFE_DISABLE": ",".join(native)})
    report = json.loads(result.stdout)
    assert release_has_native(report) == native
    assert result.returncode == doctor.EXIT_OK


def test_disable_all_keeps_native_patches_native(plain: dict[str, Any]) -> None:
    result = run_doctor("--json", env={"GRAPHSAFE_DISABLE": "all"})
    report = json.loads(result.stdout)
    for before, after in zip(plain["patches"], report["patches"], strict=True):
        expected = before["state"] if before["state"] == "native" else "disabled"
        if before["state"] == "not applicable":
            expected = "not applicable"
        assert after["state"] == expected, (before, after)


def test_the_emulator_state_is_shown_when_its_variable_is_set() -> None:
    result = run_doctor(env={"GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1"})
    assert "graph-hazard emulator: ON" in result.stdout
    assert "graph-hazard emulator" not in run_doctor().stdout


def test_the_catalogue_names_every_patch() -> None:
    from vllm_graphsafe.fixes import all_fixes

    result = run_doctor("--catalogue")
    assert result.returncode == doctor.EXIT_OK
    for fix in all_fixes():
        assert fix.id in result.stdout
        assert fix.title in result.stdout


@pytest.mark.parametrize("how", ["variable", "flag"])
def test_a_stats_dir_no_server_has_created_yet_says_so(
    tmp_path: Path, how: str
) -> None:
    # Named before the first server: the normal state, not an unreadable
    # directory, whether the variable or --stats-dir names it.
    missing = str(tmp_path / "not-yet")
    if how == "flag":
        result = run_doctor("--stats-dir", missing)
    else:
        result = run_doctor(env={"GRAPHSAFE_STATS_DIR": missing})
    assert result.returncode == doctor.EXIT_OK, result.stdout + result.stderr
    assert "No vLLM process has written statistics to" in result.stdout
    assert "not-yet" in result.stdout


def test_a_stats_dir_holding_no_statistics_says_so(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("an unrelated directory")
    result = run_doctor("--stats-dir", str(tmp_path))
    assert result.returncode == doctor.EXIT_OK, result.stdout + result.stderr
    assert f"{tmp_path} holds no vllm-graphsafe statistics" in result.stdout
    assert "0 vLLM process(es)" not in result.stdout
