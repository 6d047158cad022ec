"""Test-wide isolation and the negative-control switches.

``--negative-control=PATCH_ID`` keeps only the regression tests of that patch
(marked ``regression(PATCH_ID)``); CI runs them with the plugin disabled on a
release that lacks the fix and requires every one of them to fail.
``--drop-seq-len-floor`` removes only the staging's sequence-length lower
bound, the reference fix's own negative control.

A test function whose parameter list came out empty is skipped by pytest
("got empty parameter set"). In a negative control that would silently drop a
regression test, so there it fails the run instead.
"""

from __future__ import annotations

import os
import tempfile

import pytest

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
    parser.addoption(
        "--drop-seq-len-floor",
        action="store_true",
        help="remove the dummy staging's sequence-length lower bound",
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
def _seq_len_floor_control(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if request.config.getoption("--drop-seq-len-floor"):
        from vllm_graphsafe.logic import staging

        monkeypatch.setattr(staging, "seq_len_floor", lambda requested, _: requested)
