"""The rewrites and look-alikes judged on a real fork's tree (1Cat-vLLM).

The fork's tree is unpacked from ``../shared/forks`` (beside the project; a
user's clone has none, and the tests say so). Nothing of it is imported: the
judgement compiles its code from source, as ``backport --check`` does.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tests.backport_trees import REPO
from tests.release.classes.test_merge_cycle import conflicting_merge, merge_cycle
from tests.release.classes.test_merge_neighbours import (
    our_own_lines_changed,
    upstream_next_to_ours,
)
from tests.release.classes.test_native_by_behaviour import applicable, check
from tests.release.merge_cycle import Carrying, carrying, v1_runner_removed
from tests.release.native_variants import ALL_VARIANTS, Variant
from tests.release.neighbours import NEIGHBOURS, REMOVALS

FORK_DIR = REPO.parent / "shared" / "forks" / "1cat-vllm-ae13773a"
FORK = next(iter(sorted(FORK_DIR.glob("*.tar.gz"))), FORK_DIR / "absent")

needs_fork = pytest.mark.skipif(
    not FORK.is_file(),
    reason=f"no fork tree in {FORK_DIR} (only beside the project's CI)",
)


@pytest.fixture(scope="module")
def fork_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fork")
    with tarfile.open(FORK) as archive:
        archive.extractall(root, filter="data")
    return root


def fork_variants() -> list[Variant]:
    """The fork is based on 0.22: it lacks upstream's MRV2 fix."""
    return [v for v in ALL_VARIANTS if v.tree in (None, "needed")]


@needs_fork
@pytest.mark.parametrize("variant", fork_variants(), ids=lambda v: v.id)
def test_each_variant_on_the_fork(variant: Variant, fork_root: Path) -> None:
    assert [v.id for v in applicable(fork_root)] == [v.id for v in fork_variants()]
    check(variant, fork_root)


@pytest.fixture
def fork_repo(tmp_path: Path) -> Path:
    with tarfile.open(FORK) as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path


@needs_fork
def test_the_merge_cycle_on_the_fork(fork_repo: Path) -> None:
    """write -> ours; upstream's fix merged -> both; drop -> native, the tree
    equal to upstream's branch."""
    merge_cycle(fork_repo)


@needs_fork
def test_a_merge_conflict_on_the_fork_is_named(fork_repo: Path) -> None:
    conflicting_merge(fork_repo)


@needs_fork
def test_the_v1_runner_removed_on_the_fork(fork_repo: Path) -> None:
    v1_runner_removed(fork_repo)


@pytest.fixture(scope="module")
def fork_carrying(tmp_path_factory: pytest.TempPathFactory) -> Carrying:
    root = tmp_path_factory.mktemp("fork-carrying")
    with tarfile.open(FORK) as archive:
        archive.extractall(root, filter="data")
    return carrying(root)


@needs_fork
@pytest.mark.parametrize("name", [*NEIGHBOURS, *REMOVALS])
def test_upstream_changes_next_to_our_hunks_on_the_fork(
    fork_carrying: Carrying, name: str
) -> None:
    upstream_next_to_ours(fork_carrying, name, {**NEIGHBOURS, **REMOVALS}[name])


@needs_fork
def test_a_change_to_our_own_lines_is_refused_on_the_fork(
    fork_carrying: Carrying,
) -> None:
    our_own_lines_changed(fork_carrying)
