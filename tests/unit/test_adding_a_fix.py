"""A fix added to ``vllm_graphsafe.fixes`` reaches every consumer, none edited.

The dummy fix below is registered the way a fourth fix would be (one more entry
in ``ALL_FIXES``, its folder holding ``judge.JUDGE``, ``hooks.hook_points``
and ``backport.plan``); each test reads one consumer and finds it there. No vLLM,
no torch: the dummy binds to a module nothing installs, so it is "not applicable".
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import fix_tests
from tests.support.fix_tests import ExtraControl, FixTests
from vllm_graphsafe import fixes
from vllm_graphsafe.fixes import Fix
from vllm_graphsafe.hook_points import HookPoint
from vllm_graphsafe.judging import FixJudge, PatchState, Verdict
from vllm_graphsafe.tree_edits.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "graphsafe_dummy_fix"
DUMMY_ID = "dummy-fix"
#: A module of no installed package: the dummy never applies, and judging so
#: imports nothing (a missing module inside vllm/ would import vLLM to look).
ABSENT_MODULE = "graphsafe_absent_package.runner"
DUMMY_TEST = "tests/release/classes/test_dummy_fix.py::test_the_plugin_form"


def _keep(value: Any, _num_scheduled: Any) -> Any:
    return value


DUMMY = Fix(
    id=DUMMY_ID,
    title="Dummy runner: a fourth fix",
    what="Stands for a fix added after the first three.",
    why="Shows that every consumer discovers it.",
    binds_to="`DummyRunner.step`",
    upstream=("vllm-project/vllm#1",),
    delete_when="never: it is a test's",
    commit_subject="[Bugfix][Dummy] A fourth fix",
    anchor=ABSENT_MODULE,
    absent="this vLLM has no dummy runner",
    package=PACKAGE,
    events=("dummy_fix_decision",),
)
#: What the test suite knows of it (tests/support/fix_tests.py).
DUMMY_TESTS = FixTests(
    native_from=(0, 29),
    dispatch_runner="dummy-runner",
    extra_controls=(
        ExtraControl(
            option="--drop-dummy-piece",
            removes="the dummy's piece removed",
            module=PACKAGE,
            attribute="piece",
            replacement=_keep,
            tests=("tests/release/classes/test_dummy_fix.py",),
            caught="the missing piece",
        ),
    ),
    plugin_form_only=(DUMMY_TEST,),
)


JUDGE = FixJudge(
    native_summary="the dummy runner classifies by phase",
    behaviour=lambda sources: None,
    native_reason=lambda sources: None,
    points=lambda layout: [],
)


def _hook_points(verdict: Verdict) -> list[HookPoint]:
    return []


def _plan(tree: object) -> Plan:
    return Plan(DUMMY_ID, "dummy layout", names=("DummyRunner._phase",))


@pytest.fixture(autouse=True)
def dummy_fix(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fix]:
    """The dummy fix's folder importable, and the fix in the one list."""
    folder = types.ModuleType(PACKAGE)
    judge = types.ModuleType(f"{PACKAGE}.judge")
    judge.JUDGE = JUDGE  # type: ignore[attr-defined]
    hooks = types.ModuleType(f"{PACKAGE}.hooks")
    hooks.hook_points = _hook_points  # type: ignore[attr-defined]
    backport = types.ModuleType(f"{PACKAGE}.backport")
    backport.plan = _plan  # type: ignore[attr-defined]
    for module in (folder, judge, hooks, backport):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(fixes, "ALL_FIXES", (*fixes.ALL_FIXES, DUMMY))
    monkeypatch.setitem(fix_tests.FIX_TESTS, DUMMY_ID, DUMMY_TESTS)
    yield DUMMY


def _script(path: str, name: str) -> types.ModuleType:
    """A repository script, imported as a module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_plugin_registry_holds_it() -> None:
    from vllm_graphsafe import plugin

    plugin._REGISTRY = None
    try:
        registry = plugin.registry()
        assert registry.get(DUMMY_ID).fix == DUMMY
    finally:
        plugin._REGISTRY = None


def test_doctor_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_graphsafe.cli.doctor import collect_report, render_report
    from vllm_graphsafe.settings import read_settings

    report = collect_report(False, None, read_settings({}))
    (dummy,) = [p for p in report["patches"] if p["id"] == DUMMY_ID]
    assert dummy["state"] == PatchState.NOT_APPLICABLE.value
    assert dummy["upstream"] == ["vllm-project/vllm#1"]
    assert DUMMY_ID in render_report(
        {**report, "vllm": {"version": "x", "distribution": "y"}}
    )


def test_its_id_is_one_the_disable_switch_knows() -> None:
    from vllm_graphsafe.cli.backport import _fix_ids
    from vllm_graphsafe.settings import read_settings

    assert read_settings({"GRAPHSAFE_DISABLE": DUMMY_ID}).problems == ()
    assert DUMMY_ID in _fix_ids()


def test_the_catalogue_and_readme_tables_show_it() -> None:
    from vllm_graphsafe import catalogue

    assert f"`{DUMMY_ID}`" in catalogue.render_patches_markdown()
    assert f"{DUMMY_ID}: {DUMMY.title}" in catalogue.render_text()
    support = catalogue.render_support_markdown().splitlines()
    assert support[0].endswith(f"| {DUMMY_ID} | backport |")
    # The release table records no state for it yet: every row says so.
    assert all("| not recorded |" in line for line in support[2:])


def test_the_release_table_has_no_row_for_it_and_the_survey_does() -> None:
    from tests.support.fix_tests import surveyed_states
    from vllm_graphsafe.releases import verified_releases

    assert verified_releases(DUMMY_ID) == ()
    assert surveyed_states("0.28.0") == {
        "v1-phase-dispatch": "applied",
        "v1-dummy-staging": "applied",
        "mrv2-phase-dispatch": "native",
        "replay-guard": "applied",
        DUMMY_ID: "applied",
    }
    after = surveyed_states("0.29.0")
    assert after is not None and after[DUMMY_ID] == "native"


def test_the_sweep_table_has_a_column_for_it() -> None:
    sys.path.insert(0, str(ROOT / "scripts" / "sweep"))
    try:
        records = _script("scripts/sweep/records.py", "graphsafe_sweep_records")
    finally:
        sys.path.remove(str(ROOT / "scripts" / "sweep"))
    row = {
        "version": "0.20.2",
        "distribution": "vllm",
        "torch": "2.11.0",
        "installed": True,
        "why_not": "",
        "patches": {"v1-phase-dispatch": "applied"},
        "class_tests": "1 passed, 0 failed",
        "negative_controls": "all failed",
        "engine": "not run",
        "ci": False,
    }
    header, _, line = records.markdown_table([row], {}).splitlines()
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[columns.index(DUMMY_ID)] == "-"


def test_run_suite_runs_its_extra_negative_control() -> None:
    run_suite = _script("scripts/run_suite.py", "graphsafe_run_suite")
    assert run_suite.extra_controls([DUMMY_ID]) == list(DUMMY_TESTS.extra_controls)
    assert DUMMY_TESTS.extra_controls[0] not in run_suite.extra_controls(
        ["v1-phase-dispatch"]
    )


def test_backport_verification_leaves_out_its_plugin_form_tests() -> None:
    verify = _script("scripts/verify_backport.py", "graphsafe_verify_backport")
    assert DUMMY_TEST in verify.plugin_form_only()


def test_the_backport_plans_it_and_names_its_commit() -> None:
    from vllm_graphsafe.backport import Outcome, Status, planner
    from vllm_graphsafe.backport.output import commit_message

    plan = planner(DUMMY_ID).plan(Path("."))
    message = commit_message(Outcome(DUMMY_ID, Status.NEEDED, plan.layout, plan), "9")
    assert message.startswith(DUMMY.commit_subject + "\n")
    assert "DummyRunner._phase" in message


def test_metrics_name_its_decision_events() -> None:
    from vllm_graphsafe.metrics import decisions_help

    assert "dummy_fix_decision" in fixes.decision_events()
    assert "dummy_fix_decision" in decisions_help()


def test_the_dispatch_benchmarks_list_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coverage benchmark measures each runner's dispatch fix, or says why not."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import full_graph_coverage

    monkeypatch.setattr(
        full_graph_coverage, "patch_states", lambda: {DUMMY_ID: "not applicable"}
    )
    monkeypatch.setattr(full_graph_coverage, "_vllm_version", lambda: "none")
    result = full_graph_coverage.run(steps_per_width=1)
    assert result["skipped"]["dummy-runner"] == (
        f"{DUMMY_ID} is not applicable here, not applied"
    )
