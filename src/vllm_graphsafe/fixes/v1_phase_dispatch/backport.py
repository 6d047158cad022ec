"""v1-phase-dispatch as a source edit: plain vLLM code deciding as the runtime
hook does. Where the worker calls the dispatch itself (pipeline + sequence
parallel on 0.20-0.31, before the runner updates its request state), both calls
hand it the step's scheduler output and the rule reads the requests from it."""

from __future__ import annotations

import ast

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes.v1_phase_dispatch import FIX
from vllm_graphsafe.fixes.v1_phase_dispatch.drafting import (
    counts_drafts_only_on_drafting_steps,
    recognise_draft_counting,
)
from vllm_graphsafe.fixes.v1_phase_dispatch.judge import DISPATCH
from vllm_graphsafe.tree_edits.plan import (
    Plan,
    direct_call_assignment,
    edit,
    render_written_tests,
    written_test_path,
)
from vllm_graphsafe.tree_edits.source import LineEdit, MissingSymbolError, SourceFile
from vllm_graphsafe.tree_edits.tree import Tree
from vllm_graphsafe.vllm_layout import V1_INPUT_BATCH, V1_RUNNER, V1_WORKER

_DISPATCH_NAME = DISPATCH.rsplit(".", 1)[-1]
_STEP = "scheduler_output"

_HAS_PREFILL_METHOD = '''\
def _has_prefill_request({parameters}) -> bool:
    """Whether a scheduled request is not a decode as the attention metadata
    builders see it, which makes the batch a prefill whatever its shape.

    With speculation, _prepare_inputs has counted each row's drafts where the
    row schedules exactly 1 + its drafts (-1 for a prefill chunk, including
    output tokens re-computed after preemption); without, a decode schedules
    one token over prior state.{drafting_doc}

    A runner without those counts (one built for a test with its input batch
    alone) is read from its input batch: a row is a decode once it has
    computed its prompt and, where the batch lists them, was handed its drafts
    this step.{step_doc}
    """
{step_branch}    if self.uniform_decode_query_len > 1:
        num_drafts = self.uniform_decode_query_len - 1
        draft_counts = getattr(self, "num_decode_draft_tokens", None)
        if draft_counts is None:
            input_batch = self.input_batch
            if (
                input_batch.num_computed_tokens_cpu[:num_reqs]
                < input_batch.num_prompt_tokens[:num_reqs]
            ).any():
                return True
            spec_token_ids = getattr(input_batch, "spec_token_ids", None)
            return spec_token_ids is not None and any(
                len(spec_token_ids[i]) != num_drafts for i in range(num_reqs)
            )
{drafting_branch}        return bool((draft_counts.np[:num_reqs] != num_drafts).any())
    return bool((self.input_batch.num_computed_tokens_cpu[:num_reqs] == 0).any())

'''

#: Where _prepare_inputs counts drafts only on a step that schedules some.
_DRAFTING_DOC = """ The counts are written only on a step that
    schedules drafts: on a step without any, the first row has none and every
    row of the decode width is a prefill chunk."""
_DRAFTING_BRANCH = """\
        if len(self.input_batch.spec_token_ids[0]) != num_drafts:
            return True
"""

_PARAMETERS = "self, num_reqs: int"
_STEP_PARAMETERS = """
    self,
    num_reqs: int,
    scheduler_output: "SchedulerOutput | None" = None,
"""
_STEP_DOC = """

    Given the step's scheduler output, the requests are read from it instead:
    under pipeline + sequence parallelism the worker classifies a step before
    the request states and these columns are updated."""
_STEP_BRANCH = """\
    if scheduler_output is not None:
        return self._has_scheduled_prefill_request(scheduler_output)
"""

_SCHEDULED_PREFILL_METHOD = '''\
def _has_scheduled_prefill_request(
    self, scheduler_output: "SchedulerOutput"
) -> bool:
    """_has_prefill_request for the step about to run, from its scheduler
    output alone: each request's computed count before the step (new requests
    carry theirs) and its scheduled tokens and drafts, counted as
    _prepare_inputs will count them."""
    computed = {{
        req.req_id: req.num_computed_tokens
        for req in scheduler_output.scheduled_new_reqs
    }}
    cached_reqs = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached_reqs.req_ids, cached_reqs.num_computed_tokens))
    num_drafts = self.uniform_decode_query_len - 1
    if num_drafts == 0:
        return any(
            computed[req_id] == 0
            for req_id in scheduler_output.num_scheduled_tokens
        )
{prompt_lengths}    for {loop_over}:
        draft_token_ids = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
        if draft_token_ids is None or len(draft_token_ids) != num_drafts:
            return True
{counted}    return False

'''
_NEW_REQS = """\
    new_reqs = {req.req_id: req for req in scheduler_output.scheduled_new_reqs}
"""
_EACH_REQUEST = "req_id in scheduler_output.num_scheduled_tokens"
_EACH_REQUEST_WIDTH = (
    "req_id, num_tokens in scheduler_output.num_scheduled_tokens.items()"
)
#: Drafts count where the row schedules exactly 1 + its drafts (0.27 on).
_COUNTED_BY_WIDTH = """\
        if num_tokens != num_drafts + 1:
            return True
"""
#: Drafts count where the row had computed its whole prompt (0.22 and forks).
_COUNTED_PAST_PROMPT = """\
        new_req = new_reqs.get(req_id)
        if new_req is None:
            num_prompt_tokens = self.requests[req_id].num_prompt_tokens
        elif new_req.prompt_token_ids is not None:
            num_prompt_tokens = len(new_req.prompt_token_ids)
        else:
            num_prompt_tokens = len(new_req.prompt_embeds)
        if computed[req_id] < num_prompt_tokens:
            return True
"""

_PHASE_GUARD = """\
# A prefill chunk can have a decode batch's shape (vllm-project/vllm#53051).
if (
    {name}
    and force_uniform_decode is None
    and self._has_prefill_request(num_reqs{step_argument})
):
    {name} = False
"""


def plan(tree: Tree) -> Plan:
    runner = tree.require(V1_RUNNER)
    dispatch = runner.function(DISPATCH)
    shape_rule = runner.function("GPUModelRunner._is_uniform_decode")
    for parameter in ("num_reqs", "force_uniform_decode"):
        if parameter not in recognition.parameter_names(dispatch):
            raise MissingSymbolError(f"parameter {parameter} of {DISPATCH}")
    tree.require(V1_INPUT_BATCH).require_class(
        "InputBatch", ("num_computed_tokens_cpu",)
    )
    runner.require_class(
        "GPUModelRunner", ("num_decode_draft_tokens", "uniform_decode_query_len")
    )
    classification = direct_call_assignment(dispatch, "_is_uniform_decode", DISPATCH)
    name = classification.targets[0].id  # type: ignore[attr-defined]
    worker = tree.source(V1_WORKER) if tree.exists(V1_WORKER) else None
    early = worker is not None and recognition.calls_name(worker.tree, _DISPATCH_NAME)
    prepare_inputs = runner.function("GPUModelRunner._prepare_inputs")
    drafting_only = counts_drafts_only_on_drafting_steps(prepare_inputs)
    # The inserted scheduler-output rule counts drafts as _prepare_inputs does.
    counting = recognise_draft_counting(prepare_inputs) if early else None
    if early and counting is None:
        raise MissingSymbolError(
            "the draft counting of GPUModelRunner._prepare_inputs (a condition "
            "on the prompt length or on the scheduled tokens)"
        )
    methods = _HAS_PREFILL_METHOD.format(
        parameters=_STEP_PARAMETERS if early else _PARAMETERS,
        drafting_doc=_DRAFTING_DOC if drafting_only else "",
        drafting_branch=_DRAFTING_BRANCH if drafting_only else "",
        step_doc=_STEP_DOC if early else "",
        step_branch=_STEP_BRANCH if early else "",
    )
    if counting is not None:
        methods += _SCHEDULED_PREFILL_METHOD.format(
            prompt_lengths=_NEW_REQS if counting.past_prompt else "",
            loop_over=_EACH_REQUEST if counting.past_prompt else _EACH_REQUEST_WIDTH,
            counted=_COUNTED_PAST_PROMPT if counting.past_prompt else _COUNTED_BY_WIDTH,
        )
    guard = _PHASE_GUARD.format(name=name, step_argument=f", {_STEP}" if early else "")
    edits = [
        runner.insert_after(shape_rule, "\n" + methods.rstrip("\n") + "\n"),
        runner.insert_after(classification, guard),
    ]
    layout = "V1 runner"
    names = ["GPUModelRunner._has_prefill_request"]
    if early:
        # The dispatch takes the step; the runner's own call hands it over.
        imported = {
            alias.asname or alias.name
            for node in ast.walk(runner.tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        if "SchedulerOutput" not in imported:
            raise MissingSymbolError(
                f"an import of SchedulerOutput in {runner.relpath}"
            )
        edits += [
            _step_keyword(runner, "GPUModelRunner.execute_model"),
            _append_parameter(
                runner, dispatch, f'{_STEP}: "SchedulerOutput | None" = None'
            ),
        ]
        layout += " and worker (its early call under PP + SP hands over the step)"
        names.append("GPUModelRunner._has_scheduled_prefill_request")
    plan = Plan(FIX.id, layout, names=tuple(names))
    edit(plan, runner, edits)
    if early:
        assert worker is not None
        edit(plan, worker, [_step_keyword(worker, "Worker.execute_model")])
    sections = {
        "dispatch": True,
        "scheduled_step": early,
        "drafting_steps_only": drafting_only,
        "worker": early,
    }
    constants: dict[str, bool | str] = {"CLASSIFICATION": name}
    if counting is not None:
        constants["DRAFTS_COUNT_PAST_PROMPT"] = counting.past_prompt
    plan.tests[written_test_path(plan.fix_id)] = render_written_tests(
        FIX.package,
        [section for section, wanted in sections.items() if wanted],
        **constants,
    )
    return plan


def _comma_follows(source: SourceFile, node: ast.AST) -> bool:
    end_line: int = node.end_lineno  # type: ignore[attr-defined]
    end_column: int = node.end_col_offset  # type: ignore[attr-defined]
    line = source.lines[end_line - 1].encode()
    return line[end_column:].decode().lstrip().startswith(",")


def _step_keyword(source: SourceFile, owner: str) -> LineEdit:
    """``scheduler_output=scheduler_output,`` on a line after the last keyword
    of ``owner``'s one call of the dispatch (vLLM's layout: one argument a
    line, each with its comma)."""
    execute = source.function(owner)
    if _STEP not in recognition.parameter_names(execute):
        raise MissingSymbolError(f"parameter {_STEP} of {owner}")
    calls = [
        call
        for call in recognition.calls(execute)
        if recognition.called_name(call) == _DISPATCH_NAME
    ]
    if len(calls) != 1:
        raise MissingSymbolError(f"one call of {_DISPATCH_NAME} in {owner}")
    call = calls[0]
    if not call.keywords or not _comma_follows(source, call.keywords[-1]):
        raise MissingSymbolError(
            f"the call of {_DISPATCH_NAME} in {source.relpath} (line {call.lineno}) "
            "with one keyword a line"
        )
    last = call.keywords[-1]
    assert last.end_lineno is not None
    return LineEdit(
        last.end_lineno,
        last.end_lineno,
        f"{_indent(source, last.lineno)}{_STEP}={_STEP},\n",
    )


def _append_parameter(
    source: SourceFile, function: recognition.FunctionNode, parameter: str
) -> LineEdit:
    arguments = function.args
    if arguments.kwarg is not None:
        raise MissingSymbolError(f"{function.name} without **{arguments.kwarg.arg}")
    nodes: list[ast.AST] = [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        *arguments.defaults,
        *[default for default in arguments.kw_defaults if default is not None],
    ]
    last = max(nodes, key=lambda node: (node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]
    if not _comma_follows(source, last):
        raise MissingSymbolError(
            f"the parameters of {function.name} in {source.relpath} one a line"
        )
    end_line: int = last.end_lineno  # type: ignore[attr-defined]
    return LineEdit(end_line, end_line, f"{_indent(source, end_line)}{parameter},\n")


def _indent(source: SourceFile, line_number: int) -> str:
    line = source.lines[line_number - 1]
    return line[: len(line) - len(line.lstrip())]
