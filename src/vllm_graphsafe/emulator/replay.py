"""The point where a FULL decode CUDA graph replays, made real on a CPU.

A CPU build wraps nothing in vLLM's ``CUDAGraphWrapper`` and dispatches nothing
(its graph mode is NONE). :class:`FullDecodeGraph` is vLLM's own wrapper class
(made without the CUDA graph pool a CPU lacks) around the runner's forward,
called in a forward context switched to FULL with a uniform batch descriptor;
every descriptor is "captured" by an :class:`EmulatedGraph`. So whatever stands
at ``CUDAGraphWrapper.__call__`` on a GPU has its say here before any replay,
and the emulator learns that the graph replayed only when ``replay`` is called.
The model itself always runs with the forward context in mode NONE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.vllm_layout import UNIFORM_BATCH_FLAGS

#: ``replay(forward, observation, context, args, kwargs)``: what the graph computes.
Replay = Callable[[Any, Any, Any, tuple[Any, ...], dict[str, Any]], Any]


class EmulatedGraph:
    """A captured graph: ``replay`` runs the step's forward as the emulator
    says the graph computes it, and leaves the output where vLLM's wrapper
    returns it from (the entry's ``output``)."""

    def __init__(self, entry: Any, replay: Replay, eager_mode: Any) -> None:
        self.entry = entry
        self.replay_step = replay
        self.eager_mode = eager_mode
        self.pending: tuple[Any, Any, tuple[Any, ...], dict[str, Any]] | None = None

    def replay(self) -> None:
        assert self.pending is not None, "a replay outside an emulated step"
        forward, observation, args, kwargs = self.pending
        context = _forward_context()
        mode = context.cudagraph_runtime_mode
        context.cudagraph_runtime_mode = self.eager_mode
        try:
            self.entry.output = self.replay_step(
                forward, observation, context, args, kwargs
            )
        finally:
            context.cudagraph_runtime_mode = mode


class FullDecodeGraph:
    """A runner's FULL ``CUDAGraphWrapper``, its decode graphs emulated."""

    def __init__(self, runner: Any, replay: Replay) -> None:
        cuda_graph = vllm_layout.load(vllm_layout.CUDA_GRAPH)
        modes = vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")
        self.full, self.eager = modes.FULL, modes.NONE
        self.entry_class = cuda_graph.CUDAGraphEntry
        self.replay = replay
        self.forward: Any = None
        # vLLM's wrapper as its ``__init__`` leaves it, without the platform's
        # CUDA graph pool (a CPU platform has none) and without joining the
        # wrappers vLLM clears.
        wrapper_class = getattr(cuda_graph, vllm_layout.CUDA_GRAPH_WRAPPER_CLASS)
        self.wrapper: Any = object.__new__(wrapper_class)
        self.wrapper.__dict__.update(
            runnable=self._run_forward,
            vllm_config=runner.vllm_config,
            runtime_mode=self.full,
            compilation_config=runner.vllm_config.compilation_config,
            first_run_finished=False,
            is_debugging_mode=False,
            _runnable_str=None,
            graph_pool=None,
            cudagraph_options=cuda_graph.CUDAGraphOptions(),
            concrete_cudagraph_entries={},
        )
        descriptor_class = vllm_layout.load_name(
            vllm_layout.FORWARD_CONTEXT, "BatchDescriptor"
        )
        self.fields = {field.name for field in dataclasses.fields(descriptor_class)}
        flags = [flag for flag in UNIFORM_BATCH_FLAGS if flag in self.fields]
        if not flags:
            raise AttributeError(f"BatchDescriptor has none of {UNIFORM_BATCH_FLAGS}")
        self.flag = flags[0]

    def _run_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapper's runnable: what runs when it does not replay."""
        return self.forward(*args, **kwargs)

    def __call__(
        self,
        forward: Any,
        observation: Any,
        num_reqs: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        context = _forward_context()
        saved = context.cudagraph_runtime_mode, context.batch_descriptor
        changes: dict[str, Any] = {self.flag: True}
        if "num_reqs" in self.fields:  # a decode graph is captured per request count
            changes["num_reqs"] = num_reqs
        descriptor = dataclasses.replace(context.batch_descriptor, **changes)
        entries = self.wrapper.concrete_cudagraph_entries
        entry = entries.get(descriptor)
        if entry is None:
            entry = entries[descriptor] = self.entry_class(batch_descriptor=descriptor)
            entry.cudagraph = EmulatedGraph(entry, self.replay, self.eager)
        graph: EmulatedGraph = entry.cudagraph
        graph.pending = (forward, observation, args, kwargs)
        self.forward = forward
        context.cudagraph_runtime_mode, context.batch_descriptor = self.full, descriptor
        try:
            return self.wrapper(*args, **kwargs)
        finally:
            context.cudagraph_runtime_mode, context.batch_descriptor = saved
            graph.pending = None
            self.forward = None


def _forward_context() -> Any:
    return vllm_layout.load_name(vllm_layout.FORWARD_CONTEXT, "get_forward_context")()
