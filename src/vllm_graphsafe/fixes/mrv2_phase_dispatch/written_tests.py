"""CPU tests the backport writes into a tree's ``tests/`` for mrv2-phase-dispatch.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the batch they build, never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.backport.plan import WRITTEN_TEST_HEADER as HEADER

_MRV2_COMMON = '''\
"""Model Runner V2 replays a uniform decode CUDA graph only for decode steps.

A prompt chunk of the decode query length has a decode batch's shape
(vllm-project/vllm#51865). Each case states the request states and the
scheduled tokens; the expected count follows from them: the query length iff
the shape is uniform and no scheduled request is still in prefill.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from vllm.v1.worker.gpu.model_runner import GPUModelRunner

MAX_ROWS = 16


def _runner(requests):
    """requests: req_id -> (state row, prefill_len, num_computed_prefill_tokens)."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prefill_len = np.zeros(MAX_ROWS, dtype=np.int32)
    for row, num_prefill, num_computed in requests.values():
        prefill_len[row] = num_prefill
        computed[row] = num_computed
    # Only what a request's phase is read from: the state's id -> row map and
    # its two phase columns (a fork may add any other attribute).
    return SimpleNamespace(
        req_states=SimpleNamespace(
            num_computed_prefill_tokens=@@COMPUTED@@,
            prefill_len=@@PREFILL@@,
            req_id_to_index={req_id: row for req_id, (row, _, _) in requests.items()},
        )
    )


def _scheduler_output(scheduled):
    return SimpleNamespace(
        num_scheduled_tokens=dict(scheduled),
        total_num_scheduled_tokens=sum(scheduled.values()),
    )


def _expected(requests, scheduled):
    widths = set(scheduled.values())
    in_prefill = any(
        requests[req_id][2] < requests[req_id][1] for req_id in scheduled
    )
    if len(widths) != 1 or in_prefill:
        return None
    return widths.pop()


def _count(runner, scheduled, dummy_run=False):
    return GPUModelRunner._get_uniform_decode_token_count(
        runner, _scheduler_output(scheduled), dummy_run
    )


# (state row, prefill_len, num_computed_prefill_tokens) per request; q tokens each.
CASES = {
    "fresh_prompt": lambda q: ({"a": (0, q, 0)}, {"a": q}),
    "chunked_prompt_tail": lambda q: ({"a": (3, 800 + q, 800)}, {"a": q}),
    "decode_and_prompt": lambda q: (
        {"a": (0, 20, 20), "b": (5, q, 0)},
        {"a": q, "b": q},
    ),
    "all_decode": lambda q: (
        {"a": (2, 20, 20), "b": (9, 7, 7)},
        {"a": q, "b": q},
    ),
    "unscheduled_prompt": lambda q: (
        {"a": (1, 20, 20), "b": (4, 900, 100)},
        {"a": q},
    ),
    "non_uniform": lambda q: (
        {"a": (0, 20, 20), "b": (1, 20, 20)},
        {"a": q, "b": q + 1},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3, 7])
def test_real_step_counts_uniform_decode_only_past_every_prompt(
    case, num_speculative_tokens
):
    q = num_speculative_tokens + 1
    requests, scheduled = CASES[case](q)
    runner = _runner(requests)

    assert _count(runner, scheduled) == _expected(requests, scheduled)


def test_dummy_batches_keep_the_shape_rule():
    requests, scheduled = CASES["fresh_prompt"](4)
    runner = _runner(requests)

    assert _count(runner, scheduled, dummy_run=True) == 4
'''

_MRV2_UPSTREAM_FUNCTION = """

@pytest.mark.parametrize("eligible", [True, False])
def test_decode_token_count_helper(eligible):
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    expected = 4 if eligible else None
    assert get_uniform_decode_token_count(3, 12, 4, eligible) == expected
    assert get_uniform_decode_token_count(2, 9, 5, eligible) is None
    assert get_uniform_decode_token_count(0, 0, 0, eligible) is None
"""

_MRV2_1CAT_FUNCTION = """

@pytest.mark.parametrize("has_prefill", [True, False])
def test_decode_token_count_helper(has_prefill):
    from vllm.v1.worker.gpu.cudagraph_utils import get_uniform_decode_token_count

    expected = None if has_prefill else 4
    assert get_uniform_decode_token_count(3, 12, 4, has_prefill) == expected
    assert get_uniform_decode_token_count(2, 9, 5, has_prefill) is None
    assert get_uniform_decode_token_count(0, 0, 0, has_prefill) is None
"""


def mrv2_phase_dispatch(
    upstream_names: bool, computed_np: bool, prefill_np: bool
) -> str:
    text = _MRV2_COMMON.replace(
        "@@COMPUTED@@", "computed" if computed_np else "SimpleNamespace(np=computed)"
    ).replace(
        "@@PREFILL@@",
        "prefill_len" if prefill_np else "SimpleNamespace(np=prefill_len)",
    )
    extra = _MRV2_UPSTREAM_FUNCTION if upstream_names else _MRV2_1CAT_FUNCTION
    return HEADER + text + extra
