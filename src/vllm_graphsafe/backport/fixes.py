"""The three fixes as source edits: where each binds, and the code it inserts.

Each ``plan_*`` function reads the tree (with the edits of the fixes before
it), locates what it edits by parsing, and returns the new text of every file
it changes, plus the CPU tests it writes beside the change. When something it
must edit is missing it raises :class:`MissingSymbolError` naming it, before
anything is changed: a fix is applied whole or not at all.

The inserted code is plain vLLM code (no import of this package), in vLLM's
style, and makes the same decisions as the runtime patches in
``vllm_graphsafe.patches``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_graphsafe import recognition
from vllm_graphsafe.backport import written_tests
from vllm_graphsafe.backport.imports import rewrite_import, uses_name
from vllm_graphsafe.backport.source import (
    LineEdit,
    MissingSymbolError,
    SourceFile,
    assigned_names,
    indent_block,
    is_call_of,
    statement_calling,
)
from vllm_graphsafe.backport.tree import Tree

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
V1_WORKER = "vllm.v1.worker.gpu_worker"
V1_INPUT_BATCH = "vllm.v1.worker.gpu_input_batch"
CP_UTILS = "vllm.v1.worker.cp_utils"
MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner"
MRV2_STATES = "vllm.v1.worker.gpu.states"
MRV2_INPUT_BATCH = "vllm.v1.worker.gpu.input_batch"
MRV2_CUDAGRAPH_UTILS = "vllm.v1.worker.gpu.cudagraph_utils"
WORKER_UTILS = "vllm.v1.worker.utils"
_SPEC = "vllm.v1.worker.gpu.spec_decode"
EAGLE_SPECULATOR = f"{_SPEC}.eagle.speculator"
AR_SPECULATORS = (
    (f"{_SPEC}.autoregressive.speculator", "AutoRegressiveSpeculator.propose"),
    (f"{_SPEC}.multi_module_mtp.speculator", "MultiModuleMTPSpeculator.propose"),
)
SHAPE_COUNT = "get_uniform_token_count"
DECODE_COUNT = "get_uniform_decode_token_count"
RUNNER_DECODE_COUNT = "_get_uniform_decode_token_count"


@dataclass
class Plan:
    """What one fix changes in a tree."""

    fix_id: str
    layout: str
    #: relpath -> the file's new text (source files of the tree).
    texts: dict[str, str] = field(default_factory=dict)
    #: relpath -> text of a test file written beside the change.
    tests: dict[str, str] = field(default_factory=dict)
    #: Names the edit introduces, for the README and commit message.
    names: tuple[str, ...] = ()


def _edit(plan: Plan, source: SourceFile, edits: list[LineEdit]) -> None:
    plan.texts[source.relpath] = source.apply(edits)


def _method_block(text: str, anchor_indent: str) -> str:
    return indent_block(text, anchor_indent)


def _direct_call_assignment(
    function: recognition.FunctionNode, callee: str, owner: str
) -> ast.Assign:
    """``name = callee(...)`` (or ``self.callee``) directly in ``function``."""
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and is_call_of(node.value, callee)
        ):
            return node
    raise MissingSymbolError(f"the assignment from {callee}(...) in {owner}")


# -- v1-phase-dispatch -----------------------------------------------------------

_HAS_PREFILL_METHOD = '''\
def _has_prefill_request(self, num_reqs: int) -> bool:
    """Whether a scheduled request had not computed its whole prompt before
    this step, which makes the batch a prefill whatever its shape.
    """
{early_guard}    return bool(
        (
            self.input_batch.num_computed_tokens_cpu[:num_reqs]
            < self.input_batch.num_prompt_tokens[:num_reqs]
        ).any()
    )

'''

_EARLY_GUARD = """\
    if (
        self.parallel_config.pipeline_parallel_size > 1
        and self.compilation_config.pass_config.enable_sp
    ):
        # The worker classifies each step before the request state update:
        # keep the shape rule rather than read stale state.
        return False
"""

_PHASE_GUARD = """\
# A prompt chunk can have a decode batch's shape (vllm-project/vllm#53051).
if (
    {name}
    and force_uniform_decode is None
    and self._has_prefill_request(num_reqs)
):
    {name} = False
"""


def plan_v1_phase_dispatch(tree: Tree) -> Plan:
    runner = tree.require(V1_RUNNER)
    owner = "GPUModelRunner._determine_batch_execution_and_padding"
    dispatch = runner.function(owner)
    shape_rule = runner.function("GPUModelRunner._is_uniform_decode")
    for parameter in ("num_reqs", "force_uniform_decode"):
        if parameter not in recognition.parameter_names(dispatch):
            raise MissingSymbolError(f"parameter {parameter} of {owner}")
    _require_attributes(tree, V1_INPUT_BATCH, "InputBatch", _V1_PHASE_COLUMNS)
    classification = _direct_call_assignment(dispatch, "_is_uniform_decode", owner)
    name = classification.targets[0].id  # type: ignore[attr-defined]
    worker = tree.source(V1_WORKER).tree if tree.exists(V1_WORKER) else None
    early = worker is not None and recognition.calls_name(
        worker, "_determine_batch_execution_and_padding"
    )
    method = _HAS_PREFILL_METHOD.format(early_guard=_EARLY_GUARD if early else "")
    assert shape_rule.end_lineno is not None and classification.end_lineno is not None
    edits = [
        LineEdit(
            shape_rule.end_lineno,
            shape_rule.end_lineno,
            "\n"
            + indent_block(method.rstrip("\n") + "\n", runner.indent_of(shape_rule)),
        ),
        LineEdit(
            classification.end_lineno,
            classification.end_lineno,
            indent_block(
                _PHASE_GUARD.format(name=name), runner.indent_of(classification)
            ),
        ),
    ]
    plan = Plan(
        "v1-phase-dispatch",
        "V1 runner" + (" (worker classifies early under PP + SP)" if early else ""),
        names=("GPUModelRunner._has_prefill_request",),
    )
    _edit(plan, runner, edits)
    plan.tests[written_tests.path_for(plan.fix_id)] = written_tests.v1_phase_dispatch()
    return plan


_V1_PHASE_COLUMNS = ("num_computed_tokens_cpu", "num_prompt_tokens")


def _require_attributes(
    tree: Tree, module: str, class_name: str, attributes: tuple[str, ...]
) -> None:
    source = tree.require(module)
    cls = recognition.find_class(source.tree, class_name)
    if cls is None:
        raise MissingSymbolError(f"{module}.{class_name}")
    for attribute in attributes:
        if not recognition.class_sets_attribute(cls, attribute):
            raise MissingSymbolError(f"{module}.{class_name}.{attribute}")


# -- v1-dummy-staging -------------------------------------------------------------

_STAGE_METHOD = '''\
def _stage_dummy_request_metadata(
    self, num_scheduled_tokens: np.ndarray
) -> np.ndarray:
    """Stage a dummy batch's lengths and positions the way a real batch has them.

    Per request, seq_len == num_computed + num_scheduled; per token,
    position == num_computed[req] + query_pos. A requested seq_len shorter
    than the query is raised to the query length on both mirrors, and padded
    rows and tokens are cleared. Returns the input batch's computed counts as
    they were, for the caller to restore once the metadata is built.
    """
    num_reqs = len(num_scheduled_tokens)
    num_tokens = int(num_scheduled_tokens.sum())
    seq_lens = {seq_lens_np}
    seq_lens[:num_reqs] = np.maximum(seq_lens[:num_reqs], num_scheduled_tokens)
    seq_lens[num_reqs:] = 0
    {seq_lens_sync}

    saved_num_computed_tokens = self.input_batch.num_computed_tokens_cpu.copy()
    num_computed_tokens = seq_lens[:num_reqs] - num_scheduled_tokens
    self.input_batch.num_computed_tokens_cpu[:num_reqs] = num_computed_tokens
    self.input_batch.num_computed_tokens_cpu[num_reqs:] = 0

    cu_num_tokens = np.cumsum(num_scheduled_tokens)
    query_pos = np.arange(num_tokens) - np.repeat(
        cu_num_tokens - num_scheduled_tokens, num_scheduled_tokens
    )
    positions = np.repeat(num_computed_tokens, num_scheduled_tokens) + query_pos
    self.positions[:num_tokens].copy_(
        torch.from_numpy(positions).to(self.positions.dtype), non_blocking=True
    )
    self.positions[num_tokens:].zero_()
    return saved_num_computed_tokens

'''

_STAGE_CALL = """\
# Stage metadata that agrees with itself (vllm-project/vllm#54604).
saved_num_computed_tokens = self._stage_dummy_request_metadata(
    num_scheduled_tokens
)
"""

_RESTORE = """\
# Real requests keep their computed counts once the metadata is built.
self.input_batch.num_computed_tokens_cpu[:] = saved_num_computed_tokens
"""

_DCP_CONSUMES_STAGED = """\
# positions were staged by the caller as num_computed[req] + query_pos
# (vllm-project/vllm#54604); the slot mapping consumes them as they are.
"""

#: How ``_dummy_run`` keeps its CPU seq_lens: (stored name, numpy view, device sync).
_SEQ_LENS_LAYOUTS = (
    (
        "optimistic_seq_lens_cpu",
        "self.optimistic_seq_lens_cpu.numpy()",
        "self.seq_lens.copy_(self.optimistic_seq_lens_cpu, non_blocking=True)",
    ),
    ("seq_lens_cpu", "self.seq_lens_cpu.numpy()", None),
    ("np", "self.seq_lens.np", "self.seq_lens.copy_to_gpu()"),
)


def _seq_lens_layout(
    runner: SourceFile, dummy: recognition.FunctionNode
) -> tuple[str, str, str]:
    for stored, view, sync in _SEQ_LENS_LAYOUTS:
        for node in ast.walk(dummy):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Subscript)
                and stored in recognition.referenced_names(node.targets[0].value)
                and "seq_lens"
                in "".join(recognition.referenced_names(node.targets[0].value))
            ):
                if sync is None:
                    sync = _seq_lens_sync_after(runner, dummy, node)
                return stored, view, sync
    raise MissingSymbolError("the CPU seq_lens staging in GPUModelRunner._dummy_run")


def _seq_lens_sync_after(
    runner: SourceFile, dummy: recognition.FunctionNode, store: ast.Assign
) -> str:
    for node in ast.walk(dummy):
        if (
            isinstance(node, ast.Expr)
            and node.lineno > store.lineno
            and isinstance(node.value, ast.Call)
            and recognition.called_name(node.value) == "copy_"
        ):
            segment = ast.get_source_segment(runner.text, node)
            if segment and "seq_lens" in segment and "\n" not in segment:
                return segment
    raise MissingSymbolError("the device copy of seq_lens in GPUModelRunner._dummy_run")


def plan_v1_dummy_staging(tree: Tree) -> Plan:
    runner = tree.require(V1_RUNNER)
    owner = "GPUModelRunner._dummy_run"
    dummy = runner.function(owner)
    for name in ("num_scheduled_tokens",):
        if name not in assigned_names(dummy):
            raise MissingSymbolError(f"local {name} of {owner}")
    if not recognition.module_binds(runner.tree, "np") or not recognition.module_binds(
        runner.tree, "torch"
    ):
        raise MissingSymbolError(f"the numpy/torch imports of {V1_RUNNER}")
    build = statement_calling(dummy, "_build_attention_metadata")
    if build is None:
        raise MissingSymbolError(f"the call of _build_attention_metadata in {owner}")
    dcp_call = statement_calling(dummy, "prepare_dcp_dummy_context_metadata")
    anchor = dcp_call if dcp_call is not None else build
    if anchor.lineno > build.lineno:
        raise MissingSymbolError(
            f"the DCP helper call before metadata build in {owner}"
        )
    seq_lens_layout, seq_lens_np, seq_lens_sync = _seq_lens_layout(runner, dummy)
    method = _STAGE_METHOD.format(seq_lens_np=seq_lens_np, seq_lens_sync=seq_lens_sync)
    assert build.end_lineno is not None
    edits = [
        LineEdit(
            runner.first_line(dummy),
            runner.first_line(dummy),
            indent_block(method, runner.indent_of(dummy)),
        ),
        LineEdit(
            anchor.lineno - 1,
            anchor.lineno - 1,
            indent_block(_STAGE_CALL, runner.indent_of(anchor)),
        ),
        LineEdit(
            build.end_lineno,
            build.end_lineno,
            indent_block(_RESTORE, runner.indent_of(build)),
        ),
    ]
    plan = Plan(
        "v1-dummy-staging",
        "V1 runner" + (", DCP dummy context (0.27+)" if dcp_call else ""),
        names=("GPUModelRunner._stage_dummy_request_metadata",),
    )
    if dcp_call is not None:
        _edit(plan, *_dcp_helper_consumes_staged_positions(tree))
    _edit(plan, runner, edits)
    plan.tests[written_tests.path_for(plan.fix_id)] = written_tests.v1_dummy_staging(
        dcp=dcp_call is not None, seq_lens_layout=seq_lens_layout
    )
    return plan


def _dcp_helper_consumes_staged_positions(
    tree: Tree,
) -> tuple[SourceFile, list[LineEdit]]:
    helper_name = "prepare_dcp_dummy_context_metadata"
    cp_utils = tree.require(CP_UTILS)
    helper = cp_utils.function(helper_name)
    store: ast.stmt | None = None
    for statement in helper.body:
        if (
            isinstance(statement, ast.Assign)
            and isinstance(statement.targets[0], ast.Subscript)
            and isinstance(statement.targets[0].value, ast.Name)
            and statement.targets[0].value.id == "positions"
        ):
            store = statement
    if store is None:
        raise MissingSymbolError(f"the positions store in {CP_UTILS}.{helper_name}")
    start = store
    index = helper.body.index(store)
    previous = helper.body[index - 1] if index else None
    if (
        isinstance(previous, ast.Expr)
        and isinstance(previous.value, ast.Call)
        and recognition.called_name(previous.value) == "copy_to_gpu"
    ):
        start = previous
    assert store.end_lineno is not None
    edit = LineEdit(
        start.lineno - 1,
        store.end_lineno,
        indent_block(_DCP_CONSUMES_STAGED, cp_utils.indent_of(store)),
    )
    return cp_utils, [edit]


# -- mrv2-phase-dispatch ----------------------------------------------------------

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
    Dummy batches keep the shape rule. Only uniform shapes scan the request
    states, and only the rows still in prefill.
    """
    num_tokens_per_req = scheduler_output.num_scheduled_tokens
    num_reqs = len(num_tokens_per_req)
    num_tokens = scheduler_output.total_num_scheduled_tokens
    max_query_len = max(num_tokens_per_req.values())
    uniform_shape = {shape_test}
    has_prefill = False
    if not dummy_run and uniform_shape:
        req_states = self.req_states
        prefill_rows = np.flatnonzero(
            req_states.num_computed_prefill_tokens{computed_view}
            < req_states.prefill_len{prefill_view}
        )
        has_prefill = any(
            req_states.index_to_req_id.get(row) in num_tokens_per_req
            for row in prefill_rows.tolist()
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


@dataclass(frozen=True)
class _MRV2Layout:
    """Where the phase-aware count lives, and how it is called, per layout."""

    label: str
    count_module: str
    flag: Callable[[bool], str]  # "has prefill" -> the argument text
    speculators: tuple[tuple[str, str], ...]


_UPSTREAM_NAMES = _MRV2Layout(
    "Model Runner V2, 0.24-0.27 layout (names of upstream #51865)",
    WORKER_UTILS,
    lambda _: "decode_graph_eligible=not has_prefill",
    AR_SPECULATORS,
)
_ONECAT_NAMES = _MRV2Layout(
    "Model Runner V2, 0.22 layout (names of 1Cat-vLLM's backport)",
    MRV2_CUDAGRAPH_UTILS,
    lambda _: "has_prefill",
    ((EAGLE_SPECULATOR, "EagleSpeculator.propose"),),
)


def _mrv2_layout(tree: Tree) -> _MRV2Layout:
    if any(tree.exists(module) for module, _ in AR_SPECULATORS):
        return _UPSTREAM_NAMES
    return _ONECAT_NAMES


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


def plan_mrv2_phase_dispatch(tree: Tree) -> Plan:
    layout = _mrv2_layout(tree)
    runner = tree.require(MRV2_RUNNER)
    owner = "GPUModelRunner.execute_model"
    execute = runner.function(owner)
    for parameter in ("scheduler_output", "dummy_run"):
        if parameter not in recognition.parameter_names(execute):
            raise MissingSymbolError(f"parameter {parameter} of {owner}")
    shape_call = _direct_call_assignment(execute, SHAPE_COUNT, owner)
    sync = statement_calling(execute, "dispatch_cg_and_sync_dp")
    if sync is None or sync.lineno < shape_call.lineno:
        raise MissingSymbolError(
            f"the dispatch_cg_and_sync_dp call after it in {owner}"
        )
    states = tree.require(MRV2_STATES)
    _require_attributes(
        tree,
        MRV2_STATES,
        "RequestState",
        ("num_computed_prefill_tokens", "prefill_len", "index_to_req_id"),
    )
    if not recognition.module_binds(runner.tree, "np"):
        raise MissingSymbolError(f"the numpy import of {MRV2_RUNNER}")
    annotation = _parameter_annotation(runner, execute, "scheduler_output")
    shape_test = (
        "is_uniform_query_len(num_reqs, num_tokens, max_query_len)"
        if layout is _UPSTREAM_NAMES
        else "(\n        get_uniform_token_count(num_reqs, num_tokens, max_query_len)"
        " is not None\n    )"
    )
    method = _RUNNER_METHOD.format(
        scheduler_output_type=annotation,
        shape_test=shape_test,
        computed_view=_host_view(states, "num_computed_prefill_tokens"),
        prefill_view=_host_view(states, "prefill_len"),
        flag=layout.flag(True),
    )
    plan = Plan(
        "mrv2-phase-dispatch",
        layout.label,
        names=(
            f"{layout.count_module}.{DECODE_COUNT}",
            f"GPUModelRunner.{RUNNER_DECODE_COUNT}",
        ),
    )
    _add_count_function(tree, plan, layout)

    assert shape_call.end_lineno is not None
    name = shape_call.targets[0].id  # type: ignore[attr-defined]
    runner_edits = [
        LineEdit(
            runner.first_line(execute),
            runner.first_line(execute),
            indent_block(method, runner.indent_of(execute)),
        ),
        LineEdit(
            shape_call.lineno - 1,
            shape_call.end_lineno,
            indent_block(_RUNNER_CALL.format(name=name), runner.indent_of(shape_call)),
        ),
    ]
    still_uses_shape = uses_name(runner, SHAPE_COUNT, outside=shape_call) or (
        layout is _ONECAT_NAMES
    )
    imported = (
        {DECODE_COUNT, "is_uniform_query_len"}
        if layout is _UPSTREAM_NAMES
        else {DECODE_COUNT}
    )
    runner_edits += _unused_after(runner, execute, shape_call)
    runner_edits += _import_swap(
        runner, layout, drop_shape=not still_uses_shape, add=imported
    )
    _edit(plan, runner, runner_edits)

    for module, propose in layout.speculators:
        if tree.exists(module):
            _edit(plan, *_draft_prefill_edits(tree, module, propose, layout))
    plan.tests[written_tests.path_for(plan.fix_id)] = written_tests.mrv2_phase_dispatch(
        upstream_names=layout is _UPSTREAM_NAMES,
        computed_np=_host_view(states, "num_computed_prefill_tokens") == "",
        prefill_np=_host_view(states, "prefill_len") == "",
    )
    return plan


def _unused_after(
    source: SourceFile, function: recognition.FunctionNode, replaced: ast.Assign
) -> list[LineEdit]:
    """Delete simple local assignments only ``replaced`` read (F841 otherwise)."""
    read_there = {
        node.id
        for node in ast.walk(replaced.value)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    inside = {id(node) for node in ast.walk(replaced)}
    edits = []
    for name in sorted(read_there):
        reads = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.Name)
            and node.id == name
            and isinstance(node.ctx, ast.Load)
            and id(node) not in inside
        ]
        stores = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ]
        if not reads and len(stores) == 1 and stores[0].lineno < replaced.lineno:
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


def _add_count_function(tree: Tree, plan: Plan, layout: _MRV2Layout) -> None:
    source = tree.require(layout.count_module)
    if recognition.module_binds(source.tree, DECODE_COUNT):
        return
    if layout is _ONECAT_NAMES:
        if not recognition.module_binds(source.tree, SHAPE_COUNT):
            raise MissingSymbolError(f"{layout.count_module}.{SHAPE_COUNT}")
        addition = _CUDAGRAPH_UTILS_FUNCTION_1CAT
    else:
        addition = _UTILS_FUNCTIONS
        if recognition.module_binds(source.tree, "is_uniform_query_len"):
            raise MissingSymbolError(
                f"{layout.count_module}.{DECODE_COUNT} beside is_uniform_query_len"
            )
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    plan.texts[source.relpath] = text + addition


def _import_swap(
    source: SourceFile, layout: _MRV2Layout, drop_shape: bool, add: set[str]
) -> list[LineEdit]:
    if layout.count_module == MRV2_CUDAGRAPH_UTILS:
        return rewrite_import(
            source,
            MRV2_CUDAGRAPH_UTILS,
            remove={SHAPE_COUNT} if drop_shape else set(),
            add=add,
        )
    edits = []
    if drop_shape:
        edits += rewrite_import(source, MRV2_CUDAGRAPH_UTILS, {SHAPE_COUNT}, set())
    edits += rewrite_import(source, WORKER_UTILS, set(), add)
    return edits


_DRAFT_FLAG_UPSTREAM = "decode_graph_eligible=not {phase}"
_DRAFT_FLAG_1CAT = "has_prefill={phase}"


def _draft_phase_expression(tree: Tree) -> str:
    """Whether a row of the target's input batch was in prefill before the step."""
    source = tree.require(MRV2_INPUT_BATCH)
    cls = recognition.find_class(source.tree, "InputBatch")
    if cls is None:
        raise MissingSymbolError(f"{MRV2_INPUT_BATCH}.InputBatch")
    if recognition.class_sets_attribute(cls, "is_prefilling_np"):
        return "bool(input_batch.is_prefilling_np[:num_reqs].any())"
    for attribute in ("num_computed_prefill_tokens_np", "prefill_len_np"):
        if not recognition.class_sets_attribute(cls, attribute):
            raise MissingSymbolError(f"{MRV2_INPUT_BATCH}.InputBatch.{attribute}")
    return (
        "bool((input_batch.num_computed_prefill_tokens_np[:num_reqs]"
        " < input_batch.prefill_len_np[:num_reqs]).any())"
    )


def _draft_prefill_edits(
    tree: Tree, module: str, propose: str, layout: _MRV2Layout
) -> tuple[SourceFile, list[LineEdit]]:
    source = tree.require(module)
    function = source.function(propose)
    owner = f"{module}.{propose}"
    if "input_batch" not in recognition.parameter_names(function):
        raise MissingSymbolError(f"parameter input_batch of {owner}")
    if "num_reqs" not in assigned_names(function):
        raise MissingSymbolError(f"local num_reqs of {owner}")
    statement = _direct_call_assignment(function, SHAPE_COUNT, owner)
    call = statement.value
    assert isinstance(call, ast.Call) and statement.end_lineno is not None
    template = _DRAFT_FLAG_UPSTREAM if layout is _UPSTREAM_NAMES else _DRAFT_FLAG_1CAT
    phase = _draft_phase_expression(tree)
    flag = template.format(phase=phase.removeprefix("bool(").removesuffix(")"))
    if layout is _ONECAT_NAMES:
        flag = template.format(phase=phase)
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
    edits += _import_swap(source, layout, drop_shape=drop_shape, add={DECODE_COUNT})
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


PLANNERS: dict[str, Callable[[Tree], Plan]] = {
    "v1-phase-dispatch": plan_v1_phase_dispatch,
    "v1-dummy-staging": plan_v1_dummy_staging,
    "mrv2-phase-dispatch": plan_mrv2_phase_dispatch,
}
