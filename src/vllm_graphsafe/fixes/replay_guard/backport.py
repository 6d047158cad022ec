"""replay-guard as a source edit: plain vLLM code deciding as the runtime hooks
do. ``CUDAGraphWrapper.__call__`` runs eagerly a FULL uniform replay over
metadata holding a prefill; on Model Runner V2 each replay site first rebinds
its descriptor through ``graphsafe_leave_decode_graph_for_prefill``, taking its
own eager path. Every added name starts with ``graphsafe_`` (recognisably ours).
"""

from __future__ import annotations

import ast

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes.replay_guard import FIX
from vllm_graphsafe.fixes.replay_guard.eager_branch import (
    METADATA_LOCAL,
    eager_metadata,
    replay_branch,
)
from vllm_graphsafe.fixes.replay_guard.judge import WRAPPER_CALL
from vllm_graphsafe.tree_edits.imports import rewrite_import
from vllm_graphsafe.tree_edits.plan import (
    Plan,
    edit,
    render_written_tests,
    written_test_path,
)
from vllm_graphsafe.tree_edits.source import LineEdit, MissingSymbolError, SourceFile
from vllm_graphsafe.tree_edits.tree import Tree
from vllm_graphsafe.vllm_layout import (
    CUDA_GRAPH,
    CUDA_GRAPH_WRAPPER_CLASS,
    FORWARD_CONTEXT,
    MRV2_CUDAGRAPH_UTILS,
    MRV2_RUNNER,
    MRV2_SPECULATORS,
    UNIFORM_BATCH_FLAGS,
)

HAS_PREFILL = "graphsafe_attn_metadata_has_prefill"
LEAVE_DECODE_GRAPH = "graphsafe_leave_decode_graph_for_prefill"

_HAS_PREFILL_HELPER = '''\
# Per number of layers: one layer per attention metadata object that counts its
# prefill rows (the layers of a KV-cache group share one object).
_graphsafe_prefill_counting_layers: dict[int, tuple[str, ...]] = {}


def graphsafe_attn_metadata_has_prefill(
    attn_metadata: dict[str, Any] | list[dict[str, Any]] | None,
) -> bool:
    """Whether a KV-cache group's attention metadata holds a prefill row, as
    its builder counted the rows (``num_prefills``).

    Each group's metadata is read once; builders that count no rows (varlen
    kernels) are skipped. The counts are host integers: no GPU synchronisation.
    A FULL CUDA graph captured for uniform decode must not replay over such a
    step (vllm-graphsafe replay guard).
    """
    if attn_metadata is None:
        return False
    if not isinstance(attn_metadata, list):
        attn_metadata = [attn_metadata]
    for per_layer in attn_metadata:
        layers = _graphsafe_prefill_counting_layers.get(len(per_layer))
        if layers is None or any(name not in per_layer for name in layers):
            seen: set[int] = set()
            found = []
            for name, metadata in per_layer.items():
                if id(metadata) not in seen:
                    seen.add(id(metadata))
                    if type(getattr(metadata, "num_prefills", None)) is int:
                        found.append(name)
            layers = tuple(found)
            _graphsafe_prefill_counting_layers[len(per_layer)] = layers
        if any(per_layer[name].num_prefills for name in layers):
            return True
    return False


'''

_WRAPPER_GUARD = """
if (
    cudagraph_runtime_mode == CUDAGraphMode.FULL
    and batch_descriptor is not None
    and batch_descriptor.{flag}
    and graphsafe_attn_metadata_has_prefill(forward_context.attn_metadata)
):
    # A FULL graph captured for uniform decode never replays over a
    # step whose attention metadata holds a prefill row: run the step
    # eagerly, same padded inputs (vllm-graphsafe replay guard).
    logger.warning_once(
        "A step whose attention metadata holds a prefill was about to replay "
        "a FULL decode CUDA graph (%s); it runs without the graph.",
        batch_descriptor,
    )
    forward_context.cudagraph_runtime_mode = CUDAGraphMode.NONE
    try:
        return self.runnable(*args, **kwargs)
    finally:
        forward_context.cudagraph_runtime_mode = cudagraph_runtime_mode
"""

_LEAVE_DECODE_GRAPH_HELPER = '''\


def graphsafe_leave_decode_graph_for_prefill(
    desc: BatchExecutionDescriptor,
    attn_metadata: dict[str, Any] | list[dict[str, Any]] | None,
) -> BatchExecutionDescriptor:
    """``desc``, or a copy in mode NONE where a FULL decode graph would
    replay over attention metadata holding a prefill row: the caller then
    takes its eager path, with the same padded token count (vllm-graphsafe
    replay guard). A decode graph has {decode_doc}."""
    if desc.cg_mode != CUDAGraphMode.FULL or (
        desc.uniform_token_count is None{varlen_test}
    ):
        return desc
    if not graphsafe_attn_metadata_has_prefill(attn_metadata):
        return desc
    logger.warning_once(
        "A step whose attention metadata holds a prefill was about to replay "
        "a FULL decode CUDA graph (%s); it runs without the graph.",
        desc,
    )
    return replace(desc, cg_mode=CUDAGraphMode.NONE)
'''
_UNIFORM_DOC = "a uniform token count"
_VARLEN_DOC = "a uniform token count or a varlen decode bound"
_VARLEN_TEST = " and desc.max_query_len is None"

_REBIND = """\
# Never a FULL decode graph over a prefill (vllm-graphsafe replay guard).
{desc} = graphsafe_leave_decode_graph_for_prefill(
    {desc}, {metadata}
)
"""


def plan(tree: Tree) -> Plan:
    wrapper = tree.require(CUDA_GRAPH)
    flag = _uniform_flag(tree)
    plan = Plan(FIX.id, "CUDAGraphWrapper", names=(HAS_PREFILL,))
    edit(plan, wrapper, _wrapper_edits(wrapper, flag))
    sites = 0
    if tree.exists(MRV2_RUNNER):
        sites = _mrv2(tree, plan)
        plan.layout += f" and Model Runner V2 ({sites} replay sites)"
        plan.names = (HAS_PREFILL, LEAVE_DECODE_GRAPH)
    plan.tests[written_test_path(plan.fix_id)] = render_written_tests(
        FIX.package,
        ["wrapper", "mrv2"] if sites > 0 else ["wrapper"],
        UNIFORM_FLAG=flag,
    )
    return plan


def _uniform_flag(tree: Tree) -> str:
    descriptor = tree.require(FORWARD_CONTEXT).require_class("BatchDescriptor")
    for flag in UNIFORM_BATCH_FLAGS:
        if recognition.class_sets_attribute(descriptor, flag):
            return flag
    flags = " or ".join(UNIFORM_BATCH_FLAGS)
    raise MissingSymbolError(f"{FORWARD_CONTEXT}.BatchDescriptor's flag {flags}")


def _wrapper_edits(source: SourceFile, flag: str) -> list[LineEdit]:
    call = source.function(WRAPPER_CALL)
    for name in ("forward_context", "batch_descriptor", "cudagraph_runtime_mode"):
        if name not in recognition.assigned_names(call):
            raise MissingSymbolError(f"the local {name} of {CUDA_GRAPH}.{WRAPPER_CALL}")
    _require_bindings(source)
    early_return = _mode_mismatch_return(call)
    wrapper_class = source.require_class(CUDA_GRAPH_WRAPPER_CLASS)
    return [
        source.insert_before(wrapper_class, _HAS_PREFILL_HELPER),
        source.insert_after(early_return, _WRAPPER_GUARD.format(flag=flag)),
    ]


def _require_bindings(source: SourceFile) -> None:
    for name in ("CUDAGraphMode", "logger", "Any"):
        if not recognition.module_binds(source.tree, name):
            raise MissingSymbolError(f"{name} in {source.relpath}")


def _mode_mismatch_return(call: recognition.FunctionNode) -> ast.If:
    """``if <mode> == NONE or <mode> != self.runtime_mode:`` returning
    ``self.runnable(...)``."""
    for node in call.body:
        if (
            isinstance(node, ast.If)
            and "cudagraph_runtime_mode" in recognition.referenced_names(node.test)
            and "runtime_mode" in recognition.referenced_names(node.test)
            and len(node.body) == 1
            and isinstance(node.body[0], ast.Return)
            and isinstance(node.body[0].value, ast.Call)
            and recognition.called_name(node.body[0].value) == "runnable"
        ):
            return node
    raise MissingSymbolError(
        f"the return of the runnable when the mode does not match in {WRAPPER_CALL}"
    )


def _mrv2(tree: Tree, plan: Plan) -> int:
    """The helper in MRV2's graph utilities, and every replay site rebinding
    its descriptor through it; returns the number of sites."""
    utilities = tree.require(MRV2_CUDAGRAPH_UTILS)
    descriptor = utilities.require_class(
        "BatchExecutionDescriptor", ("cg_mode", "uniform_token_count")
    )
    _require_bindings(utilities)
    varlen = recognition.class_sets_attribute(descriptor, "max_query_len")
    helper = _LEAVE_DECODE_GRAPH_HELPER.format(
        decode_doc=_VARLEN_DOC if varlen else _UNIFORM_DOC,
        varlen_test=_VARLEN_TEST if varlen else "",
    )
    utility_edits = [
        utilities.insert_after(descriptor, helper),
        *rewrite_import(utilities, CUDA_GRAPH, set(), {HAS_PREFILL}),
    ]
    if not recognition.module_binds(utilities.tree, "replace"):
        utility_edits += rewrite_import(utilities, "dataclasses", set(), {"replace"})
    edit(plan, utilities, utility_edits)

    runner = tree.require(MRV2_RUNNER)
    step = runner.function("GPUModelRunner.execute_model")
    if replay_branch(step) is None or METADATA_LOCAL not in recognition.assigned_names(
        step
    ):
        raise MissingSymbolError(
            "the FULL-graph replay of GPUModelRunner.execute_model in an if/else "
            f"on the graph mode, beside its {METADATA_LOCAL}"
        )
    sites = 0
    modules = [MRV2_RUNNER] + [
        module for module, _ in MRV2_SPECULATORS if tree.exists(module)
    ]
    for module in modules:
        source = tree.require(module)
        edits = _rebind_edits(source)
        if not edits:
            continue
        sites += len(edits)
        edits += rewrite_import(
            source, MRV2_CUDAGRAPH_UTILS, set(), {LEAVE_DECODE_GRAPH}
        )
        edit(plan, source, edits)
    return sites


def _rebind_edits(source: SourceFile) -> list[LineEdit]:
    """Before each replay in an if/else on the graph mode whose ``else`` runs
    on one attention metadata local (the step's, or a drafter's own): the
    descriptor rebound by that metadata."""
    edits = []
    for node in ast.walk(source.tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        branch = replay_branch(node)
        if branch is None:
            continue
        metadata = eager_metadata(branch.node.orelse, recognition.assigned_names(node))
        if metadata is None:
            continue
        line = branch.node.lineno - 1
        if not source.lines[line].lstrip().startswith("if "):
            raise MissingSymbolError(
                f"the replay of {source.module_name}.{node.name} in an if of its own "
                "(not an elif)"
            )
        rebind = _REBIND.format(desc=branch.descriptor, metadata=metadata)
        edits.append(source.insert_before(branch.node, rebind))
    return edits
