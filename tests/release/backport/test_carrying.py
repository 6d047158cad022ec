"""Carrying our edits in a tree: states, dropping them, the files as the user left them.

Each test edits its own copy of the installed release's ``vllm/`` package
(never the venv), as a maintainer would their fork.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.release.merge_cycle import RUNNER, backport, git, repository, states
from vllm_graphsafe.backport import FIX_IDS
from vllm_graphsafe.backport.record import record_path

V1 = "v1-phase-dispatch"


@pytest.fixture
def tree(source_tree_copy: Callable[[], Path]) -> Path:
    root = source_tree_copy()
    repository(root)
    return root


def clean(root: Path) -> str:
    """``git status`` of the tree: empty when it is as committed."""
    return git(root, "status", "--porcelain", "--untracked-files=all").stdout


def test_write_then_drop_gives_back_every_byte(tree: Path) -> None:
    assert backport(tree, "--write")["exit_status"] == 0
    assert clean(tree) != ""
    dropped = backport(tree, "--drop")
    assert dropped["exit_status"] == 0
    assert clean(tree) == "", clean(tree)
    assert not (tree / "tests").exists(), "a directory our edit made was left behind"


def test_a_line_of_ours_changed_after_the_write_is_shown_and_not_dropped(
    tree: Path,
) -> None:
    backport(tree, "--write", "--fix", V1)
    runner = tree / RUNNER
    text = runner.read_text(encoding="utf-8")
    runner.write_text(
        text.replace(
            "            uniform_decode = False\n",
            "            uniform_decode = None\n",
            1,
        ),
        encoding="utf-8",
    )
    before = clean(tree)

    report = backport(tree, "--check", "--fix", V1)
    (fix,) = report["fixes"]
    assert fix["state"] == "ours, changed"
    assert report["exit_status"] == 6
    assert any(
        "+            uniform_decode = None" in c["diff"] for c in fix["changed"]
    )

    refused = backport(tree, "--drop", "--fix", V1)
    assert refused["exit_status"] == 6
    assert clean(tree) == before, "a refused drop changed the tree"

    forced = backport(tree, "--drop", "--fix", V1, "--force")
    assert forced["exit_status"] == 0
    assert [left["file"] for left in forced["left"]] == [RUNNER]
    assert "uniform_decode = None" in runner.read_text(encoding="utf-8")
    assert not (tree / record_path(V1)).exists()


def test_drop_diff_previews_without_changing_anything(tree: Path) -> None:
    backport(tree, "--write")
    before = clean(tree)
    preview = backport(tree, "--drop", "--diff")
    assert preview["exit_status"] == 0
    assert clean(tree) == before
    assert f"deleted file mode 100644\n--- a/{record_path(V1)}" in preview["diff"]
    assert f"--- a/{RUNNER}" in preview["diff"]


def test_a_read_only_file_is_not_written_and_nothing_changes(tree: Path) -> None:
    runner = tree / RUNNER
    runner.chmod(0o444)
    try:
        report = backport(tree, "--write")
    finally:
        runner.chmod(0o644)
    assert report["exit_status"] == 4
    assert report["written"] == []
    assert clean(tree) == "", "a refused write changed the tree"


def test_modes_line_endings_and_final_newline_are_kept(tree: Path) -> None:
    runner = tree / RUNNER
    crlf = runner.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    runner.write_bytes(crlf.rstrip(b"\r\n"))  # CR LF, and no final newline
    runner.chmod(0o640)
    git(tree, "commit", "-q", "-am", "a CR LF runner")

    backport(tree, "--write")
    written = runner.read_bytes()
    assert stat.S_IMODE(runner.stat().st_mode) == 0o640
    assert written.count(b"\n") == written.count(b"\r\n"), "a line ends without CR"
    assert not written.endswith(b"\n")

    backport(tree, "--drop")
    assert clean(tree) == ""


def test_no_write_leaves_the_tree_through_a_link(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    runner = tree / RUNNER
    outside.write_bytes(runner.read_bytes())
    runner.unlink()
    os.symlink(outside, runner)
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "the runner lives elsewhere")
    before = outside.read_bytes()

    report = backport(tree, "--write", "--fix", V1)
    assert report["exit_status"] == 4
    assert outside.read_bytes() == before


# -- one JSON schema for every mode ---------------------------------------------------

FIX_KEYS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "state": str,
    "reason": str,
    "evidence": (dict, type(None)),
    "files": list,
    "tests": list,
    "changed": list,
    "gone": list,
    "verify": (dict, type(None)),
}
REPORT_KEYS: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "mode": str,
    "tree": str,
    "exit_status": int,
    "fixes": list,
    "conflicts": list,
    "written": list,
    "removed": list,
    "left": list,
    "diff": (str, type(None)),
    "patches": list,
}
STATES = {
    "needed",
    "ours",
    "ours, changed",
    "native",
    "both",
    "not applicable",
    "cannot bind",
    "target gone",
}


def conforms(report: dict[str, Any], mode: str) -> None:
    assert set(report) == set(REPORT_KEYS), sorted(report)
    for key, kind in REPORT_KEYS.items():
        assert isinstance(report[key], kind), (key, report[key])
    assert report["schema"] == "vllm-graphsafe.backport/1"
    assert report["mode"] == mode
    assert [fix["id"] for fix in report["fixes"]] == list(FIX_IDS)
    for fix in report["fixes"]:
        assert set(fix) == set(FIX_KEYS), sorted(fix)
        for key, kind in FIX_KEYS.items():
            assert isinstance(fix[key], kind), (key, fix[key])
        assert fix["state"] in STATES
        if fix["evidence"] is not None:
            assert fix["evidence"]["how"] in ("behaviour", "reading")
            assert isinstance(fix["evidence"]["text"], str)


def test_every_mode_reports_one_schema(tree: Path, tmp_path: Path) -> None:
    conforms(backport(tree, "--check"), "check")
    diff = backport(tree, "--diff")
    conforms(diff, "diff")
    assert diff["diff"]
    patches = backport(tree, "--format-patch", str(tmp_path / "patches"))
    conforms(patches, "format-patch")
    assert len(patches["patches"]) == len(
        [f for f in patches["fixes"] if f["state"] == "needed"]
    )
    written = backport(tree, "--write")
    conforms(written, "write")
    assert record_path(V1) in written["written"]
    needed = [f for f in written["fixes"] if f["state"] == "needed"]
    assert all(f["files"] and f["tests"] for f in needed)
    verified = backport(tree, "--verify")
    conforms(verified, "verify")
    for fix in verified["fixes"]:
        assert set(fix["verify"]) == {
            "ok",
            "passed",
            "failed",
            "errors",
            "skipped",
            "could_not_run",
            "rerun",
            "line",
        }
        # A Python-only tree cannot import vLLM's compiled parts: the tests
        # could not run, and the report says why and how to rerun them.
        if fix["state"] in ("needed", "ours"):
            assert fix["verify"]["could_not_run"] or fix["verify"]["passed"] is not None
            assert fix["verify"]["rerun"]
    assert set(states(backport(tree, "--check")).values()) <= {"ours", "native"}
    dropped = backport(tree, "--drop")
    conforms(dropped, "drop")
    assert record_path(V1) in dropped["removed"]
