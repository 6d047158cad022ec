"""CPU tests the backport writes into a tree's ``tests/`` for v1-phase-dispatch.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the rows they state, never the code under test. They test the edit
where it is made: the predicate the backport adds, and the dispatch's
classification right after the call that the backport guards, as the rest of
the dispatch consumes it. The dispatch runs on a runner that holds only what
the classification reads and stops at its first read of anything else, so a
fork that reads more in the rest of its dispatch does not break them.
"""

from __future__ import annotations

from vllm_graphsafe.backport.plan import WRITTEN_TEST_HEADER as HEADER

_V1_PHASE_DISPATCH = '''\
"""The V1 runner keeps non-decode rows off the uniform decode CUDA graph.

A prefill chunk of exactly 1 + num_speculative_tokens tokens has a uniform
decode batch's shape (vllm-project/vllm#53051). Each case states its rows as
_prepare_inputs leaves them for the attention metadata builders; the expected
classification follows from them: uniform decode iff every request schedules
the decode query length and is a decode to the builders (with speculation: it
has query length - 1 drafts; without: it had computed a token before).
"""

{extra_stdlib}import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from vllm.v1.worker.gpu_model_runner import GPUModelRunner
{extra_vllm}
MAX_ROWS = 16
NO_DRAFTS = -1


def _runner(rows, decode_query_len):
    """A runner holding only what the classification reads.

    rows: (num_computed, decode_draft_count) per scheduled row; the count is
    -1 for a prefill chunk, as _prepare_inputs writes it.
    """
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    drafts = np.full(MAX_ROWS, NO_DRAFTS, dtype=np.int32)
    for index, (num_computed, num_drafts) in enumerate(rows):
        computed[index] = num_computed
        drafts[index] = num_drafts
    # Each row's drafts this step, as _update_states leaves them.
    scheduled_drafts = [[0] * max(int(count), 0) for count in drafts]
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(
        uniform_decode_query_len=decode_query_len,
        input_batch=SimpleNamespace(
            num_computed_tokens_cpu=computed, spec_token_ids=scheduled_drafts
        ),
        num_decode_draft_tokens=SimpleNamespace(np=drafts),
    )
    return runner


def _is_decode(row, decode_query_len):
    num_computed, num_drafts = row
    if decode_query_len > 1:
        return num_drafts == decode_query_len - 1
    return num_computed > 0


def _classification(runner, num_reqs, force_uniform_decode=None):
    """The dispatch's uniform-decode answer, as the rest of it consumes it."""
    dispatch = inspect.unwrap(GPUModelRunner._determine_batch_execution_and_padding)
    q = runner.uniform_decode_query_len
    kwargs = {{}}
    if force_uniform_decode is not None:
        kwargs["force_uniform_decode"] = force_uniform_decode
    return _answer_of_the_dispatch(
        lambda: dispatch(
            runner,
            num_tokens=q * num_reqs,
            num_reqs=num_reqs,
            num_scheduled_tokens_np=np.full(num_reqs, q, dtype=np.int32),
            max_num_scheduled_tokens=q,
            use_cascade_attn=False,
            **kwargs,
        )
    )


def _answer_of_the_dispatch(call):
    """Run ``call`` until the dispatch reads state its runner was not given,
    past the classification; the answer is read from the dispatch's frame."""
    dispatch = inspect.unwrap(GPUModelRunner._determine_batch_execution_and_padding)
    with pytest.raises(AttributeError) as stopped:
        call()
    traceback = stopped.value.__traceback__
    while traceback is not None and traceback.tb_frame.f_code is not dispatch.__code__:
        traceback = traceback.tb_next
    assert traceback is not None, "the dispatch stopped before it ran"
    answers = traceback.tb_frame.f_locals
    assert "{name}" in answers, "the dispatch stopped before it classified"
    return bool(answers["{name}"])


# (num_computed, decode_draft_count) per request, for query length q; every
# request schedules q tokens.
CASES = {{
    "fresh_prompt": lambda q: [(0, NO_DRAFTS)],
    "equal_fresh_prompts": lambda q: [(0, NO_DRAFTS)] * 3,
    "chunked_prompt_tail": lambda q: [(512, NO_DRAFTS)],
    "decodes_and_one_prompt": lambda q: [(20 + 9 * i, q - 1) for i in range(3)]
    + [(0, NO_DRAFTS)],
    "reprefill_after_preemption": lambda q: [(25, q - 1), (17, NO_DRAFTS)],
    "all_decode": lambda q: [(25 + 3 * i, q - 1) for i in range(4)],
    "padded_prompt_tail": lambda q: [(128, q - 1), (40, q - 1)],
}}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3, 7])
def test_real_step_is_uniform_decode_only_when_every_row_is_a_decode(
    case, num_speculative_tokens
):
    q = num_speculative_tokens + 1
    rows = CASES[case](q)
    runner = _runner(rows, q)
    every_row_decodes = all(_is_decode(row, q) for row in rows)

    has_prefill = runner._has_prefill_request(len(rows))
    uniform_decode = _classification(runner, len(rows))

    assert has_prefill == (not every_row_decodes)
    assert uniform_decode == every_row_decodes


@pytest.mark.parametrize("forced", [True, False])
def test_capture_and_dummy_runs_keep_their_classification(forced):
    runner = _runner(CASES["equal_fresh_prompts"](4), 4)

    # Prompt rows, yet a capture or dummy run keeps the class it asked for.
    assert runner._has_prefill_request(3) is True
    assert _classification(runner, 3, force_uniform_decode=forced) is forced


def test_rows_past_the_batch_are_ignored():
    rows = CASES["all_decode"](4)
    runner = _runner([*rows, (0, NO_DRAFTS)], 4)

    assert _classification(runner, len(rows)) is True
    assert runner._has_prefill_request(len(rows)) is False


# -- a runner built with its input batch alone ----------------------------------
# Tests elsewhere build the runner with object.__new__ and give it only an input
# batch of computed and prompt lengths (and perhaps each row's drafts): no draft
# counts of the builders. There a row is a decode once it has computed its
# prompt and, where the batch lists them, was handed its drafts this step;
# without speculation, once it has computed a token.


def _batch_only_runner(rows, decode_query_len, lists_drafts):
    """rows: (num_computed, num_prompt, num_drafts this step) per row."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prompt = np.zeros(MAX_ROWS, dtype=np.int32)
    for index, (num_computed, num_prompt, _) in enumerate(rows):
        computed[index] = num_computed
        prompt[index] = num_prompt
    batch = SimpleNamespace(num_computed_tokens_cpu=computed, num_prompt_tokens=prompt)
    if lists_drafts:
        batch.spec_token_ids = [[0] * row[2] for row in rows] + [[]] * (
            MAX_ROWS - len(rows)
        )
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(uniform_decode_query_len=decode_query_len, input_batch=batch)
    return runner


def _is_decode_by_batch(row, decode_query_len, lists_drafts):
    num_computed, num_prompt, num_drafts = row
    if decode_query_len == 1:
        return num_computed > 0
    if num_computed < num_prompt:
        return False
    return not lists_drafts or num_drafts == decode_query_len - 1


BATCH_ONLY_CASES = {{
    "fresh_prompt": lambda q: [(0, q, 0)],
    "chunked_prompt_tail": lambda q: [(512, 512 + q, 0)],
    "prefix_cache_hit": lambda q: [(64, 64 + q, 0)],
    "decodes_and_one_prompt": lambda q: [(25 + i, 10, q - 1) for i in range(3)]
    + [(0, q, 0)],
    "reprefill_after_preemption": lambda q: [(17, 10, 0)],
    "all_decode": lambda q: [(25 + 3 * i, 10, q - 1) for i in range(4)],
}}


@pytest.mark.parametrize("lists_drafts", [True, False])
@pytest.mark.parametrize("case", sorted(BATCH_ONLY_CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3])
def test_a_runner_without_draft_counts_is_read_from_its_input_batch(
    case, num_speculative_tokens, lists_drafts
):
    q = num_speculative_tokens + 1
    rows = BATCH_ONLY_CASES[case](q)
    runner = _batch_only_runner(rows, q, lists_drafts)
    every_row_decodes = all(_is_decode_by_batch(row, q, lists_drafts) for row in rows)

    has_prefill = runner._has_prefill_request(len(rows))
    uniform_decode = _classification(runner, len(rows))

    assert has_prefill == (not every_row_decodes)
    assert uniform_decode == every_row_decodes
'''


_SCHEDULED_STEP = '''

# -- the step's scheduler output -----------------------------------------------
# This tree's _prepare_inputs leaves the draft counts of the last drafting step
# in place on a step without drafts (and under pipeline + sequence parallelism
# its worker dispatches before the runner updates its request state): every
# dispatch of a step reads the step's scheduler output. The runners below hold
# the previous step's columns, which say the opposite of the step's answer.

DRAFTS_COUNT_PAST_PROMPT = {past_prompt}


def _step(requests):
    """A scheduler output. requests: (req_id, is_new, num_computed,
    num_prompt, num_scheduled, num_drafts or None)."""
    new = [r for r in requests if r[1]]
    cached = [r for r in requests if not r[1]]
    return SimpleNamespace(
        num_scheduled_tokens={{r[0]: r[4] for r in requests}},
        total_num_scheduled_tokens=sum(r[4] for r in requests),
        scheduled_spec_decode_tokens={{
            r[0]: [-1] * r[5] for r in requests if r[5] is not None
        }},
        scheduled_new_reqs=[
            SimpleNamespace(
                req_id=r[0],
                num_computed_tokens=r[2],
                prompt_token_ids=[0] * r[3],
                prompt_embeds=None,
            )
            for r in new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r[0] for r in cached],
            num_computed_tokens=[r[2] for r in cached],
        ),
    )


def _is_scheduled_decode(request, decode_query_len):
    _, _, num_computed, num_prompt, num_scheduled, num_drafts = request
    if decode_query_len == 1:
        return num_computed > 0
    if num_drafts != decode_query_len - 1:
        return False
    if DRAFTS_COUNT_PAST_PROMPT:
        return num_computed >= num_prompt
    return num_scheduled == num_drafts + 1


def _stale_runner(requests, decode_query_len):
    """A runner whose columns say the opposite of the step's answer."""
    decodes = all(_is_scheduled_decode(r, decode_query_len) for r in requests)
    stale = (0, NO_DRAFTS) if decodes else (50, decode_query_len - 1)
    runner = _runner([stale] * len(requests), decode_query_len)
    runner.requests = {{
        r[0]: SimpleNamespace(num_prompt_tokens=r[3]) for r in requests if not r[1]
    }}
    return runner


# (req_id, is_new, num_computed, num_prompt, num_scheduled, num_drafts) per
# request, for query length q.
STEP_CASES = {{
    "fresh_prompt": lambda q: [("new", True, 0, q, q, None)],
    "prefix_cache_hit": lambda q: [("hit", True, 64, 64 + q, q, None)],
    "reprefill_after_preemption": lambda q: [("resumed", False, 17, 10, q, None)],
    "decodes": lambda q: [(f"d{{i}}", False, 25 + i, 10, q, q - 1) for i in range(3)],
    "decode_and_a_fresh_prompt": lambda q: [
        ("d", False, 25, 10, q, q - 1),
        ("new", True, 0, q, q, None),
    ],
    "padded_prompt_tail": lambda q: [
        ("d", False, 25, 10, q, q - 1),
        ("tail", True, 128, 129, q, q - 1),
    ],
}}


@pytest.mark.parametrize("case", sorted(STEP_CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3])
def test_a_step_is_classified_from_its_scheduler_output(case, num_speculative_tokens):
    q = num_speculative_tokens + 1
    requests = STEP_CASES[case](q)
    runner = _stale_runner(requests, q)

    has_prefill = runner._has_prefill_request(len(requests), _step(requests))

    assert has_prefill == (not all(_is_scheduled_decode(r, q) for r in requests))


def test_the_runner_hands_the_step_to_its_own_dispatch():
    """Both dispatches of a step decide from the same scheduler output."""
    source = textwrap.dedent(inspect.getsource(GPUModelRunner.execute_model))
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "_determine_batch_execution_and_padding"
    ]
    assert len(calls) == 1
    assert [
        keyword.value.id
        for keyword in calls[0].keywords
        if keyword.arg == "scheduler_output" and isinstance(keyword.value, ast.Name)
    ] == ["scheduler_output"]
'''


_DRAFTING_STEPS_ONLY = '''

# -- draft counts written only on drafting steps --------------------------------


def test_a_step_without_drafts_reads_no_stale_draft_counts():
    """This tree's _prepare_inputs leaves the last drafting step's counts in
    place on a step that schedules no drafts (a K+1-token prompt chunk alone):
    such a step is a prefill, whatever the counts still say."""
    q = 4
    runner = _runner([(25, q - 1), (31, q - 1)], q)
    runner.input_batch.spec_token_ids = [[] for _ in range(MAX_ROWS)]

    assert runner._has_prefill_request(2) is True
    assert _classification(runner, 2) is False
'''

_WORKER_CLASSIFIES_EARLY = '''

# -- the worker's early dispatch (pipeline + sequence parallelism) -------------


def _worker(runner):
    """A worker on one of several pipeline stages, with sequence parallelism."""
    worker = object.__new__(Worker)
    worker.__dict__.update(
        _pp_send_work=[],
        vllm_config=SimpleNamespace(
            parallel_config=SimpleNamespace(
                pipeline_parallel_size=2, tensor_parallel_size=1
            ),
            compilation_config=SimpleNamespace(
                pass_config=SimpleNamespace(enable_sp=True)
            ),
        ),
        use_v2_model_runner=False,
        model_runner=runner,
    )
    return worker


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_the_worker_classifies_the_step_it_is_about_to_run(case):
    q = 4
    requests = STEP_CASES[case](q)
    worker = _worker(_stale_runner(requests, q))

    every_request_decodes = all(_is_scheduled_decode(r, q) for r in requests)

    uniform_decode = _answer_of_the_dispatch(
        lambda: Worker.execute_model(worker, _step(requests))
    )

    assert worker.model_runner._has_prefill_request(
        len(requests), _step(requests)
    ) == (not every_request_decodes)
    assert uniform_decode == every_request_decodes
'''


def v1_phase_dispatch(
    classification: str = "uniform_decode",
    *,
    scheduled_step: bool = False,
    worker_classifies_early: bool = False,
    drafts_count_past_prompt: bool = False,
    drafts_counted_when_drafting: bool = False,
) -> str:
    """The tests for a tree whose dispatch names its classification
    ``classification``; with ``scheduled_step``, those of the step's scheduler
    output too (the dispatch is handed the step), whose drafts count where a
    row is past its prompt if ``drafts_count_past_prompt``, else where it
    schedules exactly 1 + its drafts; with ``worker_classifies_early``, those
    of the worker's own early dispatch; with ``drafts_counted_when_drafting``,
    that a step without drafts is not read from the last drafting step's
    counts."""
    text = _V1_PHASE_DISPATCH.format(
        name=classification,
        extra_stdlib="import ast\n" if scheduled_step else "",
        extra_vllm=(
            "from vllm.v1.worker.gpu_worker import Worker\n"
            if worker_classifies_early
            else ""
        ),
    )
    if scheduled_step:
        text = text.replace("import inspect\n", "import inspect\nimport textwrap\n", 1)
        text += _SCHEDULED_STEP.format(past_prompt=drafts_count_past_prompt)
    if drafts_counted_when_drafting:
        text += _DRAFTING_STEPS_ONLY
    if worker_classifies_early:
        text += _WORKER_CLASSIFIES_EARLY
    return HEADER + text
