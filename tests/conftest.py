"""Test-wide isolation, the tiers' markers and the negative-control switches.

Every test lives in a tier folder, and its markers come from that folder:
``tests/unit`` (no vLLM, no torch: no marker), ``tests/release`` (the runner
classes of the installed vLLM release: ``vllm``) and ``tests/engine`` (real CPU
engines and servers: ``vllm`` and ``engine``). A test that sets one of these
markers itself fails the collection. A tier that ``-m`` deselects whole is not
imported at all, so ``-m "not vllm"`` runs where vLLM is not installed.

``--negative-control=PATCH_ID`` keeps only the regression tests of that patch
(marked ``regression(PATCH_ID)``); CI runs them with the plugin disabled on a
release that lacks the fix and requires every one of them to fail.
Each fix's extra controls (``tests/support/fix_tests.py``, e.g.
``--drop-seq-len-floor``, which removes only the staging's sequence-length
lower bound) are options too.

A test function whose parameter list came out empty is skipped by pytest
("got empty parameter set"). In a negative control that would silently drop a
regression test, so there it fails the run instead.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from itertools import product
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.support.fix_tests import extra_controls, tests_of
from vllm_graphsafe.fixes import all_fixes

pytest_plugins = ("tests.backport_trees",)

# A shell's background job starts with Ctrl-C (SIGINT) ignored, and the children
# the tests start would inherit that; the tests that press Ctrl-C need it live.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if "VLLM_CACHE_ROOT" not in os.environ:
    # A run of its own leaves nothing behind in the system temporary directory.
    _cache_root = tempfile.mkdtemp(prefix="graphsafe-vllm-cache-")
    atexit.register(shutil.rmtree, _cache_root, True)
    os.environ["VLLM_CACHE_ROOT"] = _cache_root
if "GRAPHSAFE_CACHE_DIR" not in os.environ:
    # The fixes' verdicts on vLLM are kept here, not in the user's cache directory.
    _verdicts = tempfile.mkdtemp(prefix="graphsafe-verdicts-")
    atexit.register(shutil.rmtree, _verdicts, True)
    os.environ["GRAPHSAFE_CACHE_DIR"] = _verdicts
# The vLLM processes a test starts load worker extensions of tests/support.
_REPOSITORY = str(Path(__file__).resolve().parents[1])
if _REPOSITORY not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, (os.environ.get("PYTHONPATH"), _REPOSITORY))
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
        for control in tests_of(fix.id).extra_controls:
            parser.addoption(
                control.option,
                action="store_true",
                help=f"{fix.id}: {control.removes}",
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "regression(patch_id): fails on a vLLM without that fix"
    )


TESTS = Path(__file__).resolve().parent
#: The markers each tier's tests carry, from the folder under tests/ they are in.
TIER_MARKERS: dict[str, frozenset[str]] = {
    "unit": frozenset(),
    "release": frozenset({"vllm"}),
    "engine": frozenset({"vllm", "engine"}),
}
SET_FROM_THE_FOLDER = frozenset().union(*TIER_MARKERS.values())


def tier_of(path: Path) -> str | None:
    """The tier folder ``path`` is in, or None outside every tier."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if parts and parts[0] in TIER_MARKERS else None


def may_select(expression: Expression, tier_markers: frozenset[str]) -> bool:
    """Whether some test of a tier can match ``expression``.

    The tier's own markers are known; every other name the expression uses
    (``regression``, say) is tried both present and absent.
    """
    others: list[str] = []

    def matcher_for(present: dict[str, bool]) -> Callable[..., bool]:
        def matcher(name: str, /, **_: str | int | bool | None) -> bool:
            if name in tier_markers:
                return True
            if name not in present and name not in others:
                others.append(name)
            return present.get(name, False)

        return matcher

    while True:
        seen = len(others)
        for values in product((False, True), repeat=seen):
            present = dict(zip(others[:seen], values, strict=True))
            if expression.evaluate(matcher_for(present)):
                return True
        if len(others) == seen:
            return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    tier = tier_of(collection_path)
    markexpr = config.getoption("markexpr")
    if tier is None or not markexpr:
        return None
    if may_select(Expression.compile(markexpr), TIER_MARKERS[tier]):
        return None
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Mark each test by its tier before ``-m`` selects, then the negative control."""
    mark_by_tier(items)
    select_negative_control(config, items)


def mark_by_tier(items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if not item.path.resolve().is_relative_to(TESTS):
            continue  # a file outside tests/ that loads this conftest as a plugin
        tier = tier_of(item.path)
        own = {m.name for m in item.iter_markers() if m.name in SET_FROM_THE_FOLDER}
        if tier is None or own:
            misplaced.append(item.nodeid)
            continue
        for name in sorted(TIER_MARKERS[tier]):
            item.add_marker(name)
    if misplaced:
        raise pytest.UsageError(
            "a test's tier is its folder (tests/unit, tests/release or "
            "tests/engine), which sets its vllm and engine markers; move or "
            f"unmark {', '.join(misplaced)}"
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


def select_negative_control(config: pytest.Config, items: list[pytest.Item]) -> None:
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
    for control in extra_controls():
        if request.config.getoption(control.option):
            module = importlib.import_module(control.module)
            monkeypatch.setattr(module, control.attribute, control.replacement)
