"""Test-wide isolation and the negative-control switches.

``--negative-control=PATCH_ID`` keeps only the regression tests of that patch
(marked ``regression(PATCH_ID)``); CI runs them with the plugin disabled on a
release that lacks the fix and requires every one of them to fail.
Each fix's extra controls (``Fix.extra_controls``, e.g. ``--drop-seq-len-floor``,
which removes only the staging's sequence-length lower bound) are options too.

A test function whose parameter list came out empty is skipped by pytest
("got empty parameter set"). In a negative control that would silently drop a
regression test, so there it fails the run instead.
"""

from __future__ import annotations

import importlib
import os
import tempfile

import pytest

from vllm_graphsafe.fixes import all_fixes

os.environ.setdefault(
    "VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="graphsafe-vllm-cache-")
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--negative-control",
        default=None,
        metavar="PATCH_ID",
        help="run only the regression tests of PATCH_ID",
    )
    for fix in all_fixes():
        for control in fix.extra_controls:
            parser.addoption(
                control.option,
                action="store_true",
                help=f"{fix.id}: {control.removes}",
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "regression(patch_id): fails on a vLLM without that fix"
    )


EMPTY_PARAMETER_SET = "got empty parameter set"


def iterates_an_empty_list(item: pytest.Item) -> bool:
    """Whether pytest skips ``item`` because one of its parameter lists is empty."""
    return any(
        str(mark.kwargs.get("reason", "")).startswith(EMPTY_PARAMETER_SET)
        for mark in item.iter_markers(name="skip")
    )


def empty_regression_lists(items: list[pytest.Item], patch_id: str) -> list[str]:
    return [
        item.nodeid
        for item in items
        if iterates_an_empty_list(item)
        and any(patch_id in mark.args for mark in item.iter_markers(name="regression"))
    ]


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    target = config.getoption("--negative-control")
    if target is None:
        return
    empty = empty_regression_lists(items, target)
    if empty:
        pytest.exit(
            f"the negative control of {target} would drop "
            f"{', '.join(empty)}: a parameter list it iterates is empty",
            returncode=pytest.ExitCode.TESTS_FAILED,
        )
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("regression")
        (keep if marker is not None and target in marker.args else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(autouse=True)
def _extra_controls(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    for fix in all_fixes():
        for control in fix.extra_controls:
            if request.config.getoption(control.option):
                module = importlib.import_module(control.module)
                monkeypatch.setattr(module, control.attribute, control.replacement)
