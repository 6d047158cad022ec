"""v1-phase-dispatch as a source edit: where it binds, and the code it inserts.

The inserted code is plain vLLM code (no import of this package), in vLLM's
style, and makes the same decision as the runtime hook in ``hooks``.
"""

from __future__ import annotations

from vllm_graphsafe import recognition
from vllm_graphsafe.backport.plan import (
    Plan,
    direct_call_assignment,
    edit,
    require_attributes,
    written_test_path,
)
from vllm_graphsafe.backport.source import LineEdit, MissingSymbolError, indent_block
from vllm_graphsafe.backport.tree import Tree
from vllm_graphsafe.fixes.v1_phase_dispatch import FIX, written_tests
from vllm_graphsafe.vllm_layout import V1_INPUT_BATCH, V1_RUNNER, V1_WORKER

_HAS_PREFILL_METHOD = '''\
def _has_prefill_request(self, num_reqs: int) -> bool:
    """Whether a scheduled request is not a decode as the attention metadata
    builders see it, which makes the batch a prefill whatever its shape.

    With speculation, _prepare_inputs has counted each row's drafts where the
    row schedules exactly 1 + its drafts (-1 for a prefill chunk, including
    output tokens re-computed after preemption); without, a decode schedules
    one token over prior state.
    """
{early_guard}    if self.uniform_decode_query_len > 1:
        return bool(
            (
                self.num_decode_draft_tokens.np[:num_reqs]
                != self.uniform_decode_query_len - 1
            ).any()
        )
    return bool((self.input_batch.num_computed_tokens_cpu[:num_reqs] == 0).any())

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
# A prefill chunk can have a decode batch's shape (vllm-project/vllm#53051).
if (
    {name}
    and force_uniform_decode is None
    and self._has_prefill_request(num_reqs)
):
    {name} = False
"""


def plan(tree: Tree) -> Plan:
    runner = tree.require(V1_RUNNER)
    owner = "GPUModelRunner._determine_batch_execution_and_padding"
    dispatch = runner.function(owner)
    shape_rule = runner.function("GPUModelRunner._is_uniform_decode")
    for parameter in ("num_reqs", "force_uniform_decode"):
        if parameter not in recognition.parameter_names(dispatch):
            raise MissingSymbolError(f"parameter {parameter} of {owner}")
    require_attributes(tree, V1_INPUT_BATCH, "InputBatch", _V1_PHASE_COLUMNS)
    require_attributes(tree, V1_RUNNER, "GPUModelRunner", _V1_RUNNER_COLUMNS)
    classification = direct_call_assignment(dispatch, "_is_uniform_decode", owner)
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
        FIX.id,
        "V1 runner" + (" (worker classifies early under PP + SP)" if early else ""),
        names=("GPUModelRunner._has_prefill_request",),
    )
    edit(plan, runner, edits)
    plan.tests[written_test_path(plan.fix_id)] = written_tests.v1_phase_dispatch(name)
    return plan


_V1_PHASE_COLUMNS = ("num_computed_tokens_cpu",)
_V1_RUNNER_COLUMNS = ("num_decode_draft_tokens", "uniform_decode_query_len")
