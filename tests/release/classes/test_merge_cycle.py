"""Carrying the fixes through upstream merges, on the installed release's tree.

write -> ``ours``; merge of an upstream-style fix that rewrites the lines
just above our edit -> ``both``; ``--drop`` -> ``native`` with the tree equal
to upstream's branch (``git diff`` empty, no file left behind); a merge that
conflicts inside an edited function is named file by file; a merge that
removes the V1 runner (as vLLM 0.34 does) -> ``target gone``, and ``--drop``
removes what is left of ours.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.release import v1_runner
from tests.release.merge_cycle import (
    RUNNER,
    backport,
    git,
    repository,
    states,
    upstream_fix,
    v1_runner_removed,
)
from tests.release.native_variants import after_shape_rule
from vllm_graphsafe.backport import FIX_IDS

V1 = "v1-phase-dispatch"
needs_v1_runner = pytest.mark.skipif(not v1_runner.installed(), reason=v1_runner.ABSENT)


def merge_cycle(root: Path) -> None:
    repository(root)
    pristine = states(backport(root, "--check"))
    needed = {fix for fix, state in pristine.items() if state == "needed"}
    assert V1 in needed

    git(root, "checkout", "-q", "-b", "upstream")
    runner = root / RUNNER
    runner.write_text(
        upstream_fix(runner.read_text(encoding="utf-8")), encoding="utf-8"
    )
    git(root, "commit", "-q", "-am", "upstream: phase-aware uniform decode")
    assert states(backport(root, "--check"))[V1] == "native"

    git(root, "checkout", "-q", "main")
    git(root, "checkout", "-q", "-b", "ours")
    written = backport(root, "--write")
    assert written["exit_status"] == 0, written
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "carry vllm-graphsafe's fixes")
    carried = backport(root, "--check")
    assert carried["exit_status"] == 0
    assert {f: s for f, s in states(carried).items() if f in needed} == dict.fromkeys(
        needed, "ours"
    )

    merged = git(root, "merge", "-q", "--no-edit", "upstream", check=False)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    after_merge = backport(root, "--check")
    assert states(after_merge)[V1] == "both", after_merge
    assert after_merge["exit_status"] == 1  # something to do: drop ours

    dropped = backport(root, "--drop")
    assert dropped["exit_status"] == 0, dropped
    assert states(backport(root, "--check"))[V1] == "native"
    assert git(root, "status", "--porcelain").stdout.strip() != ""
    git(root, "add", "-A")
    diff = git(root, "diff", "--cached", "upstream", "--stat").stdout
    assert diff == "", f"the tree differs from upstream's after --drop:\n{diff}"


def conflicting_merge(root: Path) -> None:
    repository(root)
    git(root, "checkout", "-q", "-b", "upstream")
    runner = root / RUNNER
    # Upstream adds a line where our edit goes in the dispatch.
    text = after_shape_rule(
        runner.read_text(encoding="utf-8"), "uniform_decode = bool(uniform_decode)\n"
    )
    runner.write_text(text, encoding="utf-8")
    git(root, "commit", "-q", "-am", "upstream touches the dispatch")
    git(root, "checkout", "-q", "main")
    git(root, "checkout", "-q", "-b", "ours")
    backport(root, "--write", "--fix", V1)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "ours")
    merged = git(root, "merge", "-q", "--no-edit", "upstream", check=False)
    assert merged.returncode != 0, "the merge was meant to conflict"
    report = backport(root, "--check")
    assert report["exit_status"] == 7
    assert report["conflicts"] == [RUNNER]


@pytest.fixture
def repo(source_tree_copy: Callable[[], Path]) -> Path:
    return source_tree_copy()


@needs_v1_runner
def test_write_merge_upstream_drop(repo: Path) -> None:
    merge_cycle(repo)


@needs_v1_runner
def test_a_merge_conflict_inside_our_edit_is_named(repo: Path) -> None:
    conflicting_merge(repo)


@needs_v1_runner
def test_upstream_removes_the_v1_runner(repo: Path) -> None:
    v1_runner_removed(repo)


def test_every_fix_is_reported(repo: Path) -> None:
    assert [fix["id"] for fix in backport(repo, "--check")["fixes"]] == list(FIX_IDS)
