"""Binds the graph-hazard emulator to vLLM's V1 model runner (and its CPU subclass).

Three wrappers, installed when ``vllm.v1.worker.gpu_model_runner`` is imported
(so only in the processes that run a model):

``GPUModelRunner.execute_model``
    opens a step when it schedules tokens (the only dummy run inside it is for
    an empty step: capture, profiling and warm-up dummy runs happen outside it),
    forgets finished requests, and closes the step: a hazardous step poisons
    every request it scheduled.
``CudagraphDispatcher.dispatch``
    inside an open step, on the runner's own dispatcher: records the
    ``uniform_decode`` it is handed (after any hook on ``_is_uniform_decode``).
    Which scheduled rows a hybrid model's metadata builders run as prefills
    comes from the step's scheduler output
    (:func:`vllm_graphsafe.emulator.hazard.step_prefill_rows`).
``GPUModelRunner.execute_model`` / ``sample_tokens`` return values
    a ``ModelRunnerOutput``'s sampled ids of poisoned requests are replaced by
    the first id past the vocabulary. The runner's own token state is left
    alone: the API answer carries the corruption, the engine keeps running.

In the physical mode (:mod:`vllm_graphsafe.emulator.physical`) no id is
replaced; a fourth wrapper, on ``GDNAttentionMetadataBuilder.build``, builds a
hazardous step's linear-attention metadata as the FULL decode graph's replay
would read it, and vLLM's own kernels corrupt the recurrent state.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.emulator import physical
from vllm_graphsafe.emulator.hazard import (
    EmulatorState,
    StepObservation,
    dispatched_uniform_decode,
    step_prefill_rows,
)

RUNNER_MODULE = vllm_layout.V1_RUNNER
DISPATCHER_MODULE = vllm_layout.CUDAGRAPH_DISPATCHER
RUNNER_CLASS = "GPUModelRunner"
DISPATCHER_CLASS = "CudagraphDispatcher"


class BindError(RuntimeError):
    """This vLLM's runner lacks what the emulator observes."""


class _Step(threading.local):
    runner: Any = None
    observation: StepObservation | None = None


class V1RunnerEmulator:
    def __init__(self, state: EmulatorState, mode: str = physical.IDS) -> None:
        self.state = state
        self.physical = mode == physical.PHYSICAL
        self._step = _Step()

    def bind(self, runner_module: ModuleType) -> None:
        runner_class = getattr(runner_module, RUNNER_CLASS, None)
        dispatcher_module = importlib.import_module(DISPATCHER_MODULE)
        dispatcher_class = getattr(dispatcher_module, DISPATCHER_CLASS, None)
        missing = [
            f"{RUNNER_MODULE}.{RUNNER_CLASS}.execute_model"
            for owner in (runner_class,)
            if not hasattr(owner, "execute_model")
        ] + [
            f"{DISPATCHER_MODULE}.{DISPATCHER_CLASS}.dispatch"
            for owner in (dispatcher_class,)
            if not hasattr(owner, "dispatch")
        ]
        if missing:
            raise BindError(f"this vLLM has no {', '.join(missing)}")
        wrapt.wrap_function_wrapper(runner_class, "execute_model", self._on_execute)
        if hasattr(runner_class, "sample_tokens"):
            wrapt.wrap_function_wrapper(
                runner_class, "sample_tokens", self._on_sample_tokens
            )
        wrapt.wrap_function_wrapper(dispatcher_class, "dispatch", self._on_dispatch)
        if self.physical:
            self._bind_physical()

    def _bind_physical(self) -> None:
        module = vllm_layout.GDN_ATTENTION_BACKEND
        builder = vllm_layout.GDN_BUILDER_CLASS
        builder_class = getattr(importlib.import_module(module), builder, None)
        if not hasattr(builder_class, "build"):
            raise BindError(f"this vLLM has no {module}.{builder}.build")
        wrapt.wrap_function_wrapper(builder_class, "build", self._on_gdn_build)

    # ----------------------------------------------------------------- wrappers

    def _on_execute(
        self, wrapped: Any, runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self._step.observation is not None:  # a subclass calling super()
            return wrapped(*args, **kwargs)
        scheduler_output: Any = args[0] if args else kwargs.get("scheduler_output")
        self.state.forget(getattr(scheduler_output, "finished_req_ids", None) or ())
        if not getattr(scheduler_output, "total_num_scheduled_tokens", 0):
            return self._corrupt(runner, wrapped(*args, **kwargs))
        scheduled = tuple(scheduler_output.num_scheduled_tokens)
        observation = StepObservation(scheduled, step_prefill_rows(scheduler_output))
        self._step.runner, self._step.observation = runner, observation
        try:
            output = wrapped(*args, **kwargs)
        finally:
            self._step.runner, self._step.observation = None, None
        self.state.finish_step(observation)
        return self._corrupt(runner, output)

    def _on_sample_tokens(
        self, wrapped: Any, runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self._corrupt(runner, wrapped(*args, **kwargs))

    def _on_dispatch(
        self,
        wrapped: Any,
        dispatcher: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        observation, runner = self._step.observation, self._step.runner
        if observation is not None and dispatcher is getattr(
            runner, "cudagraph_dispatcher", None
        ):
            # ``dispatch`` is wrapped on the class: ``args`` excludes self.
            observation.observe(dispatched_uniform_decode(args, kwargs))
        return wrapped(*args, **kwargs)

    def _on_gdn_build(
        self, wrapped: Any, builder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        staged = _staged_buffers(builder)
        observation = self._step.observation
        if observation is None or not observation.hazardous:
            metadata = wrapped(*args, **kwargs)
            staged.record(metadata)
            return metadata
        call = _build_call(args, kwargs)
        common = call["common_attn_metadata"]
        if builder.use_spec_decode:
            call["num_decode_draft_tokens_cpu"] = physical.decode_draft_counts(
                common.query_start_loc_cpu
            )
        else:
            call["common_attn_metadata"] = common.replace(is_prefilling=None)
        return staged.replayed(wrapped(**call))

    # ------------------------------------------------------------------ helpers

    def _corrupt(self, runner: Any, output: Any) -> Any:
        if self.physical:
            return output
        req_ids = getattr(output, "req_ids", None)
        sampled = getattr(output, "sampled_token_ids", None)
        if not req_ids or not isinstance(sampled, list) or not self.state.poisoned:
            return output
        replaced = self.state.corrupt(req_ids, sampled, corrupt_token_id(runner))
        if replaced is not None:
            output.sampled_token_ids = replaced
        return output


_BUILD_PARAMETERS = (
    "common_prefix_len",
    "common_attn_metadata",
    "num_accepted_tokens",
    "num_decode_draft_tokens_cpu",
    "fast_build",
)


def _build_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``GDNAttentionMetadataBuilder.build``'s arguments, all by name."""
    return {**dict(zip(_BUILD_PARAMETERS, args, strict=False)), **kwargs}


def _staged_buffers(builder: Any) -> physical.StagedBuffers:
    staged = getattr(builder, "_graphsafe_staged", None)
    if staged is None:
        staged = physical.StagedBuffers()
        builder._graphsafe_staged = staged
    return staged


def corrupt_token_id(runner: Any) -> int:
    """The first id past the model's vocabulary (the width of its logits)."""
    return int(runner.model_config.get_vocab_size())
