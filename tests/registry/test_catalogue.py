"""The catalogue renders each patch's declared facts; the README's tables match it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe import catalogue
from vllm_graphsafe.patches import all_patches
from vllm_graphsafe.releases import release_table

README = Path(__file__).resolve().parents[2] / "README.md"
RELEASES = Path(__file__).resolve().parents[2] / "src/vllm_graphsafe/data/releases.json"


def run_catalogue(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.catalogue", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_readme_tables_are_generated_from_the_current_data() -> None:
    result = run_catalogue("--check", str(README))
    assert result.returncode == 0, result.stderr


def test_a_stale_table_is_found_and_rewritten(tmp_path: Path) -> None:
    copy = tmp_path / "README.md"
    copy.write_text(README.read_text().replace("| applied |", "| native |", 1))

    stale = run_catalogue("--check", str(copy))
    assert stale.returncode == catalogue.EXIT_STALE
    assert "support" in stale.stderr and stale.stderr.count("\n") == 1

    assert run_catalogue("--write", str(copy)).returncode == 0
    assert copy.read_text() == README.read_text()


def test_a_document_without_markers_is_bad_input(tmp_path: Path) -> None:
    plain = tmp_path / "README.md"
    plain.write_text("# nothing generated here\n")
    result = run_catalogue("--check", str(plain))
    assert result.returncode == catalogue.EXIT_BAD_INPUT
    assert "generated:patches" in result.stderr
    assert "Traceback" not in result.stderr


def test_verified_releases_come_from_the_release_table() -> None:
    rows = json.loads(RELEASES.read_text())["rows"]
    for patch in all_patches():
        expected = tuple(
            f"{row['distribution']} {row['version']}"
            for row in rows
            if row["ci"] and patch.id in row["patches"]
        )
        assert patch.verified_on == expected
        assert expected, f"{patch.id} is verified nowhere"


def test_ci_releases_have_a_row_each() -> None:
    document = json.loads(RELEASES.read_text())
    labels = {f"{r.distribution}=={r.version}" for r in release_table() if r.ci}
    assert set(document["ci_releases"]) == labels


@pytest.mark.parametrize("patch", all_patches(), ids=lambda p: p.id)
def test_every_fact_is_declared_and_rendered(patch: object) -> None:
    from vllm_graphsafe.registry import Patch

    assert isinstance(patch, Patch)
    for fact in ("id", "title", "what", "why", "binds_to", "delete_when"):
        assert getattr(patch, fact), f"{patch.id} declares no {fact}"
    assert patch.upstream
    text = catalogue.render_text()
    assert f"{patch.id}: {patch.title}" in text
    for reference in patch.upstream:
        assert reference in text
