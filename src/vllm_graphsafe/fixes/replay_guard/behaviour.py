"""Is a FULL decode graph's replay guarded? Run the wrapper's call on the cases.

``CUDAGraphWrapper.__call__`` (compiled from the tree, never imported) is
called as a FULL wrapper whose graph for the step's batch descriptor is
already captured, in a forward context asking for FULL, with attention
metadata as the builders classified the step's rows. The question: does it
replay the graph, or run its runnable without it? A step holding a prefill
row under a uniform (decode) descriptor must not replay; a decode step must,
and so must a FULL graph captured for mixed batches (its descriptor is not a
decode graph's).

Model Runner V2 replays inline, deep in its step's forward, where its
replay sites cannot be run on fakes: where it exists, those sites are read
(the evidence says so), and a tree is native only where both hold.
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


class Graph:
    """A captured CUDA graph: records its replays."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def _metadata(groups: tuple[int, ...], per_group: int = 3) -> dict[str, Any]:
    """One microbatch's layer -> metadata (the layers of a group share one)."""
    layers: dict[str, Any] = {}
    for group, prefills in enumerate(groups):
        shared = Fake("AttentionMetadata", num_prefills=prefills, num_decodes=2)
        for layer in range(per_group):
            layers[f"model.layers.{group * per_group + layer}.attn"] = shared
    return layers


class Target(NamedTuple):
    make: Callable[[dict[str, Any]], Any]
    modes: Any
    descriptor_type: Any
    #: ``CUDAGraphWrapper.__call__``, run on the wrapper ``make`` builds.
    call: Any

    def run(self, case: Case[Replay]) -> Outcome:
        full = member(self.modes, "FULL")
        batch = descriptor(
            self.descriptor_type, num_tokens=8, num_reqs=2, uniform=case.step.uniform
        )
        if hasattr(batch, "uniform_decode") and not hasattr(batch, "uniform"):
            batch = descriptor(
                self.descriptor_type,
                num_tokens=8,
                num_reqs=2,
                uniform_decode=case.step.uniform,
            )
        graph = Graph()
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
            cudagraph=graph,
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
        replayed = bool(graph.replays)
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
