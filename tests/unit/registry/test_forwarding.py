"""The generated step publisher forwards every call as the method receives it."""

from __future__ import annotations

import contextvars
import inspect
import traceback
from typing import Any

import pytest

from vllm_graphsafe.forwarding import publishing_method

STEP: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    "test_forwarding_step", default=None
)


class Runner:
    def execute(
        self,
        scheduler_output: Any,
        intermediate: Any = None,
        dummy_run: bool = False,
        *,
        profile: bool = False,
    ) -> tuple[Any, ...]:
        return (scheduler_output, intermediate, dummy_run, profile, STEP.get())


def publisher(method: Any) -> Any:
    return publishing_method(
        method, ("self", "scheduler_output", "dummy_run"), STEP.set, STEP.reset
    )


@pytest.fixture
def runner() -> Runner:
    class Published(Runner):
        execute = publisher(Runner.execute)

    return Published()


@pytest.mark.parametrize(
    ("args", "kwargs", "received"),
    [
        (("out",), {}, ("out", None, False, False)),
        (("out", "tensors", True), {}, ("out", "tensors", True, False)),
        (("out",), {"dummy_run": True}, ("out", None, True, False)),
        ((), {"scheduler_output": "out", "profile": True}, ("out", None, False, True)),
    ],
)
def test_calls_reach_the_method_unchanged_with_their_step_published(
    runner: Runner, args: Any, kwargs: Any, received: Any
) -> None:
    *arguments, published = runner.execute(*args, **kwargs)
    assert tuple(arguments) == received
    assert published == (runner, received[0], received[2])
    assert STEP.get() is None


def test_the_step_is_withdrawn_when_the_method_raises() -> None:
    def failing(self: Any, scheduler_output: Any, dummy_run: bool = False) -> None:
        raise RuntimeError("boom")

    wrapped = publishing_method(
        failing, ("self", "scheduler_output", "dummy_run"), STEP.set, STEP.reset
    )
    assert wrapped is not None
    with pytest.raises(RuntimeError, match="boom"):
        wrapped(object(), "out")
    assert STEP.get() is None


def test_the_wrapper_keeps_the_method_signature_and_name() -> None:
    wrapped = publisher(Runner.execute)
    assert wrapped.__wrapped__ is Runner.execute
    assert wrapped.__qualname__ == Runner.execute.__qualname__
    assert inspect.signature(wrapped, follow_wrapped=False) == inspect.signature(
        Runner.execute
    )
    with pytest.raises(TypeError):
        wrapped(Runner(), "out", unknown=1)


def test_a_default_object_is_passed_by_identity() -> None:
    sentinel = object()

    def method(self: Any, scheduler_output: Any, dummy_run: Any = sentinel) -> Any:
        return dummy_run

    wrapped = publishing_method(
        method, ("self", "scheduler_output", "dummy_run"), STEP.set, STEP.reset
    )
    assert wrapped is not None
    assert wrapped(None, "out") is sentinel


@pytest.mark.parametrize(
    "method",
    [
        lambda self, *args, dummy_run=False: None,
        lambda self, scheduler_output, dummy_run=False, **kwargs: None,
        lambda self, scheduler_output, /, dummy_run=False: None,
        lambda self, scheduler_output: None,
        lambda self, scheduler_output, _graphsafe_method=None, dummy_run=False: None,
    ],
    ids=["var-positional", "var-keyword", "positional-only", "missing", "reserved"],
)
def test_signatures_it_cannot_mirror_are_left_to_the_packing_wrapper(
    method: Any,
) -> None:
    assert publisher(method) is None


def test_the_step_publisher_mirrors_named_parameters_and_refuses_the_rest() -> None:
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.hooks import (
        _TARGET_STEP,
        bind_target_step,
    )

    def named(self: Any, scheduler_output: Any, dummy_run: bool = False) -> Any:
        return _TARGET_STEP.get()

    def packed(
        self: Any, scheduler_output: Any, dummy_run: bool = False, **kwargs: Any
    ) -> Any:
        return _TARGET_STEP.get()

    def no_failure(error: BaseException, reading: str) -> None:
        raise AssertionError(reading)

    runner = object()
    wrapped = bind_target_step(named, no_failure)
    assert wrapped(runner, "out") == (runner, "out", False)
    assert wrapped(runner, "out", True) == (runner, "out", True)
    assert wrapped(runner, dummy_run=True, scheduler_output="out") == (
        runner,
        "out",
        True,
    )
    assert _TARGET_STEP.get() is None
    mirrored = inspect.signature(wrapped, follow_wrapped=False)
    assert mirrored == inspect.signature(named)
    with pytest.raises(TypeError, match="named"):
        bind_target_step(packed, no_failure)


def test_a_traceback_through_the_generated_wrapper_shows_its_source() -> None:
    def failing(self: Any, scheduler_output: Any, dummy_run: bool = False) -> None:
        raise RuntimeError("boom")

    wrapped = publishing_method(
        failing, ("self", "scheduler_output", "dummy_run"), STEP.set, STEP.reset
    )
    assert wrapped is not None
    with pytest.raises(RuntimeError) as raised:
        wrapped(object(), "out")

    rendered = "".join(traceback.format_exception(raised.value))
    generated = [
        entry
        for entry in raised.traceback
        if "vllm-graphsafe publisher" in str(entry.path)
    ]
    assert generated, rendered
    assert "return _graphsafe_method(self, scheduler_output, dummy_run)" in rendered


def test_a_publish_that_fails_is_reported_and_the_method_still_runs() -> None:
    reported: list[tuple[str, str]] = []

    def broken_publish(values: tuple[Any, ...]) -> Any:
        raise LookupError("no context")

    def method(self: Any, scheduler_output: Any, dummy_run: bool = False) -> Any:
        return scheduler_output

    wrapped = publishing_method(
        method,
        ("self", "scheduler_output", "dummy_run"),
        broken_publish,
        STEP.reset,
        lambda error, reading: reported.append((type(error).__name__, reading)),
    )
    assert wrapped is not None
    assert wrapped(object(), "out") == "out"
    assert reported == [("LookupError", "self, scheduler_output, dummy_run")]
