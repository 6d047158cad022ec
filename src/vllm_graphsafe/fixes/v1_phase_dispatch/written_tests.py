"""CPU tests the backport writes into a tree's ``tests/`` for v1-phase-dispatch.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the batch they build, never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.backport.plan import WRITTEN_TEST_HEADER as HEADER

_V1_PHASE_DISPATCH = '''\
"""The V1 runner keeps prompt chunks off the uniform decode CUDA graph.

A prompt chunk of exactly 1 + num_speculative_tokens tokens has a uniform
decode batch's shape (vllm-project/vllm#53051). Each case states its rows; the
expected classification follows from them: uniform decode iff every request
schedules the decode query length and had computed its whole prompt.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

MAX_ROWS = 16


def _runner(rows, decode_query_len, stale_rows=()):
    """A runner with just the state the dispatch decision reads."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prompt = np.zeros(MAX_ROWS, dtype=np.int32)
    for index, (num_prompt, num_computed, _) in enumerate([*rows, *stale_rows]):
        prompt[index] = num_prompt
        computed[index] = num_computed
    decisions = []

    class RecordingDispatcher:
        def dispatch(self, num_tokens, uniform_decode, **kwargs):
            decisions.append(bool(uniform_decode))
            mode = CUDAGraphMode.FULL if uniform_decode else CUDAGraphMode.PIECEWISE
            return mode, BatchDescriptor(num_tokens=num_tokens)

    runner = object.__new__(GPUModelRunner)
    parallel = SimpleNamespace(
        data_parallel_size=1,
        data_parallel_rank=0,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
    )
    compilation = SimpleNamespace(pass_config=SimpleNamespace(enable_sp=False))
    runner.__dict__.update(
        uniform_decode_query_len=decode_query_len,
        input_batch=SimpleNamespace(
            num_computed_tokens_cpu=computed,
            num_prompt_tokens=prompt,
            num_reqs=len(rows),
            lora_id_to_lora_request={},
        ),
        cudagraph_dispatcher=RecordingDispatcher(),
        model_config=SimpleNamespace(is_encoder_decoder=False),
        parallel_config=parallel,
        compilation_config=compilation,
        vllm_config=SimpleNamespace(
            parallel_config=parallel,
            compilation_config=compilation,
            observability_config=SimpleNamespace(cudagraph_metrics=False),
        ),
    )
    return runner, decisions


def _dispatch(runner, scheduled, force_uniform_decode=None):
    kwargs = {}
    if force_uniform_decode is not None:
        kwargs["force_uniform_decode"] = force_uniform_decode
    runner._determine_batch_execution_and_padding(
        num_tokens=sum(scheduled),
        num_reqs=len(scheduled),
        num_scheduled_tokens_np=np.array(scheduled, dtype=np.int32),
        max_num_scheduled_tokens=max(scheduled),
        use_cascade_attn=False,
        **kwargs,
    )


def _expected(rows, decode_query_len):
    return all(
        scheduled == decode_query_len and num_computed >= num_prompt
        for num_prompt, num_computed, scheduled in rows
    )


# (num_prompt, num_computed, num_scheduled) per request, for query length q.
CASES = {
    "fresh_prompt": lambda q: [(q, 0, q)],
    "equal_fresh_prompts": lambda q: [(q, 0, q)] * 3,
    "chunked_prompt_tail": lambda q: [(512 + q, 512, q)],
    "decodes_and_one_prompt": lambda q: [(20, 20 + 9 * i, q) for i in range(3)]
    + [(q, 0, q)],
    "all_decode": lambda q: [(10 + i, 25 + 3 * i, q) for i in range(4)],
    "just_finished_prompts": lambda q: [(40, 40, q)] * 2,
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3, 7])
def test_real_step_is_uniform_decode_only_past_every_prompt(
    case, num_speculative_tokens
):
    q = num_speculative_tokens + 1
    rows = CASES[case](q)
    runner, decisions = _runner(rows, q)

    _dispatch(runner, [scheduled for _, _, scheduled in rows])

    assert decisions == [_expected(rows, q)]


@pytest.mark.parametrize("forced", [True, False])
def test_capture_and_dummy_runs_keep_their_classification(forced):
    rows = CASES["equal_fresh_prompts"](4)
    runner, decisions = _runner(rows, 4)

    _dispatch(runner, [4, 4, 4], force_uniform_decode=forced)

    assert decisions == [forced]


def test_rows_past_the_batch_are_ignored():
    rows = CASES["all_decode"](4)
    runner, decisions = _runner(rows, 4, stale_rows=[(300, 0, 0)])

    _dispatch(runner, [4] * len(rows))

    assert decisions == [True]
'''


def v1_phase_dispatch() -> str:
    return HEADER + _V1_PHASE_DISPATCH
