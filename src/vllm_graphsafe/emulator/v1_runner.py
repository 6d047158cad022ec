"""Binds the graph-hazard emulator to vLLM's V1 model runner (and its CPU subclass).

Installed when the runner's module is imported (so only in the processes that
run a model):

- ``execute_model`` opens and closes a step when it schedules tokens (the only
  dummy run inside it is for an empty step: capture, profiling and warm-up
  dummy runs happen outside it), and forgets finished requests;
- ``CudagraphDispatcher.dispatch``, on the runner's own dispatcher inside an
  open step, records the ``uniform_decode`` it is handed (after any hook on
  ``_is_uniform_decode``);
- ``_model_forward`` runs a step dispatched as uniform decode through a FULL
  decode graph (:mod:`vllm_graphsafe.emulator.replay`);
- the ``ModelRunnerOutput`` gets the first id past the vocabulary for each
  poisoned request; the runner's own token state is left alone, so the engine
  keeps running;
- in the physical mode, ``GDNAttentionMetadataBuilder.build`` keeps each
  step's builds and the buffers a decode step stages, and no id is replaced.
"""

from __future__ import annotations

import importlib
import threading
import weakref
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
from vllm_graphsafe.emulator.replay import FullDecodeGraph

DISPATCHER_CLASS = "CudagraphDispatcher"


class BindError(RuntimeError):
    """This vLLM's runner lacks what the emulator observes."""


class _Step(threading.local):
    runner: Any = None
    observation: StepObservation | None = None
    #: The GDN builds of the open step: metadata id -> (builder, build call).
    builds: dict[int, tuple[Any, dict[str, Any]]]

    def __init__(self) -> None:
        self.builds = {}


class V1RunnerEmulator:
    def __init__(self, state: EmulatorState, mode: str = physical.IDS) -> None:
        self.state = state
        self.physical = mode == physical.PHYSICAL
        self._step = _Step()
        self._graphs: weakref.WeakKeyDictionary[Any, FullDecodeGraph] = (
            weakref.WeakKeyDictionary()
        )
        self._gdn_build: Any = None

    def bind(self, runner_module: ModuleType) -> None:
        runner_class = getattr(runner_module, vllm_layout.V1_RUNNER_CLASS, None)
        dispatcher_module = importlib.import_module(vllm_layout.CUDAGRAPH_DISPATCHER)
        dispatcher_class = getattr(dispatcher_module, DISPATCHER_CLASS, None)
        runner_name = f"{vllm_layout.V1_RUNNER}.{vllm_layout.V1_RUNNER_CLASS}"
        missing = [
            f"{runner_name}.{method}"
            for method in ("execute_model", "_model_forward")
            if not hasattr(runner_class, method)
        ]
        if not hasattr(dispatcher_class, "dispatch"):
            missing.append(f"{dispatcher_module.__name__}.{DISPATCHER_CLASS}.dispatch")
        if missing:
            raise BindError(f"this vLLM has no {', '.join(missing)}")
        wrapt.wrap_function_wrapper(runner_class, "execute_model", self._on_execute)
        if hasattr(runner_class, "sample_tokens"):
            wrapt.wrap_function_wrapper(
                runner_class, "sample_tokens", self._on_sample_tokens
            )
        wrapt.wrap_function_wrapper(dispatcher_class, "dispatch", self._on_dispatch)
        wrapt.wrap_function_wrapper(runner_class, "_model_forward", self._on_forward)
        if not self.physical:
            return
        module = vllm_layout.GDN_ATTENTION_BACKEND
        builder = vllm_layout.GDN_BUILDER_CLASS
        builder_class: Any = getattr(importlib.import_module(module), builder, None)
        if not hasattr(builder_class, "build"):
            raise BindError(f"this vLLM has no {module}.{builder}.build")
        self._gdn_build = builder_class.build
        wrapt.wrap_function_wrapper(builder_class, "build", self._on_gdn_build)

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
            self._step.builds = {}
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

    def _on_forward(
        self, wrapped: Any, runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A step dispatched as uniform decode runs through a FULL decode graph."""
        observation = self._step.observation
        if (
            observation is None
            or not observation.uniform_decode
            or runner is not self._step.runner
        ):
            return wrapped(*args, **kwargs)
        graph = self._graphs.get(runner)
        if graph is None:
            graph = self._graphs[runner] = FullDecodeGraph(runner, self._replay_forward)
        return graph(wrapped, observation, runner.input_batch.num_reqs, args, kwargs)

    def _replay_forward(
        self,
        forward: Any,
        observation: StepObservation,
        context: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """What the captured decode graph computes when it replays this step."""
        observation.replay()
        if not (self.physical and observation.prefill_rows):
            return forward(*args, **kwargs)
        real = context.attn_metadata
        context.attn_metadata = self._replayed_metadata(real)
        try:
            return forward(*args, **kwargs)
        finally:
            context.attn_metadata = real

    def _replayed_metadata(self, per_layer: Any) -> Any:
        """The step's metadata, each linear-attention group's as the captured
        decode graph reads it."""
        if not isinstance(per_layer, dict):
            return per_layer
        replayed: dict[int, Any] = {}
        swapped = dict(per_layer)
        for name, metadata in per_layer.items():
            built = self._step.builds.get(id(metadata))
            if built is None:
                continue
            if id(metadata) not in replayed:
                replayed[id(metadata)] = self._replay_view(*built)
            swapped[name] = replayed[id(metadata)]
        return swapped

    def _replay_view(self, builder: Any, call: dict[str, Any]) -> Any:
        call = dict(call)
        common = call["common_attn_metadata"]
        if builder.use_spec_decode:
            call["num_decode_draft_tokens_cpu"] = physical.decode_draft_counts(
                common.query_start_loc_cpu
            )
        else:
            call["common_attn_metadata"] = common.replace(is_prefilling=None)
        return _staged_buffers(builder).replayed(self._gdn_build(builder, **call))

    def _on_gdn_build(
        self, wrapped: Any, builder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        metadata = wrapped(*args, **kwargs)
        _staged_buffers(builder).record(metadata)
        if self._step.observation is not None:
            self._step.builds[id(metadata)] = (builder, _build_call(args, kwargs))
        return metadata

    def _corrupt(self, runner: Any, output: Any) -> Any:
        if self.physical:
            return output
        req_ids = getattr(output, "req_ids", None)
        sampled = getattr(output, "sampled_token_ids", None)
        if not req_ids or not isinstance(sampled, list) or not self.state.poisoned:
            return output
        # The first id past the model's vocabulary (the width of its logits).
        corrupt_id = int(runner.model_config.get_vocab_size())
        replaced = self.state.corrupt(req_ids, sampled, corrupt_id)
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
