"""Log, in every vLLM worker of a served engine, what each real step scheduled.

Load it as the server's worker extension (``--worker-extension-cls``
:data:`WORKER_EXTENSION`) and set ``GRAPHSAFE_BENCH_STEP_LOG`` to a directory:
importing this module in a worker wraps the V1 runner's ``execute_model`` and
the CUDA graph dispatcher, and the worker appends one JSON line per step that
schedules tokens to ``<dir>/<pid>.jsonl``:

- ``widths``: the tokens scheduled for each request;
- ``in_prompt``: whether a scheduled request had not computed its whole prompt
  before the step;
- ``prefill_rows``: whether the attention metadata builders run a scheduled
  row as a prefill (:func:`vllm_graphsafe.emulator.hazard.step_prefill_rows`:
  a row is a decode when it schedules one token plus the drafts the scheduler
  handed it, or one token over prior state). A prompt tail the scheduler pads
  with placeholder drafts is in its prompt yet a decode to the builders;
- ``uniform_decode``: what the runner last handed the dispatcher as
  ``uniform_decode`` during the step (None when it did not dispatch).

All but the last come from the scheduler's output, independently of the plugin.

Appending a line per step keeps a long soak's log linear in its length; the
soak benchmark and its CI test read it back with :func:`read_steps`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.emulator.hazard import step_prefill_rows

STEP_LOG_ENV = "GRAPHSAFE_BENCH_STEP_LOG"
WORKER_EXTENSION = f"{__name__}.StepLogExtension"


class StepLogExtension:
    """Adds nothing to the worker: importing this module installs the log."""


def holds_prompt_tokens(runner: Any, scheduler_output: Any) -> bool:
    """Whether a scheduled request had computed less than its whole prompt:
    new requests by their own counts, cached ones by the runner's record."""
    for new in scheduler_output.scheduled_new_reqs:
        if new.num_computed_tokens < len(new.prompt_token_ids):
            return True
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, computed in zip(
        cached.req_ids, cached.num_computed_tokens, strict=True
    ):
        if computed < runner.requests[req_id].num_prompt_tokens:
            return True
    return False


class _StepLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: dict[str, Any] | None = None

    def record_step(self, wrapped: Any, runner: Any, args: Any, kwargs: Any) -> Any:
        scheduler_output = args[0] if args else kwargs["scheduler_output"]
        # A nested call (a runner that calls itself) belongs to the open step.
        if not scheduler_output.total_num_scheduled_tokens or self.current is not None:
            return wrapped(*args, **kwargs)
        step: dict[str, Any] = {
            "widths": list(scheduler_output.num_scheduled_tokens.values()),
            "in_prompt": holds_prompt_tokens(runner, scheduler_output),
            "prefill_rows": bool(step_prefill_rows(scheduler_output)),
            "uniform_decode": None,
        }
        self.current = step
        try:
            return wrapped(*args, **kwargs)
        finally:
            self.current = None
            with open(self.path, "a", encoding="utf-8") as log:
                log.write(json.dumps(step) + "\n")

    def record_dispatch(
        self, wrapped: Any, instance: Any, args: Any, kwargs: Any
    ) -> Any:
        if self.current is not None:
            # dispatch(num_tokens, uniform_decode=False, ...), self excluded
            positional = args[1] if len(args) > 1 else False
            self.current["uniform_decode"] = bool(
                kwargs.get("uniform_decode", positional)
            )
        return wrapped(*args, **kwargs)


def read_steps(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every logged step of every worker that wrote to ``directory``.

    A last line without its newline (a worker stopped mid-write) is left out.
    """
    steps: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        text = path.read_text(encoding="utf-8")
        complete = text[: text.rfind("\n") + 1]
        steps += [json.loads(line) for line in complete.splitlines() if line]
    return steps


def _install(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = _StepLog(path)
    wrapt.wrap_function_wrapper(
        vllm_layout.V1_RUNNER, "GPUModelRunner.execute_model", log.record_step
    )
    wrapt.wrap_function_wrapper(
        vllm_layout.CUDAGRAPH_DISPATCHER,
        "CudagraphDispatcher.dispatch",
        log.record_dispatch,
    )


if os.environ.get(STEP_LOG_ENV):
    _install(Path(os.environ[STEP_LOG_ENV]) / f"{os.getpid()}.jsonl")
