"""Fixtures of the backport tests: copies of the installed release's ``vllm`` package.

Loaded for every tier by ``tests/conftest.py`` (the class-level backport tests
and the engine test of a backported tree both use them).

The release is never imported here (the backport reads source only) and never
edited: a session copy stays pristine, each test that edits gets its own copy.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.backport_checks import copy_package

REPO = Path(__file__).resolve().parents[1]


def installed_vllm() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def release_package() -> Path:
    package = installed_vllm()
    if package is None:
        pytest.skip("no vLLM release is installed in this environment")
    return package


@pytest.fixture(scope="session")
def pristine_tree(
    release_package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    copy_package(release_package, root)
    return root


@pytest.fixture
def tree_copy(
    pristine_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], Path]:
    """Make a fresh copy of the pristine tree (one per call)."""

    def make() -> Path:
        root = tmp_path_factory.mktemp("tree")
        copy_package(pristine_tree / "vllm", root)
        return root

    return make


def copy_sources(package: Path, tree_root: Path) -> Path:
    """Copy the Python files of ``package`` (an installed ``vllm/``) to
    ``tree_root/vllm``: a tree without compiled libraries, as a checkout that
    was never built, and quick to put under git."""
    return Path(
        shutil.copytree(
            package,
            tree_root / "vllm",
            ignore=lambda directory, names: [
                name
                for name in names
                if not name.endswith(".py") and not (Path(directory) / name).is_dir()
            ],
        )
    )


@pytest.fixture
def source_tree_copy(
    release_package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], Path]:
    """Make a fresh Python-only copy of the installed release (one per call)."""

    def make() -> Path:
        root = tmp_path_factory.mktemp("source-tree")
        copy_sources(release_package, root)
        return root

    return make
