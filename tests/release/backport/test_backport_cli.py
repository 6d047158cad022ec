"""``vllm-graphsafe backport`` on a copy of the installed vLLM release.

What a maintainer sees: which fixes the tree needs (by the plugin's own
detection), a diff that ``git apply`` accepts, edits after which the tree reads
as having each fix natively, patches ``git am`` applies, and for a tree that
lacks what a fix edits, that fix named and nothing of it changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.backport_trees import REPO
from tests.support.backport_checks import find_ruff, new_findings, ruff_findings
from vllm_graphsafe.backport import FIX_IDS, detect
from vllm_graphsafe.cli.main import main
from vllm_graphsafe.judging import PatchState

RUNNER = "vllm/v1/worker/gpu_model_runner.py"


def backport(tree: Path, *args: str) -> int:
    return main(["backport", "--tree", str(tree), *args])


def needed_by_detection(tree: Path) -> set[str]:
    """What the plugin would hook on this tree: the fixes it lacks."""
    states = detect(tree)
    return {
        fix
        for fix in FIX_IDS
        if states[fix].state in (PatchState.APPLIED, PatchState.FAILED)
    }


def tree_digest(tree: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(tree.rglob("*.py")):
        digest.update(str(path.relative_to(tree)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_check_names_what_the_tree_needs(
    pristine_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needed = needed_by_detection(pristine_tree)
    before = tree_digest(pristine_tree)

    status = backport(pristine_tree, "--check")

    reported = capsys.readouterr().err
    assert status == (1 if needed else 0)
    for fix in FIX_IDS:
        word = "needed" if fix in needed else "native|not applicable"
        assert any(
            line.startswith(f"{fix}: ") and line.split(": ")[1].split(" (")[0] in word
            for line in reported.splitlines()
        ), reported
    assert tree_digest(pristine_tree) == before


def test_diff_applies_with_git_apply_at_the_tree_root(
    pristine_tree: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not needed_by_detection(pristine_tree):
        pytest.skip("this release needs none of the fixes")
    assert backport(pristine_tree, "--diff") == 0
    diff = capsys.readouterr().out
    patch = tmp_path / "backport.diff"
    patch.write_text(diff)

    applied = git(pristine_tree, "apply", "--check", str(patch))

    assert applied.returncode == 0, applied.stderr
    assert "--- a/" + RUNNER in diff or "mrv2" in diff


def test_write_then_check_reads_native(
    pristine_tree: Path, tree_copy: Callable[[], Path]
) -> None:
    needed = needed_by_detection(pristine_tree)
    tree = tree_copy()

    assert backport(tree, "--write") == 0

    assert backport(tree, "--check") == 0
    states = detect(tree)
    assert {fix: states[fix].state for fix in needed} == dict.fromkeys(
        needed, PatchState.NATIVE
    )
    for fix in needed:
        written = tree / "tests/v1/worker" / f"test_graphsafe_backport_{fix}.py"
        assert written.with_name(written.name.replace("-", "_")).is_file()


def test_a_missing_symbol_changes_nothing_for_that_fix(
    pristine_tree: Path,
    tree_copy: Callable[[], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "v1-phase-dispatch" not in needed_by_detection(pristine_tree):
        pytest.skip("this release has the V1 dispatch fix")
    tree = tree_copy()
    runner = tree / RUNNER
    # A fork that renamed the shape rule: its definition is gone.
    runner.write_text(
        runner.read_text().replace("def _is_uniform_decode(", "def _shape_rule(")
    )
    before = tree_digest(tree)

    status = backport(tree, "--fix", "v1-phase-dispatch", "--write")

    assert status == 2
    assert "GPUModelRunner._is_uniform_decode" in capsys.readouterr().err
    assert tree_digest(tree) == before

    assert backport(tree, "--write") == 2
    edited = runner.read_text()
    assert "_has_prefill_request" not in edited
    if "v1-dummy-staging" in needed_by_detection(pristine_tree):
        assert "_stage_dummy_request_metadata" in edited


def test_edits_land_where_a_fork_moved_the_code(
    pristine_tree: Path, tree_copy: Callable[[], Path], tmp_path: Path
) -> None:
    needed = needed_by_detection(pristine_tree)
    if not needed:
        pytest.skip("this release needs none of the fixes")
    tree = tree_copy()
    runner = tree / RUNNER
    drift = "".join(f"# fork note {i}\n" for i in range(37))
    runner.write_text(drift + runner.read_text())

    assert backport(tree, "--write") == 0

    states = detect(tree)
    assert all(states[fix].state is PatchState.NATIVE for fix in needed)
    assert runner.read_text().startswith(drift)


def test_ruff_with_vllms_rules_finds_nothing_new(
    pristine_tree: Path, tree_copy: Callable[[], Path]
) -> None:
    ruff = find_ruff(REPO)
    if ruff is None:
        pytest.skip("no ruff executable (the tools venv is not installed)")
    tree = tree_copy()
    assert backport(tree, "--write") in (0, 2)
    changed = [
        path.relative_to(tree).as_posix()
        for path in tree.rglob("*.py")
        if path.is_file()
        and (
            not (pristine_tree / path.relative_to(tree)).exists()
            or path.read_bytes()
            != (pristine_tree / path.relative_to(tree)).read_bytes()
        )
    ]

    added = new_findings(
        ruff_findings(ruff, pristine_tree, changed), ruff_findings(ruff, tree, changed)
    )

    assert added == []


def test_format_patch_writes_one_git_am_patch_per_fix(
    pristine_tree: Path, tree_copy: Callable[[], Path], tmp_path: Path
) -> None:
    needed = needed_by_detection(pristine_tree)
    if not needed:
        pytest.skip("this release needs none of the fixes")
    written = tree_copy()
    assert backport(written, "--write") == 0
    outdir = tmp_path / "patches"
    assert backport(pristine_tree, "--format-patch", str(outdir)) == 0
    patches = sorted(outdir.glob("*.patch"))
    assert [p.name.split("-", 1)[1].removesuffix(".patch") for p in patches] == [
        fix for fix in FIX_IDS if fix in needed
    ]
    # A small repository with the files the patches touch, as the release has them.
    repo = tmp_path / "repo"
    touched = {
        line.removeprefix("+++ b/")
        for patch in patches
        for line in patch.read_text().splitlines()
        if line.startswith("+++ b/")
    }
    for relpath in touched:
        source = pristine_tree / relpath
        if source.exists():
            (repo / relpath).parent.mkdir(parents=True, exist_ok=True)
            (repo / relpath).write_bytes(source.read_bytes())
    repo.mkdir(exist_ok=True)
    assert git(repo, "init", "-q").returncode == 0
    git(repo, "add", "-A")
    assert git(repo, "commit", "-q", "-m", "release").returncode == 0

    applied = git(repo, "am", *map(str, patches))

    assert applied.returncode == 0, applied.stderr
    log = git(repo, "log", "--format=%B", "-n", str(len(patches))).stdout
    assert "Upstream references:" in log and "Testing:" in log
    for relpath in touched:
        assert (repo / relpath).read_text() == (written / relpath).read_text()


@pytest.mark.parametrize(
    ("arguments", "status"),
    [
        (["--check"], 3),
        (["--check", "--fix", "no-such-fix"], 3),
        ([], 3),
    ],
)
def test_bad_input_is_one_sentence_and_status_3(
    tmp_path: Path,
    pristine_tree: Path,
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    status: int,
) -> None:
    tree = tmp_path if arguments == ["--check"] else pristine_tree

    assert backport(tree, *arguments) == status

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("."), err
    assert "Traceback" not in err[0]


def test_format_patch_into_a_file_is_refused(
    pristine_tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "not-a-directory"
    target.write_text("")

    assert backport(pristine_tree, "--format-patch", str(target)) == 3

    assert "is not a directory" in capsys.readouterr().err
