"""The registry on a synthetic target module: every state and transition."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_graphsafe.behaviour.compiled import SourceCode
from vllm_graphsafe.behaviour.judgement import (
    Case,
    Evidence,
    Expect,
    Outcome,
    judge_cases,
)
from vllm_graphsafe.fixes import Fix
from vllm_graphsafe.hook_points import (
    HookPoint,
    OnFailure,
    ReplaceHook,
    WrapHook,
    is_hooked,
)
from vllm_graphsafe.judging import (
    FixJudge,
    Layout,
    PatchState,
    Point,
    Requirement,
    SetsAttribute,
    TakesParameters,
)
from vllm_graphsafe.registry import Patch, PatchFailedError, Registry
from vllm_graphsafe.settings import read_settings
from vllm_graphsafe.sources import SourceReader

TARGET_SOURCE = """
def helper(value):
    return value


class Runner:
    def step(self, value):
        return helper(value) + 1

    def classify(self, value):
        return "shape"
"""


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, not yet imported module ``<pkg>.runner`` with TARGET_SOURCE."""
    package = f"fakevllm_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "runner.py").write_text(textwrap.dedent(TARGET_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{package}.runner"
    for name in [m for m in sys.modules if m.startswith(package)]:
        del sys.modules[name]


def double_result(
    wrapped: Any, instance: Any, args: Any, kwargs: Any, *, on_failure: OnFailure
) -> Any:
    return 2 * wrapped(*args, **kwargs)


def phase_classify(
    wrapped: Any, instance: Any, args: Any, kwargs: Any, *, on_failure: OnFailure
) -> Any:
    return "phase"


FAKE_FIX = Fix(
    id="fake-fix",
    title="fake",
    what="a fake fix",
    why="tests the registry",
    binds_to="Runner.classify",
    upstream=(),
    delete_when="never",
    commit_subject="fake",
    anchor="",
    absent="this vLLM has no fake runner",
    package=__name__,
)


class FakePatch(Patch):
    """A fix whose hooks wrap ``qualnames`` of ``module`` and its ``helper``
    (called from ``Runner.step``); native where its runner's ``classify``
    answers ``native_answer``."""

    def __init__(
        self, module: str, qualnames: tuple[str, ...] = ("Runner.classify",), **kw: Any
    ) -> None:
        super().__init__(FAKE_FIX._replace(anchor=module))
        self.module = module
        self.qualnames = qualnames
        self.native_answer = kw.get("native_answer")

    def parts(self) -> FixJudge:
        return FixJudge(
            native_summary="the fake runner classifies by phase",
            behaviour=self.behaviour,
            native_reason=lambda sources: None,
            points=self.points,
            reads=self.reads,
            live=self.live_behaviour_of_imported,
        )

    def points(self, layout: Layout) -> list[Point]:
        return [
            *(Point(self.module, name, "classify") for name in self.qualnames),
            Point(self.module, "helper", "helper", caller="Runner.step"),
        ]

    def reads(self, layout: Layout) -> list[Requirement]:
        return []

    def live_behaviour_of_imported(self) -> Evidence | None:
        return None

    def hook_points(self) -> list[HookPoint]:
        hooks: list[HookPoint] = [
            WrapHook(self.module, name, phase_classify) for name in self.qualnames
        ]
        hooks.append(WrapHook(self.module, "helper", double_result))
        return hooks

    def behaviour(self, sources: SourceReader) -> Evidence | None:
        """One case: the runner's own ``classify`` (compiled from its source)
        answers ``native_answer``."""
        if self.native_answer is None:
            return None
        runner = SourceCode(sources, package=self.module.split(".")[0]).instance(
            self.module, "Runner", {}
        )
        answer = runner.classify(0)
        case = Case("classify(0)", Expect.HOLDS, answer)
        return judge_cases(
            [case], lambda c: Outcome(c.step == self.native_answer, f"said {answer!r}")
        )


def apply(patch: Patch, environ: dict[str, str] | None = None) -> Registry:
    registry = Registry([patch])
    registry.apply_all(read_settings(environ or {}))
    return registry


def test_applied_patch_wraps_the_module_when_it_is_imported(target: str) -> None:
    patch = FakePatch(target)
    apply(patch)
    assert patch.state is PatchState.APPLIED
    assert target not in sys.modules
    assert not patch.is_wrapped()

    runner = importlib.import_module(target).Runner()

    assert patch.is_wrapped()
    assert runner.classify(1) == "phase"
    assert runner.step(3) == 7


def test_already_imported_module_is_wrapped_at_once(target: str) -> None:
    module = importlib.import_module(target)
    patch = FakePatch(target)
    apply(patch)
    assert module.Runner().classify(0) == "phase"


def test_apply_and_remove_are_idempotent(target: str) -> None:
    module = importlib.import_module(target)
    patch = FakePatch(target)
    registry = apply(patch)
    registry.apply_all(read_settings({}))
    assert module.Runner().step(3) == 7, "wrapped twice"

    registry.remove_all()
    registry.remove_all()
    assert module.Runner().classify(0) == "shape"
    assert module.Runner().step(3) == 4
    assert patch.state is PatchState.DISABLED

    registry.apply_all(read_settings({}))
    # mypy keeps the narrowing above across the call that changed the state.
    assert patch.state is PatchState.APPLIED  # type: ignore[comparison-overlap]
    assert module.Runner().step(3) == 7


def test_disable_switch_by_id_and_all(target: str) -> None:
    module = importlib.import_module(target)
    for value in ("fake-fix", "other,fake-fix", "all"):
        patch = FakePatch(target)
        apply(patch, {"VLLM_GRAPHSAFE_DISABLE": value})
        assert patch.state is PatchState.DISABLED
        assert module.Runner().classify(0) == "shape"
    patch = FakePatch(target)
    apply(patch, {"VLLM_GRAPHSAFE_DISABLE": "some-other-fix"})
    assert patch.state is PatchState.APPLIED


def test_disabling_an_applied_patch_unwraps_it(target: str) -> None:
    module = importlib.import_module(target)
    patch = FakePatch(target)
    registry = apply(patch)
    registry.apply_all(read_settings({"VLLM_GRAPHSAFE_DISABLE": "fake-fix"}))
    assert patch.state is PatchState.DISABLED
    assert module.Runner().classify(0) == "shape"


def test_native_code_is_recognised_and_left_alone(target: str, tmp_path: Path) -> None:
    patch = FakePatch(target, native_answer="shape")
    apply(patch)
    assert patch.state is PatchState.NATIVE
    assert importlib.import_module(target).Runner().classify(0) == "shape"


def test_missing_module_is_not_applicable() -> None:
    patch = FakePatch("graphsafe_no_such_package.runner")
    apply(patch)
    assert patch.state is PatchState.NOT_APPLICABLE


def test_missing_hook_point_fails_with_one_warning_and_no_crash(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    patch = FakePatch(target, qualnames=("Runner.classify", "Runner.vanished"))
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        apply(patch)
    assert patch.state is PatchState.FAILED
    assert f"{target}.Runner.vanished" in patch.reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"{target}.Runner.vanished" in warnings[0].getMessage()
    module = importlib.import_module(target)
    assert module.Runner().classify(0) == "shape", "half applied"
    assert module.Runner().step(3) == 4, "half applied"


def test_hook_point_no_longer_called_from_its_caller_fails(
    target: str, tmp_path: Path
) -> None:
    path = tmp_path / target.replace(".", "/")
    source = path.with_suffix(".py")
    source.write_text(source.read_text().replace("helper(value) + 1", "value + 1"))
    patch = FakePatch(target)
    apply(patch)
    assert patch.state is PatchState.FAILED
    assert "no longer called from" in patch.reason


def test_strict_mode_turns_failure_into_an_error(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_GRAPHSAFE_STRICT", "1")
    patch = FakePatch(target, qualnames=("Runner.vanished",))
    with pytest.raises(PatchFailedError, match=r"Runner\.vanished"):
        apply(patch, {"VLLM_GRAPHSAFE_STRICT": "1"})


def test_symbol_removed_after_the_source_check_fails_at_import(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    patch = FakePatch(target)
    apply(patch)
    assert patch.state is PatchState.APPLIED
    module_name = target
    # The module rewrites itself on import, as a fork's import-time code might.
    spec = importlib.util.find_spec(module_name)
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin)
    path.write_text(path.read_text() + "\ndel Runner.classify\n")
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        module = importlib.import_module(module_name)
    # mypy keeps the narrowing above across the call that changed the state.
    assert patch.state is PatchState.FAILED  # type: ignore[comparison-overlap]
    assert "Runner.classify" in patch.reason
    assert module.Runner().step(3) == 4, "half applied"


def test_method_of_a_renamed_class_is_missing(target: str) -> None:
    patch = FakePatch(target, qualnames=("RenamedRunner.classify",))
    apply(patch)
    assert patch.state is PatchState.FAILED
    assert f"{target}.RenamedRunner.classify" in patch.reason


# -- replace hook points (plain replacement functions, for the per-step path) ---


def bind_phase_classify(classify: Any, on_failure: OnFailure) -> Any:
    def phase_aware_classify(self: Any, value: Any) -> Any:
        return "phase" if value else classify(self, value)

    return phase_aware_classify


def refuse_to_bind(original: Any, on_failure: OnFailure) -> Any:
    raise TypeError(f"{original.__qualname__} takes other arguments")


class InlinePatch(FakePatch):
    def __init__(self, module: str, factory: Any = bind_phase_classify) -> None:
        super().__init__(module)
        self.factory = factory

    def hook_points(self) -> list[HookPoint]:
        return [
            ReplaceHook(self.module, "Runner.classify", self.factory),
            WrapHook(self.module, "helper", double_result),
        ]


def test_inline_hook_point_installs_a_plain_function_and_removes_it(
    target: str,
) -> None:
    module = importlib.import_module(target)
    original = vars(module.Runner)["classify"]
    patch = InlinePatch(target)
    registry = apply(patch)
    installed = vars(module.Runner)["classify"]

    assert is_hooked(installed) and type(installed) is type(original)
    assert module.Runner().classify(1) == "phase"
    assert module.Runner().classify(0) == "shape"

    registry.apply_all(read_settings({}))
    assert vars(module.Runner)["classify"] is installed, "bound twice"
    registry.remove_all()
    registry.remove_all()
    assert vars(module.Runner)["classify"] is original
    assert not is_hooked(module.helper)


def test_inline_hook_point_that_cannot_bind_fails_whole(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    patch = InlinePatch(target, factory=refuse_to_bind)
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        apply(patch)
        module = importlib.import_module(target)
    assert patch.state is PatchState.FAILED
    assert "cannot be bound" in patch.reason and "takes other arguments" in patch.reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert module.Runner().classify(1) == "shape", "half applied"
    assert module.Runner().step(3) == 4, "half applied"


def test_inline_hook_is_never_stacked_on_an_installed_one(target: str) -> None:
    module = importlib.import_module(target)
    apply(InlinePatch(target))
    subclass = type("SubRunner", (module.Runner,), {})
    (hook, _) = InlinePatch(target).hook_points()

    with pytest.raises(ValueError, match="already carries"):
        hook.install(subclass, "classify", lambda error, reading: None)
    assert "classify" not in vars(subclass)
    assert subclass().classify(1) == "phase"


# -- failing open at run time ----------------------------------------------------


def bind_fragile_classify(classify: Any, on_failure: OnFailure) -> Any:
    """Reads ``self.phase_state`` on every call: an attribute a release may drop."""

    def phase_aware_classify(self: Any, value: Any) -> Any:
        answer = classify(self, value)
        try:
            return "phase" if self.phase_state[value] else answer
        except Exception as error:
            on_failure(error, "Runner.phase_state")
            return answer

    return phase_aware_classify


@pytest.fixture
def fragile(target: str) -> tuple[Any, Patch, Registry]:
    module = importlib.import_module(target)
    patch = InlinePatch(target, factory=bind_fragile_classify)
    registry = apply(patch)
    return module, patch, registry


def test_a_hook_that_fails_at_run_time_returns_vllm_answer_and_unhooks(
    fragile: tuple[Any, Patch, Registry], caplog: pytest.LogCaptureFixture
) -> None:
    module, patch, registry = fragile
    runner = module.Runner()
    runner.phase_state = {1: True}
    assert runner.classify(1) == "phase"
    del runner.phase_state

    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        assert runner.classify(1) == "shape"
        assert runner.classify(1) == "shape"

    assert patch.state is PatchState.FAILED
    assert "AttributeError" in patch.reason and "Runner.phase_state" in patch.reason
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "fake-fix" in warnings[0] and "Runner.phase_state" in warnings[0]
    assert not is_hooked(vars(module.Runner)["classify"])
    assert module.Runner().step(3) == 4, "the rest of the patch stayed hooked"
    registry.apply_all(read_settings({}))
    assert patch.state is PatchState.FAILED, "re-applied after a run-time failure"


def test_vllm_errors_propagate_unchanged(target: str) -> None:
    module = importlib.import_module(target)

    def release_classify(self: Any, value: Any) -> Any:
        raise KeyError("vLLM's own error")

    module.Runner.classify = release_classify
    patch = InlinePatch(target, factory=bind_fragile_classify)
    apply(patch)
    runner = module.Runner()
    runner.phase_state = {1: True}

    with pytest.raises(KeyError, match="vLLM's own error"):
        runner.classify(1)
    assert patch.state is PatchState.APPLIED
    assert is_hooked(vars(module.Runner)["classify"])


def test_strict_mode_reraises_a_run_time_failure(target: str) -> None:
    module = importlib.import_module(target)
    patch = InlinePatch(target, factory=bind_fragile_classify)
    apply(patch, {"VLLM_GRAPHSAFE_STRICT": "1"})

    with pytest.raises(AttributeError, match="phase_state"):
        module.Runner().classify(1)
    assert patch.state is PatchState.APPLIED


# -- what hooks read, checked in source ------------------------------------------


class ReadingPatch(InlinePatch):
    def __init__(self, module: str, requirement: Requirement) -> None:
        super().__init__(module)
        self.requirement = requirement

    def reads(self, layout: Layout) -> list[Requirement]:
        return [self.requirement]


@pytest.mark.parametrize(
    ("requirement", "missing"),
    [
        (SetsAttribute("", "Runner", "phase_state", "classify"), "phase_state"),
        (SetsAttribute("", "Walker", "phase_state", "classify"), "Walker"),
        (TakesParameters("", "Runner.step", ("value", "width"), "step"), "width"),
        (TakesParameters("", "Runner.run", ("value",), "step"), "Runner.run"),
    ],
)
def test_something_a_hook_reads_is_missing_in_source(
    target: str, requirement: Any, missing: str
) -> None:
    requirement = requirement._replace(module=target)
    patch = ReadingPatch(target, requirement)
    apply(patch)
    assert patch.state is PatchState.FAILED
    assert missing in patch.reason and "read by" in patch.reason


def test_what_hooks_read_is_present_in_source(target: str) -> None:
    patch = ReadingPatch(
        target, TakesParameters(target, "Runner.step", ("value",), "step")
    )
    apply(patch)
    assert patch.state is PatchState.APPLIED, patch.reason


# -- reading source -----------------------------------------------------------------


def test_source_reader_reads_a_tree_instead_of_the_installed_package(
    tmp_path: Path,
) -> None:
    runner = tmp_path / "vllm" / "v1" / "worker"
    runner.mkdir(parents=True)
    (runner / "__init__.py").write_text("")
    (runner / "gpu_model_runner.py").write_text(textwrap.dedent(TARGET_SOURCE))
    sources = SourceReader(root=tmp_path)

    assert sources.exists("vllm.v1.worker")
    assert sources.defines("vllm.v1.worker.gpu_model_runner", "Runner.step")
    assert sources.calls("vllm.v1.worker.gpu_model_runner", "Runner.step", "helper")
    assert not sources.exists("vllm.v1.worker.gpu.model_runner")


def test_a_name_in_a_comment_or_string_is_not_a_definition(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "mod.py").write_text(
        "# def helper(value): once lived here\n"
        'MESSAGE = "call helper(value) or Runner.step"\n'
        "class Runner:\n"
        "    def step(self):\n"
        '        """helper(value) is gone."""\n'
        "        return 1  # helper(1)\n"
    )
    sources = SourceReader(root=tmp_path)

    assert not sources.defines("vllm.mod", "helper")
    assert sources.defines("vllm.mod", "MESSAGE")
    assert not sources.calls("vllm.mod", "Runner.step", "helper")
    assert not sources.defines("vllm.mod", "Runner.classify")


def state_of(patch: Patch) -> PatchState | None:
    """The patch's state now (it changes when its module is imported)."""
    return patch.state


class LiveDisagrees(FakePatch):
    """Native by its source, but the imported class answers otherwise (a
    platform's or another plugin's replacement)."""

    def live_behaviour_of_imported(self) -> Evidence | None:
        module = sys.modules[self.module]
        answer = module.Runner().classify(0)
        case = Case("classify(0) on the imported class", Expect.HOLDS, answer)
        return judge_cases(
            [case], lambda c: Outcome(c.step == self.native_answer, f"said {answer!r}")
        )


def test_a_native_verdict_the_imported_class_contradicts_is_applied(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    patch = LiveDisagrees(target, native_answer="shape")
    apply(patch)
    assert patch.state is PatchState.NATIVE
    source = Path(importlib.util.find_spec(target).origin)  # type: ignore[union-attr, arg-type]
    # What runs is not what the source says: the module is replaced before import.
    source.write_text(source.read_text().replace('return "shape"', 'return "other"'))
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe"):
        module = importlib.import_module(target)
    assert state_of(patch) is PatchState.APPLIED, patch.reason
    assert patch.finding() == (
        "needed (behaviour: classify(0) on the imported class said 'other'; 0/1 cases)"
    )
    assert module.Runner().classify(0) == "phase"
    assert any("imported classes are not" in r.getMessage() for r in caplog.records)


def test_a_native_verdict_the_imported_class_confirms_stays_native(
    target: str,
) -> None:
    patch = LiveDisagrees(target, native_answer="shape")
    apply(patch)
    module = importlib.import_module(target)
    assert patch.state is PatchState.NATIVE
    assert module.Runner().classify(0) == "shape"
