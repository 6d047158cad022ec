"""What the replay guard reads of vLLM's source, and its verdict there."""

from __future__ import annotations

import ast
from typing import Any, NamedTuple

from vllm_graphsafe import recognition
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.fixes.replay_guard.eager_branch import METADATA_LOCAL, replay_branch
from vllm_graphsafe.judging import FixJudge, Layout, Point, Requirement, SetsAttribute
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import (
    CUDA_GRAPH,
    CUDA_GRAPH_WRAPPER_CLASS,
    FORWARD_CONTEXT,
    MRV2_CUDAGRAPH_UTILS,
    MRV2_RUNNER,
)

WRAPPER_CALL = f"{CUDA_GRAPH_WRAPPER_CLASS}.__call__"
#: The target model's replay, called by ``execute_model``.
TARGET_REPLAY = "ModelCudaGraphManager.run_fullgraph"
#: Every manager's replay (the speculators' managers inherit it).
REPLAY = "CudaGraphManager.run_fullgraph"
RUNNER_STEP = "GPUModelRunner.execute_model"
#: The hooks' roles (:mod:`.hooks` installs one per point).
WRAPPER_ROLE = "guarded wrapper call"
TARGET_REPLAY_ROLE = "guarded target replay"
REPLAY_ROLE = "guarded replay"


def stores_attribute(node: ast.AST, attribute: str) -> bool:
    return any(
        isinstance(target, ast.Attribute) and target.attr == attribute
        for child in recognition.walk(node)
        if isinstance(child, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (
            child.targets if isinstance(child, ast.Assign) else [child.target]
        )
    )


def reads_prefill_counts(
    sources: SourceReader, modules: tuple[str, ...], node: ast.AST, depth: int = 2
) -> bool:
    """Whether ``node``, or a function of ``modules`` it calls by name (and so
    on, ``depth`` calls deep), reads the builders' ``num_prefills``."""
    if "num_prefills" in recognition.referenced_names(node):
        return True
    if depth == 0:
        return False
    for call in recognition.calls(node):
        if not isinstance(call.func, ast.Name):
            continue
        for module in modules:
            helper = sources.function_node(module, call.func.id)
            if helper is not None and reads_prefill_counts(
                sources, modules, helper, depth - 1
            ):
                return True
    return False


class ReplaysInBranch(NamedTuple):
    """``execute_model`` replays its FULL graph in an if/else on the graph
    mode beside the step's ``attn_metadata`` (the guard runs that else)."""

    module: str
    qualname: str

    def missing(self, sources: SourceReader) -> str | None:
        node = sources.function_node(self.module, self.qualname)
        if node is None:
            return f"{self.module}.{self.qualname} is missing (read by {REPLAY})"
        branch = replay_branch(node)
        if branch is None or METADATA_LOCAL not in recognition.assigned_names(node):
            return (
                f"{self.module}.{self.qualname} no longer replays its FULL graph "
                f"in an if/else on the graph mode beside {METADATA_LOCAL} "
                f"(read by {REPLAY})"
            )
        return None


def layout(sources: SourceReader) -> dict[str, Any]:
    """``mrv2``: this vLLM has Model Runner V2, whose replays are guarded too."""
    return {"mrv2": sources.exists(MRV2_RUNNER)}


def points(layout: Layout) -> list[Point]:
    found = [Point(CUDA_GRAPH, WRAPPER_CALL, WRAPPER_ROLE)]
    if layout["mrv2"]:
        found += [
            Point(MRV2_CUDAGRAPH_UTILS, TARGET_REPLAY, TARGET_REPLAY_ROLE),
            Point(MRV2_CUDAGRAPH_UTILS, REPLAY, REPLAY_ROLE),
        ]
    return found


def reads(layout: Layout) -> list[Requirement]:
    found: list[Requirement] = [
        SetsAttribute(CUDA_GRAPH, CUDA_GRAPH_WRAPPER_CLASS, name, WRAPPER_CALL)
        for name in ("runtime_mode", "runnable")
    ]
    found += [
        SetsAttribute(FORWARD_CONTEXT, "ForwardContext", name, WRAPPER_CALL)
        for name in ("cudagraph_runtime_mode", "batch_descriptor", "attn_metadata")
    ]
    if layout["mrv2"]:
        found.append(ReplaysInBranch(MRV2_RUNNER, RUNNER_STEP))
    return found


def mrv2_native_reason(sources: SourceReader) -> str | None:
    """Model Runner V2's step itself leaves the FULL graph when its metadata
    holds a prefill: it reads ``num_prefills`` (itself or through a module
    function) and binds the tested batch descriptor again before the replay's
    branch."""
    node = sources.function_node(MRV2_RUNNER, RUNNER_STEP)
    if node is None:
        return None
    branch = replay_branch(node)
    modules = (MRV2_RUNNER, MRV2_CUDAGRAPH_UTILS, CUDA_GRAPH)
    if branch is None or not reads_prefill_counts(sources, modules, node):
        return None
    rebinds = sum(
        isinstance(child, ast.Name)
        and isinstance(child.ctx, ast.Store)
        and child.id == branch.descriptor
        for child in ast.walk(node)
    )
    if rebinds < 2:
        return None
    return f"{RUNNER_STEP} leaves the FULL graph when its metadata holds a prefill"


def native_reason(sources: SourceReader) -> str | None:
    """Native only where ``CUDAGraphWrapper.__call__`` switches the forward
    context's mode and reads the builders' ``num_prefills``, and Model Runner
    V2's step (where it exists) does the same. No release does: an assert or a
    raise at the replay (vllm-project/vllm#55123) stops the server and is not
    this fix."""
    call = sources.function_node(CUDA_GRAPH, WRAPPER_CALL)
    if call is None or not stores_attribute(call, "cudagraph_runtime_mode"):
        return None
    if not reads_prefill_counts(sources, (CUDA_GRAPH,), call):
        return None
    if sources.exists(MRV2_RUNNER) and mrv2_native_reason(sources) is None:
        return None
    return (
        f"{WRAPPER_CALL} runs a step whose attention metadata holds a prefill "
        "without the FULL graph"
    )


def behaviour(sources: SourceReader) -> Evidence:
    """The wrapper's cases; Model Runner V2's replay sites, which cannot run
    on fakes, are read where the wrapper passes them all."""
    from vllm_graphsafe.fixes.replay_guard.behaviour import judge_source

    evidence = judge_source(sources)
    if not sources.exists(MRV2_RUNNER) or not evidence.native:
        # Where the wrapper already fails a case (or could not run one), what
        # Model Runner V2's sites say cannot make the tree native.
        return evidence
    if not mrv2_native_reason(sources):
        return evidence._replace(
            failed="Model Runner V2 replays its decode graphs unguarded (read: its "
            "replay sites hand no step holding a prefill to its eager path)",
        )
    return evidence._replace(
        note="Model Runner V2's replay sites read, as they cannot run on fakes",
    )


JUDGE = FixJudge(
    native_summary=(
        "a FULL decode graph never replays over a step whose attention metadata "
        "holds a prefill"
    ),
    behaviour=behaviour,
    native_reason=native_reason,
    points=points,
    layout=layout,
    reads=reads,
)
