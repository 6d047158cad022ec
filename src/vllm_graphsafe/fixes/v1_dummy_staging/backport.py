"""v1-dummy-staging as a source edit: plain vLLM code staging what the runtime
hooks stage."""

from __future__ import annotations

import ast

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes.v1_dummy_staging import FIX
from vllm_graphsafe.tree_edits.plan import (
    Plan,
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
from vllm_graphsafe.vllm_layout import V1_CP_UTILS, V1_RUNNER

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


def plan(tree: Tree) -> Plan:
    runner = tree.require(V1_RUNNER)
    owner = "GPUModelRunner._dummy_run"
    dummy = runner.function(owner)
    if "num_scheduled_tokens" not in recognition.assigned_names(dummy):
        raise MissingSymbolError(f"local num_scheduled_tokens of {owner}")
    if not all(recognition.module_binds(runner.tree, name) for name in ("np", "torch")):
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
    edits = [
        runner.insert_before(dummy, method),
        runner.insert_before(anchor, _STAGE_CALL),
        runner.insert_after(build, _RESTORE),
    ]
    plan = Plan(
        FIX.id,
        "V1 runner" + (", DCP dummy context (0.27+)" if dcp_call else ""),
        names=("GPUModelRunner._stage_dummy_request_metadata",),
    )
    if dcp_call is not None:
        edit(plan, *_dcp_helper_consumes_staged_positions(tree))
    edit(plan, runner, edits)
    plan.tests[written_test_path(plan.fix_id)] = render_written_tests(
        FIX.package,
        ["staging", "dcp"] if dcp_call is not None else ["staging"],
        SEQ_LENS_LAYOUT=seq_lens_layout,
    )
    return plan


def _dcp_helper_consumes_staged_positions(
    tree: Tree,
) -> tuple[SourceFile, list[LineEdit]]:
    helper_name = "prepare_dcp_dummy_context_metadata"
    cp_utils = tree.require(V1_CP_UTILS)
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
        raise MissingSymbolError(f"the positions store in {V1_CP_UTILS}.{helper_name}")
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
    text = indent_block(_DCP_CONSUMES_STAGED, cp_utils.indent_of(store))
    return cp_utils, [LineEdit(start.lineno - 1, store.end_lineno, text)]
