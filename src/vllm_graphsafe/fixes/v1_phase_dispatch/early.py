"""Pipeline plus sequence parallel on vLLM 0.20-0.31: the worker classifies first.

There ``Worker.execute_model`` calls the runner's dispatch itself (to size the
residual from the previous stage) while the runner's columns still describe the
previous step; such a worker holds the step's scheduler output for the rule.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from vllm_graphsafe.fixes.scheduled_rows import (
    DraftCounting,
    scheduled_rows_are_decodes,
)
from vllm_graphsafe.hook_points import OnFailure

PREPARE_INPUTS = "GPUModelRunner._prepare_inputs"
WORKER_EXECUTE = "Worker.execute_model"
_WORKER_EXECUTE_NAME = WORKER_EXECUTE.rsplit(".", 1)[-1]
READING_WORKER = (
    "Worker.model_runner (its parallel_config.pipeline_parallel_size and "
    "compilation_config.pass_config.enable_sp)"
)

#: The scheduler output of the step each runner is executing, by ``id(runner)``,
#: while its worker's ``execute_model`` runs (only on workers that classify early).
_HELD_STEPS: dict[int, Any] = {}


def classifies_before_state_update(runner: Any) -> bool:
    return bool(
        runner.parallel_config.pipeline_parallel_size > 1
        and runner.compilation_config.pass_config.enable_sp
    )


class StepHoldingExecute:
    """Holds the step's scheduler output where the runner classifies early;
    elsewhere vLLM's own method. Kept in the worker's ``__dict__`` once it has
    its runner, so later steps pay nothing."""

    def __init__(self, original: Any, on_failure: OnFailure) -> None:
        if not hasattr(original, "__get__"):
            raise TypeError(f"{WORKER_EXECUTE} is {type(original).__name__}")
        self.original = original
        self.on_failure = on_failure
        self._workers: weakref.WeakSet[Any] = weakref.WeakSet()
        functools.update_wrapper(self, original)  # type: ignore[arg-type]

    def __get__(self, worker: Any, owner: type | None = None) -> Any:
        if worker is None:
            return self.original
        execute = self.original.__get__(worker, owner)
        if getattr(worker, "model_runner", None) is None:
            return execute  # no runner yet: decided on a later access
        try:
            if classifies_before_state_update(worker.model_runner):
                execute = _holding_the_step(execute, worker)
        except Exception as error:
            self.on_failure(error, READING_WORKER)
            return execute
        try:
            self._workers.add(worker)
            worker.__dict__[_WORKER_EXECUTE_NAME] = execute
        except (AttributeError, TypeError):
            self._workers.discard(worker)  # decided again on each access
        return execute

    def release(self) -> None:
        for worker in list(self._workers):
            worker.__dict__.pop(_WORKER_EXECUTE_NAME, None)
        self._workers = weakref.WeakSet()


def _holding_the_step(execute: Callable[..., Any], worker: Any) -> Callable[..., Any]:
    @functools.wraps(execute)
    def execute_model_holding_its_step(*args: Any, **kwargs: Any) -> Any:
        key = id(worker.model_runner)
        _HELD_STEPS[key] = args[0] if args else kwargs.get("scheduler_output")
        try:
            return execute(*args, **kwargs)
        finally:
            _HELD_STEPS.pop(key, None)

    return execute_model_holding_its_step


class ScheduledStepRule:
    """Whether every row of the step a runner executes is a decode, from the
    step's scheduler output (``counting`` None: unrecognised, so a step with
    drafts fails the fix open)."""

    def __init__(self, counting: DraftCounting | None) -> None:
        self._counting = counting

    def __call__(self, runner: Any, decode_query_len: int) -> bool:
        step = _HELD_STEPS.get(id(runner))
        if step is None:
            raise LookupError(
                "no scheduler output is held for this step: the runner classified "
                f"a step outside its worker's {_WORKER_EXECUTE_NAME}"
            )
        num_drafts = decode_query_len - 1
        counting = self._counting if num_drafts else DraftCounting()
        if counting is None:
            raise LookupError(
                f"{PREPARE_INPUTS} counts draft tokens in a way this plugin "
                "does not recognise"
            )
        new_requests = step.scheduled_new_reqs
        computed = {
            request.req_id: request.num_computed_tokens for request in new_requests
        }
        cached = step.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        new_by_id = {request.req_id: request for request in new_requests}

        def prompt_length(req_id: str) -> int:
            request = new_by_id.get(req_id)
            if request is None:
                return int(runner.requests[req_id].num_prompt_tokens)
            tokens = request.prompt_token_ids
            return len(tokens if tokens is not None else request.prompt_embeds)

        return scheduled_rows_are_decodes(
            step.num_scheduled_tokens,
            step.scheduled_spec_decode_tokens,
            computed,
            prompt_length,
            num_drafts,
            counting,
        )
