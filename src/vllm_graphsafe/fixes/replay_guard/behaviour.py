"""Is a FULL decode graph's replay guarded? Run the wrapper's call on the cases.

A step holding a prefill row under a uniform (decode) descriptor must not
replay the FULL graph; a decode step must, and so must a FULL graph captured
for mixed batches. Model Runner V2's replay sites cannot run on fakes:
:mod:`.judge` reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from vllm_graphsafe.behaviour.compiled import compiled_runner, shared_code
from vllm_graphsafe.behaviour.fakes import (
    FORWARD_CONTEXT_SLOT,
    Fake,
    descriptor,
    member,
)
from vllm_graphsafe.behaviour.judgement import (
    CannotRun,
    Case,
    Evidence,
    Expect,
    Outcome,
    graph_outcome,
    judge_cases,
)
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import CUDA_GRAPH, CUDA_GRAPH_WRAPPER_CLASS


class Replay(NamedTuple):
    #: Each microbatch's groups, as their builders' prefill counts.
    groups: tuple[tuple[int, ...], ...]
    #: The descriptor is a uniform (decode) batch's.
    uniform: bool = True


def cases() -> list[Case[Replay]]:
    off, on = Expect.KEPT_OFF, Expect.KEPT_ON
    return [
        Case("a decode step over 2 KV-cache groups", on, Replay(((0, 0),))),
        Case("a decode step over 1 KV-cache group", on, Replay(((0,),))),
        Case("a prompt row in 1 of 2 KV-cache groups", off, Replay(((0, 1),))),
        Case("a prompt row in a single KV-cache group", off, Replay(((1,),))),
        Case("prompt rows in every KV-cache group", off, Replay(((2, 3),))),
        Case("a decode step in 2 microbatches", on, Replay(((0, 0), (0, 0)))),
        Case(
            "a prompt row in the second of 2 microbatches",
            off,
            Replay(((0, 0), (0, 1))),
        ),
        Case(
            "a prompt row under a FULL graph captured for mixed batches",
            on,
            Replay(((1,),), uniform=False),
        ),
    ]


def _metadata(groups: tuple[int, ...]) -> dict[str, Any]:
    """One microbatch's layer -> metadata (the 3 layers of a group share one)."""
    layers: dict[str, Any] = {}
    for group, prefills in enumerate(groups):
        shared = Fake("AttentionMetadata", num_prefills=prefills, num_decodes=2)
        for layer in range(3 * group, 3 * group + 3):
            layers[f"model.layers.{layer}.attn"] = shared
    return layers


class Target(NamedTuple):
    make: Callable[[dict[str, Any]], Any]
    modes: Any
    descriptor_type: Any
    call: Any

    def run(self, case: Case[Replay]) -> Outcome:
        full = member(self.modes, "FULL")
        uniform, sizes = case.step.uniform, {"num_tokens": 8, "num_reqs": 2}
        batch = descriptor(self.descriptor_type, **sizes, uniform=uniform)
        if hasattr(batch, "uniform_decode") and not hasattr(batch, "uniform"):
            batch = descriptor(self.descriptor_type, **sizes, uniform_decode=uniform)
        replays: list[bool] = []
        eager: list[bool] = []

        def runnable(*args: Any, **kwargs: Any) -> str:
            eager.append(True)
            return "eager"

        metadata = [_metadata(groups) for groups in case.step.groups]
        context = Fake(
            "ForwardContext",
            cudagraph_runtime_mode=full,
            batch_descriptor=batch,
            attn_metadata=metadata[0] if len(metadata) == 1 else metadata,
        )
        entry = Fake(
            "CUDAGraphEntry",
            batch_descriptor=batch,
            cudagraph=Fake("CUDAGraph", replay=lambda: replays.append(True)),
            output="replayed",
            input_addresses=None,
        )
        wrapper = self.make(
            {
                "runtime_mode": full,
                "runnable": runnable,
                "concrete_cudagraph_entries": {batch: entry},
                "cudagraph_options": Fake(
                    "CUDAGraphOptions", debug_log_enable=False, gc_disable=False
                ),
                "is_debugging_mode": False,
                "graph_pool": None,
            }
        )
        FORWARD_CONTEXT_SLOT[0] = context
        try:
            self.call(wrapper)
        finally:
            FORWARD_CONTEXT_SLOT[0] = None
        replayed = bool(replays)
        if replayed == bool(eager):
            raise CannotRun("the wrapper neither replayed its graph nor ran eagerly")
        said = "replayed the FULL graph" if replayed else "ran without the FULL graph"
        return graph_outcome(case, replayed, said)


def judge_source(sources: SourceReader) -> Evidence:
    code = shared_code(sources)
    if not sources.has_class(CUDA_GRAPH, CUDA_GRAPH_WRAPPER_CLASS):
        raise CannotRun(f"{CUDA_GRAPH} defines no {CUDA_GRAPH_WRAPPER_CLASS}")
    call = code.method(CUDA_GRAPH, CUDA_GRAPH_WRAPPER_CLASS, "__call__")
    if not callable(call):
        raise CannotRun(f"{CUDA_GRAPH_WRAPPER_CLASS} has no __call__ to run")
    target = Target(
        *compiled_runner(sources, CUDA_GRAPH, CUDA_GRAPH_WRAPPER_CLASS), call
    )
    return judge_cases(cases(), target.run)
