"""Record, in every vLLM worker, how each step reached the CUDA graph dispatcher.

Load it as vLLM's worker extension (``--worker-extension-cls``, see
:data:`WORKER_EXTENSION`): importing this module in a worker wraps three
functions of the V1 runner's module, and each worker process then writes
``<GRAPHSAFE_TEST_STEP_DIR>/<pid>.json`` after every step. It observes vLLM
itself, independently of the plugin, so a test can compare runs with and without
the plugin:

- the ground truth comes from the scheduler: a step holds prefill rows when the
  attention metadata builders of a hybrid model run a scheduled row as a
  prefill (:func:`vllm_graphsafe.emulator.hazard.step_prefill_rows`);
- ``uniform_decode`` is what the runner handed to the dispatcher on that step;
- ``sync`` numbers this process's calls of ``coordinate_batch_across_dp``, the
  collective that data-parallel ranks all enter once per step (real or dummy),
  so equal numbers on two ranks mean the same synchronised step (meaningful
  only with data parallelism; without it the call exchanges nothing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.emulator.hazard import step_prefill_rows

#: Where each worker writes its steps; unset means record nothing.
STEP_DIR_ENV = "GRAPHSAFE_TEST_STEP_DIR"
#: The value for ``--worker-extension-cls``.
WORKER_EXTENSION = f"{__name__}.StepRecorderExtension"
RUNNER_MODULE = vllm_layout.V1_RUNNER


class StepRecorderExtension:
    """Adds nothing to the worker: importing this module is what installs the
    recorder in the worker process."""


class _Recorder:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: dict[str, Any] = {"pid": os.getpid(), "ppid": os.getppid()}
        self.steps: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.syncs = 0

    def record_step(self, wrapped: Any, runner: Any, args: Any, kwargs: Any) -> Any:
        scheduler_output = args[0] if args else kwargs["scheduler_output"]
        if not scheduler_output.num_scheduled_tokens:
            return wrapped(*args, **kwargs)
        self._note_ranks(runner)
        self.current = {
            "sync": None,
            "widths": list(scheduler_output.num_scheduled_tokens.values()),
            "holds_prefill_rows": bool(step_prefill_rows(scheduler_output)),
            "uniform_decode": None,
        }
        try:
            return wrapped(*args, **kwargs)
        finally:
            self.steps.append(self.current)
            self.current = None
            self._write()

    def record_dispatch(
        self, wrapped: Any, instance: Any, args: Any, kwargs: Any
    ) -> Any:
        if self.current is not None and self.current["uniform_decode"] is None:
            self.current["uniform_decode"] = bool(kwargs.get("uniform_decode", False))
        return wrapped(*args, **kwargs)

    def record_sync(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if _coordination_skipped():
            return wrapped(*args, **kwargs)
        self.syncs += 1
        if self.current is not None and self.current["sync"] is None:
            self.current["sync"] = self.syncs
        return wrapped(*args, **kwargs)

    def _note_ranks(self, runner: Any) -> None:
        if "dp_rank" in self.process:
            return
        parallel = runner.parallel_config
        self.process["dp_rank"] = int(parallel.data_parallel_rank)
        self.process["dp_size"] = int(parallel.data_parallel_size)
        self.process["tp_size"] = int(parallel.tensor_parallel_size)
        try:
            get_tensor_model_parallel_rank = vllm_layout.load_name(
                vllm_layout.DISTRIBUTED, "get_tensor_model_parallel_rank"
            )

            self.process["tp_rank"] = int(get_tensor_model_parallel_rank())
        except (ImportError, AssertionError):
            self.process["tp_rank"] = None

    def _write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"{os.getpid()}.json"
        staging = target.with_suffix(".tmp")
        payload = {**self.process, "syncs": self.syncs, "steps": self.steps}
        staging.write_text(json.dumps(payload))
        staging.replace(target)


def _coordination_skipped() -> bool:
    """Whether vLLM skips the collective for this call (0.32 can, 0.27 cannot);
    a skipped call exchanges nothing, so it numbers no step."""
    try:
        should_skip_dp_coordination = vllm_layout.load_name(
            vllm_layout.V1_DP_UTILS, "should_skip_dp_coordination"
        )
    except ImportError:
        return False
    return bool(should_skip_dp_coordination())


def read_step_files(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every worker's record (``pid``, ranks, ``steps``), in pid order."""
    if not Path(directory).is_dir():
        return []
    return [
        json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))
    ]


def has_decode_shape(step: dict[str, Any], spec_tokens: int) -> bool:
    """Every scheduled request has ``K+1`` tokens: a uniform decode by shape."""
    return set(step["widths"]) == {spec_tokens + 1}


def is_boundary_prefill(step: dict[str, Any], spec_tokens: int) -> bool:
    """A step that holds prefill rows yet has the uniform decode shape."""
    return bool(step["holds_prefill_rows"]) and has_decode_shape(step, spec_tokens)


def is_genuine_decode(step: dict[str, Any], spec_tokens: int) -> bool:
    """A decode-shaped step whose rows are all decodes to the builders."""
    return not step["holds_prefill_rows"] and has_decode_shape(step, spec_tokens)


def misdispatched_prefills(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps that held prefill rows and still reached the dispatcher as uniform."""
    return [
        step for step in steps if step["holds_prefill_rows"] and step["uniform_decode"]
    ]


def _install(directory: Path) -> None:
    recorder = _Recorder(directory)
    wrapt.wrap_function_wrapper(
        RUNNER_MODULE, "GPUModelRunner.execute_model", recorder.record_step
    )
    wrapt.wrap_function_wrapper(
        vllm_layout.CUDAGRAPH_DISPATCHER,
        "CudagraphDispatcher.dispatch",
        recorder.record_dispatch,
    )
    wrapt.wrap_function_wrapper(
        RUNNER_MODULE, "coordinate_batch_across_dp", recorder.record_sync
    )


if os.environ.get(STEP_DIR_ENV):
    _install(Path(os.environ[STEP_DIR_ENV]))
