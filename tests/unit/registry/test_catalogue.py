"""The catalogue renders each patch's declared facts; the documents' tables match it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_graphsafe import catalogue
from vllm_graphsafe.fixes import Fix, all_fixes
from vllm_graphsafe.releases import release_table, verified_releases

README = Path(__file__).resolve().parents[3] / "README.md"
FIXES_PAGE = README.parent / "docs" / "fixes.md"
RELEASES = Path(__file__).resolve().parents[3] / "src/vllm_graphsafe/data/releases.json"


def run_catalogue(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.catalogue", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_document_tables_are_generated_from_the_current_data() -> None:
    commands = README.parent / "docs" / "commands.md"
    result = run_catalogue("--check", str(README), str(FIXES_PAGE), str(commands))
    assert result.returncode == 0, result.stderr


def test_each_hooks_module_is_headed_by_its_fixs_current_facts() -> None:
    """vllm-ascend's patch catalogue style: what, why, upstream, removal, at the
    top of the code that patches, made from the facts declared once."""
    files = catalogue.hooks_modules()
    assert len(files) == len(all_fixes())
    for fix, path in zip(all_fixes(), files, strict=True):
        assert path.read_text().startswith(f"# <!-- generated:facts:{fix.id} -->\n")
    result = run_catalogue("--check")
    assert result.returncode == 0, result.stderr


def test_the_support_table_is_on_the_front_page_and_the_patch_table_in_docs() -> None:
    assert catalogue.holds_block(README.read_text(), "support")
    assert not catalogue.holds_block(README.read_text(), "patches")
    assert catalogue.holds_block(FIXES_PAGE.read_text(), "patches")


def test_a_stale_table_is_found_and_rewritten(tmp_path: Path) -> None:
    copy = tmp_path / "README.md"
    copy.write_text(README.read_text().replace("| applied |", "| native |", 1))

    stale = run_catalogue("--check", str(copy))
    assert stale.returncode == catalogue.EXIT_STALE
    assert "support" in stale.stderr and stale.stderr.count("\n") == 1

    assert run_catalogue("--write", str(copy)).returncode == 0
    assert copy.read_text() == README.read_text()


def test_each_stale_document_is_named_and_both_are_rewritten(tmp_path: Path) -> None:
    readme, fixes = tmp_path / "README.md", tmp_path / "fixes.md"
    readme.write_text(README.read_text().replace("| applied |", "| native |", 1))
    fixes.write_text(FIXES_PAGE.read_text().replace("| `v1-", "| `v9-", 1))

    stale = run_catalogue("--check", str(readme), str(fixes))
    assert stale.returncode == catalogue.EXIT_STALE
    assert f"{readme}: the generated support table(s)" in stale.stderr
    assert f"{fixes}: the generated patches table(s)" in stale.stderr

    assert run_catalogue("--write", str(readme), str(fixes)).returncode == 0
    assert readme.read_text() == README.read_text()
    assert fixes.read_text() == FIXES_PAGE.read_text()


def test_a_document_without_markers_is_bad_input(tmp_path: Path) -> None:
    plain = tmp_path / "README.md"
    plain.write_text("# nothing generated here\n")
    result = run_catalogue("--check", str(plain))
    assert result.returncode == catalogue.EXIT_BAD_INPUT
    assert "generated:patches" in result.stderr
    assert "Traceback" not in result.stderr


def _count(text: str, word: str) -> int:
    match = re.search(rf"(\d+) {word}", text)
    return int(match.group(1)) if match else -1


def _sweep_passed(row: dict[str, Any], patch_id: str) -> bool:
    class_tests = row.get("class_tests", "")
    return bool(
        row.get("installed", False)
        and row["patches"].get(patch_id) in {"applied", "native", "not applicable"}
        and _count(class_tests, "passed") > 0
        and _count(class_tests, "failed") == 0
        and "error" not in class_tests
        and row.get("negative_controls") == "all failed"
    )


def test_verified_releases_come_from_the_release_table() -> None:
    rows = json.loads(RELEASES.read_text())["rows"]
    for fix in all_fixes():
        expected = tuple(
            f"{row['distribution']} {row['version']}"
            for row in rows
            if row["patches"].get(fix.id, "not applicable") != "not applicable"
            and (row["ci"] or _sweep_passed(row, fix.id))
        )
        assert verified_releases(fix.id) == expected
        assert expected, f"{fix.id} is verified nowhere"


def test_a_failing_sweep_row_verifies_nothing() -> None:
    from vllm_graphsafe.releases import ReleaseRow, sweep_verified

    def row(**raw: Any) -> ReleaseRow:
        base: dict[str, Any] = {
            "installed": True,
            "class_tests": "478 passed, 0 failed, 4 skipped",
            "negative_controls": "all failed",
            "patches": {"p": "applied"},
        }
        base.update(raw)
        return ReleaseRow("vllm", "0.0.0", dict(base["patches"]), False, base)

    assert sweep_verified(row(), "p")
    assert not sweep_verified(row(class_tests="210 passed, 268 failed, 4 skipped"), "p")
    assert not sweep_verified(row(patches={"p": "failed"}), "p")
    assert not sweep_verified(row(negative_controls="v1 control: 2 of 4"), "p")
    assert not sweep_verified(row(installed=False), "p")


def test_ci_releases_have_a_row_each() -> None:
    document = json.loads(RELEASES.read_text())
    labels = {f"{r.distribution}=={r.version}" for r in release_table() if r.ci}
    assert set(document["ci_releases"]) == labels


@pytest.mark.parametrize("fix", all_fixes(), ids=lambda f: f.id)
def test_every_fact_is_declared_and_rendered(fix: Fix) -> None:
    for fact in ("id", "title", "what", "why", "binds_to", "delete_when", "absent"):
        assert getattr(fix, fact), f"{fix.id} declares no {fact}"
    assert fix.upstream
    text = catalogue.render_text()
    assert f"{fix.id}: {fix.title}" in text
    for reference in fix.upstream:
        assert reference in text
