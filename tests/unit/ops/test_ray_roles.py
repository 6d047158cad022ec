"""A Ray actor vLLM runs a worker or an engine core in counts as one.

Ray names every actor process ``MainProcess``, so the process name says
nothing there; Ray's runtime context names the task running, after the actor's
class (``<module>.RayWorkerProc.initialize_worker``), while vLLM sets the actor
up and loads the plugins. A fake ``ray`` module stands in for Ray: the plugin
never imports Ray itself, it reads the one the actor process has loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import multiprocessing
import os
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from vllm_graphsafe import plugin, vllm_layout
from vllm_graphsafe.counts import (
    ROLE_ENGINE_CORE,
    ROLE_MAIN,
    ROLE_WORKER,
    records,
    roles,
)
from vllm_graphsafe.settings import read_settings

LEGACY_MODULE, LEGACY_CLASS = (
    vllm_layout.RAY_WORKER_WRAPPER,
    vllm_layout.RAY_WORKER_WRAPPER_CLASS,
)
LEGACY_WORKER = f"{LEGACY_MODULE}.{LEGACY_CLASS}"
DEFAULT_WORKER = f"{vllm_layout.RAY_EXECUTOR_V2}.{vllm_layout.RAY_WORKER_PROC_CLASS}"
ENGINE_ACTORS = [
    f"{vllm_layout.ENGINE_CORE}.{name}"
    for name in vllm_layout.RAY_ENGINE_CORE_ACTOR_CLASSES
]


class FakeRuntimeContext:
    def __init__(self, actor_id: str | None, task: str | None) -> None:
        self.actor_id = actor_id
        self.task = task
        self.task_name_asked = False

    def get_actor_id(self) -> str | None:
        return self.actor_id

    def get_task_function_name(self) -> str | None:
        self.task_name_asked = True
        return self.task


class FakeRay(types.ModuleType):
    """What the plugin reads of Ray's public API."""

    def __init__(
        self, task: str | None, actor_id: str | None = "a1", initialized: bool = True
    ) -> None:
        super().__init__("ray")
        self.context = FakeRuntimeContext(actor_id, task)
        self.initialized = initialized
        self.context_asked = False

    def is_initialized(self) -> bool:
        return self.initialized

    def get_runtime_context(self) -> FakeRuntimeContext:
        self.context_asked = True
        return self.context


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has decided nothing yet, named as Ray names its actors."""
    monkeypatch.setattr(roles, "_ray_actor_role_in", None, raising=False)
    monkeypatch.setattr(plugin, "_prepared_in_pid", None)
    monkeypatch.setattr(plugin, "_prepared_directory", None)
    monkeypatch.setattr(multiprocessing.current_process(), "name", "MainProcess")
    monkeypatch.delitem(sys.modules, "ray", raising=False)


def run_as(monkeypatch: pytest.MonkeyPatch, ray: types.ModuleType) -> None:
    monkeypatch.setitem(sys.modules, "ray", ray)


@pytest.mark.parametrize(
    ("task", "role"),
    [
        (f"{DEFAULT_WORKER}.initialize_worker", ROLE_WORKER),
        (f"{DEFAULT_WORKER}.__init__", ROLE_WORKER),
        (f"{LEGACY_WORKER}.execute_method", ROLE_WORKER),
        *((f"{actor}.__init__", ROLE_ENGINE_CORE) for actor in ENGINE_ACTORS),
    ],
)
def test_a_vllm_actor_has_the_role_of_its_class(
    monkeypatch: pytest.MonkeyPatch, task: str, role: str
) -> None:
    run_as(monkeypatch, FakeRay(task))
    assert roles.current_role() == role
    assert roles.serves_vllm()
    assert records.process_record({}, [], {})["role"] == role


def test_a_ray_driver_keeps_the_role_its_name_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine process that starts the workers: connected to Ray, no actor;
    Ray warns when such a process asks for a task name."""
    ray = FakeRay(task=None, actor_id=None)
    run_as(monkeypatch, ray)
    assert roles.current_role() == ROLE_MAIN
    assert not ray.context.task_name_asked


@pytest.mark.parametrize(
    "task",
    [
        "ray.serve._private.replica.ServeReplica.handle_request",
        f"{DEFAULT_WORKER}Subclass.initialize_worker",
        None,
    ],
)
def test_another_actor_keeps_the_role_its_name_gives(
    monkeypatch: pytest.MonkeyPatch, task: str | None
) -> None:
    run_as(monkeypatch, FakeRay(task))
    assert roles.current_role() == ROLE_MAIN
    assert not roles.serves_vllm()


def test_ray_loaded_but_not_started_is_not_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = FakeRay(f"{DEFAULT_WORKER}.initialize_worker", initialized=False)
    run_as(monkeypatch, ray)
    assert roles.current_role() == ROLE_MAIN
    assert not ray.context_asked


def test_a_ray_without_these_calls_leaves_the_name_to_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_as(monkeypatch, types.ModuleType("ray"))
    assert roles.current_role() == ROLE_MAIN


class RecordsImports(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        self.asked.append(fullname)
        return None


@pytest.fixture
def imports() -> Iterator[RecordsImports]:
    finder = RecordsImports()
    sys.meta_path.insert(0, finder)
    yield finder
    sys.meta_path.remove(finder)


def test_a_process_without_ray_never_imports_it(imports: RecordsImports) -> None:
    assert roles.current_role() == ROLE_MAIN
    assert "ray" not in imports.asked
    assert "ray" not in sys.modules


def test_the_role_holds_in_threads_the_actor_starts_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = FakeRay(f"{DEFAULT_WORKER}.initialize_worker")
    run_as(monkeypatch, ray)
    assert roles.current_role() == ROLE_WORKER
    ray.context.task = None  # the record writer's thread: no task of vLLM's
    assert roles.current_role() == ROLE_WORKER
    assert records.process_record({}, [], {})["role"] == ROLE_WORKER


def test_a_forked_child_decides_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = FakeRay(f"{DEFAULT_WORKER}.initialize_worker")
    run_as(monkeypatch, ray)
    assert roles.current_role() == ROLE_WORKER
    ray.initialized = False  # a child: Ray is loaded but not connected there
    monkeypatch.setattr(os, "getpid", lambda: -1)
    assert roles.current_role() == ROLE_MAIN


# -- /metrics and the statistics: a Ray worker is counted like a local one -------


@pytest.fixture
def ray_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    run_as(monkeypatch, FakeRay(f"{DEFAULT_WORKER}.initialize_worker"))


@pytest.mark.usefixtures("ray_worker")
def test_a_ray_worker_on_the_servers_machine_joins_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics_dir = tmp_path / "graphsafe-metrics-x"
    metrics_dir.mkdir(mode=0o700)
    monkeypatch.setenv("GRAPHSAFE_METRICS_DIR", str(metrics_dir))
    assert plugin.prepare_metrics_directory() == metrics_dir


@pytest.mark.usefixtures("ray_worker")
def test_a_ray_worker_on_another_machine_leaves_the_servers_directory_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's directory path came with the settings; there is no such
    directory on this machine: nothing is created, nothing is said."""
    absent = tmp_path / "graphsafe-metrics-x"
    monkeypatch.setenv("GRAPHSAFE_METRICS_DIR", str(absent))
    with caplog.at_level(logging.DEBUG):
        assert plugin.prepare_metrics_directory() is None
    assert not absent.exists()
    assert caplog.records == []


@pytest.mark.usefixtures("ray_worker")
def test_a_ray_worker_writes_to_the_statistics_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's metrics directory came with the settings: a Ray worker is no
    process that merely inherited it, and keeps its statistics."""
    monkeypatch.setenv("GRAPHSAFE_METRICS_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GRAPHSAFE_STATS_DIR", str(tmp_path / "stats"))
    assert not plugin.inherits_without_serving(read_settings())
