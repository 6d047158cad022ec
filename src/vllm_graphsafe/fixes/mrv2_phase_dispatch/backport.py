"""mrv2-phase-dispatch as a source edit: plain vLLM code with the names of
upstream's fix (vllm-project/vllm#51865) or, on the 0.22 layout, of 1Cat-vLLM's
backport of it, deciding as the runtime hooks do."""

from __future__ import annotations

import ast

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes.mrv2_phase_dispatch import FIX
from vllm_graphsafe.tree_edits.imports import rewrite_import, uses_name
from vllm_graphsafe.tree_edits.plan import (
    Plan,
    direct_call_assignment,
    edit,
    render_written_tests,
    written_test_path,
)
from vllm_graphsafe.tree_edits.source import (
    LineEdit,
    MissingSymbolError,
    SourceFile,
    indent_block,
    statement_calling,
)
from vllm_graphsafe.tree_edits.tree import Tree
from vllm_graphsafe.vllm_layout import (
    MRV2_AUTOREGRESSIVE_SPECULATOR,
    MRV2_CUDAGRAPH_UTILS,
    MRV2_EAGLE_SPECULATOR,
    MRV2_INPUT_BATCH,
    MRV2_MULTI_MODULE_MTP_SPECULATOR,
    MRV2_RUNNER,
    MRV2_STATES,
    V1_WORKER_UTILS,
)

AR_SPECULATORS = (
    (MRV2_AUTOREGRESSIVE_SPECULATOR, "AutoRegressiveSpeculator.propose"),
    (MRV2_MULTI_MODULE_MTP_SPECULATOR, "MultiModuleMTPSpeculator.propose"),
)
SHAPE_COUNT = "get_uniform_token_count"
DECODE_COUNT = "get_uniform_decode_token_count"

_UTILS_FUNCTIONS = '''\


def is_uniform_query_len(num_reqs: int, num_tokens: int, max_query_len: int) -> bool:
    """Whether every request of the batch schedules the same number of tokens.

    A shape test only: a prompt chunk can have a decode batch's shape, so
    classify scheduled batches with ``get_uniform_decode_token_count``.
    """
    return num_reqs > 0 and num_tokens == max_query_len * num_reqs


def get_uniform_decode_token_count(
    num_reqs: int, num_tokens: int, max_query_len: int, decode_graph_eligible: bool
) -> int | None:
    """The per-request token count of a uniform decode batch, else None."""
    if decode_graph_eligible and is_uniform_query_len(
        num_reqs, num_tokens, max_query_len
    ):
        return max_query_len
    return None
'''

_CUDAGRAPH_UTILS_FUNCTION_1CAT = '''\


def get_uniform_decode_token_count(
    num_reqs: int,
    num_tokens: int,
    max_query_len: int,
    has_prefill: bool,
) -> int | None:
    """The per-request token count of a uniform decode batch, else None.

    A batch holding a request in prefill is never uniform decode, whatever
    its shape (vllm-project/vllm#51865).
    """
    if has_prefill or num_reqs == 0:
        return None
    return get_uniform_token_count(num_reqs, num_tokens, max_query_len)
'''

_RUNNER_METHOD = '''\
def _get_uniform_decode_token_count(
    self, scheduler_output: {scheduler_output_type}, dummy_run: bool
) -> int | None:
    """The per-request token count if this step may replay a uniform decode
    CUDA graph, else None.

    A prompt chunk of the decode query length has a decode batch's shape, so
    a real step qualifies only when no scheduled request is still in prefill.
    Dummy batches keep the shape rule. Only uniform shapes read the request
    states: each scheduled request's row, found by its id.
    """
    num_tokens_per_req = scheduler_output.num_scheduled_tokens
    num_reqs = len(num_tokens_per_req)
    num_tokens = scheduler_output.total_num_scheduled_tokens
    max_query_len = max(num_tokens_per_req.values())
    uniform_shape = {shape_test}
    has_prefill = False
    if not dummy_run and uniform_shape:
        req_states = self.req_states
        rows = np.fromiter(
            (req_states.req_id_to_index[req_id] for req_id in num_tokens_per_req),
            dtype=np.int64,
            count=num_reqs,
        )
        has_prefill = bool(
            np.any(
                req_states.num_computed_prefill_tokens{computed_view}[rows]
                < req_states.prefill_len{prefill_view}[rows]
            )
        )
    return get_uniform_decode_token_count(
        num_reqs, num_tokens, max_query_len, {flag}
    )

'''

_RUNNER_CALL = """\
# A prompt chunk can have a decode batch's shape (vllm-project/vllm#51865).
{name} = self._get_uniform_decode_token_count(
    scheduler_output, dummy_run
)
"""


def _host_view(states: SourceFile, attribute: str) -> str:
    """``.np`` for a UVA/CPU-GPU buffer column, nothing for a numpy array."""
    for node in ast.walk(states.tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == attribute
            and isinstance(node.value, ast.Call)
        ):
            func = node.value.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in {"np", "numpy"}
            ):
                return ""
            return ".np"
    raise MissingSymbolError(f"{MRV2_STATES}.RequestState.{attribute}")


def plan(tree: Tree) -> Plan:
    upstream = any(tree.exists(module) for module, _ in AR_SPECULATORS)
    runner = tree.require(MRV2_RUNNER)
    owner = "GPUModelRunner.execute_model"
    execute = runner.function(owner)
    for parameter in ("scheduler_output", "dummy_run"):
        if parameter not in recognition.parameter_names(execute):
            raise MissingSymbolError(f"parameter {parameter} of {owner}")
    shape_call = direct_call_assignment(execute, SHAPE_COUNT, owner)
    sync = statement_calling(execute, "dispatch_cg_and_sync_dp")
    if sync is None or sync.lineno < shape_call.lineno:
        raise MissingSymbolError(
            f"the dispatch_cg_and_sync_dp call after it in {owner}"
        )
    states = tree.require(MRV2_STATES)
    states.require_class(
        "RequestState",
        ("num_computed_prefill_tokens", "prefill_len", "req_id_to_index"),
    )
    if not recognition.module_binds(runner.tree, "np"):
        raise MissingSymbolError(f"the numpy import of {MRV2_RUNNER}")
    annotation = _parameter_annotation(runner, execute, "scheduler_output")
    if upstream:
        label = "Model Runner V2, 0.24-0.27 layout (names of upstream #51865)"
        count_module, flag = V1_WORKER_UTILS, "decode_graph_eligible=not has_prefill"
        shape_test = "is_uniform_query_len(num_reqs, num_tokens, max_query_len)"
        imported = {DECODE_COUNT, "is_uniform_query_len"}
        speculators: tuple[tuple[str, str], ...] = AR_SPECULATORS
    else:
        label = "Model Runner V2, 0.22 layout (names of 1Cat-vLLM's backport)"
        count_module, flag = MRV2_CUDAGRAPH_UTILS, "has_prefill"
        shape_test = (
            "(\n        get_uniform_token_count(num_reqs, num_tokens, max_query_len)"
            " is not None\n    )"
        )
        imported = {DECODE_COUNT}
        speculators = ((MRV2_EAGLE_SPECULATOR, "EagleSpeculator.propose"),)
    computed_view = _host_view(states, "num_computed_prefill_tokens")
    prefill_view = _host_view(states, "prefill_len")
    method = _RUNNER_METHOD.format(
        scheduler_output_type=annotation,
        shape_test=shape_test,
        computed_view=computed_view,
        prefill_view=prefill_view,
        flag=flag,
    )
    plan = Plan(
        FIX.id,
        label,
        names=(
            f"{count_module}.{DECODE_COUNT}",
            "GPUModelRunner._get_uniform_decode_token_count",
        ),
    )
    _add_count_function(tree, plan, count_module, upstream)

    assert shape_call.end_lineno is not None
    name = shape_call.targets[0].id  # type: ignore[attr-defined]
    runner_edits = [
        runner.insert_before(execute, method),
        LineEdit(
            shape_call.lineno - 1,
            shape_call.end_lineno,
            indent_block(_RUNNER_CALL.format(name=name), runner.indent_of(shape_call)),
        ),
    ]
    drop_shape = upstream and not uses_name(runner, SHAPE_COUNT, outside=shape_call)
    runner_edits += _unused_after(execute, shape_call)
    runner_edits += _import_swap(runner, upstream, drop_shape, imported)
    edit(plan, runner, runner_edits)

    for module, propose in speculators:
        if tree.exists(module):
            edit(plan, *_draft_prefill_edits(tree, module, propose, upstream))
    plan.tests[written_test_path(plan.fix_id)] = render_written_tests(
        FIX.package,
        ["dispatch", "upstream_helper" if upstream else "fork_helper"],
        COMPUTED_IS_ARRAY=computed_view == "",
        PREFILL_LEN_IS_ARRAY=prefill_view == "",
    )
    return plan


def _unused_after(
    function: recognition.FunctionNode, replaced: ast.Assign
) -> list[LineEdit]:
    """Delete simple local assignments only ``replaced`` read (F841 otherwise)."""
    inside = {id(node) for node in ast.walk(replaced)}
    loads = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    ]
    read_there = {node.id for node in loads if id(node) in inside}
    read_elsewhere = {node.id for node in loads if id(node) not in inside}
    edits = []
    for name in sorted(read_there - read_elsewhere):
        stores = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ]
        if len(stores) == 1 and stores[0].lineno < replaced.lineno:
            store = stores[0]
            assert store.end_lineno is not None
            edits.append(LineEdit(store.lineno - 1, store.end_lineno, ""))
    return edits


def _parameter_annotation(
    source: SourceFile, function: recognition.FunctionNode, name: str
) -> str:
    for argument in function.args.args:
        if argument.arg == name and argument.annotation is not None:
            text = ast.get_source_segment(source.text, argument.annotation)
            if text:
                return text
    raise MissingSymbolError(f"the annotation of {name} in {function.name}")


def _add_count_function(
    tree: Tree, plan: Plan, count_module: str, upstream: bool
) -> None:
    source = tree.require(count_module)
    if recognition.module_binds(source.tree, DECODE_COUNT):
        return
    if not upstream:
        if not recognition.module_binds(source.tree, SHAPE_COUNT):
            raise MissingSymbolError(f"{count_module}.{SHAPE_COUNT}")
        addition = _CUDAGRAPH_UTILS_FUNCTION_1CAT
    else:
        addition = _UTILS_FUNCTIONS
        if recognition.module_binds(source.tree, "is_uniform_query_len"):
            raise MissingSymbolError(
                f"{count_module}.{DECODE_COUNT} beside is_uniform_query_len"
            )
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    plan.texts[source.relpath] = text + addition


def _import_swap(
    source: SourceFile, upstream: bool, drop_shape: bool, add: set[str]
) -> list[LineEdit]:
    if not upstream:
        return rewrite_import(
            source, MRV2_CUDAGRAPH_UTILS, {SHAPE_COUNT} if drop_shape else set(), add
        )
    edits = []
    if drop_shape:
        edits += rewrite_import(source, MRV2_CUDAGRAPH_UTILS, {SHAPE_COUNT}, set())
    edits += rewrite_import(source, V1_WORKER_UTILS, set(), add)
    return edits


def _draft_phase_expression(tree: Tree) -> str:
    """Whether a row of the target's input batch was in prefill before the step."""
    source = tree.require(MRV2_INPUT_BATCH)
    cls = source.require_class("InputBatch")
    if recognition.class_sets_attribute(cls, "is_prefilling_np"):
        return "bool(input_batch.is_prefilling_np[:num_reqs].any())"
    source.require_class(
        "InputBatch", ("num_computed_prefill_tokens_np", "prefill_len_np")
    )
    return (
        "bool((input_batch.num_computed_prefill_tokens_np[:num_reqs]"
        " < input_batch.prefill_len_np[:num_reqs]).any())"
    )


def _draft_prefill_edits(
    tree: Tree, module: str, propose: str, upstream: bool
) -> tuple[SourceFile, list[LineEdit]]:
    source = tree.require(module)
    function = source.function(propose)
    owner = f"{module}.{propose}"
    if "input_batch" not in recognition.parameter_names(function):
        raise MissingSymbolError(f"parameter input_batch of {owner}")
    if "num_reqs" not in recognition.assigned_names(function):
        raise MissingSymbolError(f"local num_reqs of {owner}")
    statement = direct_call_assignment(function, SHAPE_COUNT, owner)
    call = statement.value
    assert isinstance(call, ast.Call) and statement.end_lineno is not None
    phase = _draft_phase_expression(tree)
    if upstream:
        flag = (
            f"decode_graph_eligible=not {phase.removeprefix('bool(').removesuffix(')')}"
        )
    else:
        flag = f"has_prefill={phase}"
    indent = source.indent_of(statement)
    target = ast.get_source_segment(source.text, statement.targets[0])
    arguments = _call_arguments(source, call, indent + "    ")
    lines = [
        f"{indent}# Draft prefill is decode only past every prompt "
        "(vllm-project/vllm#51865).\n",
        f"{indent}{target} = {DECODE_COUNT}(\n",
        *arguments,
        f"{indent}    {flag},\n",
        f"{indent})\n",
    ]
    edits = [LineEdit(statement.lineno - 1, statement.end_lineno, "".join(lines))]
    drop_shape = not uses_name(source, SHAPE_COUNT, outside=statement)
    edits += _import_swap(source, upstream, drop_shape, {DECODE_COUNT})
    return source, edits


def _call_arguments(source: SourceFile, call: ast.Call, indent: str) -> list[str]:
    """The call's argument lines, comments between them kept, each ending in ','."""
    assert call.end_lineno is not None
    first = call.args[0] if call.args else None
    closing = source.lines[call.end_lineno - 1].strip()
    if first is not None and first.lineno > call.lineno and closing == ")":
        # Already one argument per line: keep those lines (and comments) as they are.
        text = "".join(source.lines[first.lineno - 1 : call.end_lineno - 1])
        if not text.rstrip().endswith(","):
            text = text.rstrip() + ",\n"
        return [text]
    segments = [ast.get_source_segment(source.text, arg) for arg in call.args]
    segments += [ast.get_source_segment(source.text, kw) for kw in call.keywords]
    lines = []
    for segment in segments:
        if segment is None or "\n" in segment:
            raise MissingSymbolError(
                f"a call of {SHAPE_COUNT} this backport can rewrite"
            )
        lines.append(f"{indent}{segment},\n")
    return lines
