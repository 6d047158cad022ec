"""Record, in an in-process vLLM engine, what each real step scheduled and dispatched.

Shared by ``tests/engine/emulator/engine_steps.py`` and
``tests/engine/dispatch_steps.py`` (and the server-side
:mod:`tests.engine.emulator.step_log`). Two wrappers, independent of the plugin
and of the emulator:

``GPUModelRunner.execute_model``
    opens a step when the scheduler scheduled tokens and notes, from the
    scheduler's output, the requests scheduled (``scheduled``), their widths
    (``widths``), those that had not computed their whole prompt before the
    step (``in_prompt``: new requests' computed counts against their prompt,
    cached ones against the runner's request record) and those a hybrid
    model's attention metadata builders run as prefills (``prefill_rows``,
    :func:`vllm_graphsafe.emulator.hazard.step_prefill_rows`);
``CudagraphDispatcher.dispatch``
    inside an open step, notes the ``uniform_decode`` the runner handed to the
    dispatcher: the first call of the step or the last (``dispatch_call``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import wrapt

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.emulator.hazard import step_prefill_rows

RUNNER_MODULE = vllm_layout.V1_RUNNER
DISPATCHER_MODULE = vllm_layout.CUDAGRAPH_DISPATCHER

Step = dict[str, Any]


def prompt_rows(runner: Any, scheduler_output: Any) -> list[str]:
    """The scheduled requests that had not computed their whole prompt."""
    rows = [
        new.req_id
        for new in scheduler_output.scheduled_new_reqs
        if new.num_computed_tokens < len(new.prompt_token_ids)
    ]
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, computed in zip(
        cached.req_ids, cached.num_computed_tokens, strict=True
    ):
        if computed < runner.requests[req_id].num_prompt_tokens:
            rows.append(req_id)
    return sorted(rows)


class StepRecorder:
    """``steps``: one dict per real step (``scheduled``, ``widths``,
    ``in_prompt``, ``prefill_rows``, ``uniform_decode``); ``on_step`` is
    called with each."""

    def __init__(
        self,
        dispatch_call: Literal["first", "last"],
        on_step: Callable[[Step], None] | None = None,
    ) -> None:
        self.dispatch_call = dispatch_call
        self.on_step = on_step
        self.steps: list[Step] = []
        self._current: Step | None = None

    def install(self) -> StepRecorder:
        wrapt.wrap_function_wrapper(
            RUNNER_MODULE, "GPUModelRunner.execute_model", self._record_step
        )
        wrapt.wrap_function_wrapper(
            DISPATCHER_MODULE, "CudagraphDispatcher.dispatch", self._record_dispatch
        )
        return self

    def _record_step(self, wrapped: Any, runner: Any, args: Any, kwargs: Any) -> Any:
        scheduler_output = args[0] if args else kwargs["scheduler_output"]
        if not scheduler_output.total_num_scheduled_tokens or self._current is not None:
            return wrapped(*args, **kwargs)
        scheduled = scheduler_output.num_scheduled_tokens
        step: Step = {
            "scheduled": sorted(scheduled),
            "widths": list(scheduled.values()),
            "in_prompt": prompt_rows(runner, scheduler_output),
            "prefill_rows": list(step_prefill_rows(scheduler_output)),
            "uniform_decode": None,
        }
        self._current = step
        try:
            return wrapped(*args, **kwargs)
        finally:
            self._current = None
            self.steps.append(step)
            if self.on_step is not None:
                self.on_step(step)

    def _record_dispatch(
        self, wrapped: Any, instance: Any, args: Any, kwargs: Any
    ) -> Any:
        step = self._current
        if step is not None and (
            self.dispatch_call == "last" or step["uniform_decode"] is None
        ):
            step["uniform_decode"] = bool(kwargs.get("uniform_decode", False))
        return wrapped(*args, **kwargs)
