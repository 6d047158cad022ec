"""Model Runner V2 replays a uniform decode CUDA graph only for decode steps: a
prompt chunk of the decode query length has a decode batch's shape
(vllm-project/vllm#51865)."""

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import numpy.typing as npt
import pytest

from vllm.v1.worker.gpu.model_runner import GPUModelRunner

MAX_ROWS = 16
#: Whether each phase column is a host array (else a buffer with a host view
#: ``.np``); set by the backport.
COMPUTED_IS_ARRAY = True
PREFILL_LEN_IS_ARRAY = False

Requests = dict[str, tuple[int, int, int]]


def _column(values: npt.NDArray[np.int32], is_array: bool) -> object:
    return values if is_array else SimpleNamespace(np=values)


def _runner(requests: Requests) -> SimpleNamespace:
    """requests: req_id -> (state row, prefill_len, num_computed_prefill_tokens)."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prefill_len = np.zeros(MAX_ROWS, dtype=np.int32)
    for row, num_prefill, num_computed in requests.values():
        prefill_len[row] = num_prefill
        computed[row] = num_computed
    return SimpleNamespace(
        req_states=SimpleNamespace(
            num_computed_prefill_tokens=_column(computed, COMPUTED_IS_ARRAY),
            prefill_len=_column(prefill_len, PREFILL_LEN_IS_ARRAY),
            req_id_to_index={req_id: row for req_id, (row, _, _) in requests.items()},
        )
    )


def _scheduler_output(scheduled: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(
        num_scheduled_tokens=dict(scheduled),
        total_num_scheduled_tokens=sum(scheduled.values()),
    )


def _expected(requests: Requests, scheduled: dict[str, int]) -> int | None:
    widths = set(scheduled.values())
    in_prefill = any(requests[req_id][2] < requests[req_id][1] for req_id in scheduled)
    if len(widths) != 1 or in_prefill:
        return None
    return widths.pop()


def _count(
    runner: SimpleNamespace, scheduled: dict[str, int], dummy_run: bool = False
) -> object:
    return GPUModelRunner._get_uniform_decode_token_count(
        runner, _scheduler_output(scheduled), dummy_run
    )


# Request states as in _runner; each scheduled request schedules q tokens.
CASES: dict[str, Callable[[int], tuple[Requests, dict[str, int]]]] = {
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
    case: str, num_speculative_tokens: int
) -> None:
    q = num_speculative_tokens + 1
    requests, scheduled = CASES[case](q)
    runner = _runner(requests)

    assert _count(runner, scheduled) == _expected(requests, scheduled)


def test_dummy_batches_keep_the_shape_rule() -> None:
    requests, scheduled = CASES["fresh_prompt"](4)
    runner = _runner(requests)

    assert _count(runner, scheduled, dummy_run=True) == 4
