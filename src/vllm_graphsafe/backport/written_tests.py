"""CPU tests the backport writes into a tree's ``tests/``, beside the worker tests.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the batch they build, never the code under test.
"""

from __future__ import annotations

HEADER = """\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""


def path_for(fix_id: str) -> str:
    return f"tests/v1/worker/test_graphsafe_backport_{fix_id.replace('-', '_')}.py"


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


_V1_DUMMY_STAGING = '''\
"""FULL dummy runs of the V1 runner stage lengths and positions that agree.

For every active request seq_len == num_computed + num_scheduled, and for every
active token position == num_computed[req] + query_pos; padded rows and tokens
are cleared (vllm-project/vllm#54604).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

MAX_ROWS = 8
MAX_TOKENS = 32
STALE = 777


def _runner(requested_seq_lens, saved_computed=None):
    """A runner holding stale buffers and the requested dummy seq_lens."""
    runner = object.__new__(GPUModelRunner)
    computed = np.full(MAX_ROWS, STALE, dtype=np.int32)
    if saved_computed is not None:
        computed[: len(saved_computed)] = saved_computed
    seq_lens = torch.zeros(MAX_ROWS, dtype=torch.int32)
    seq_lens[: len(requested_seq_lens)] = torch.tensor(requested_seq_lens)
@@SEQ_LENS_STATE@@
    runner.__dict__.update(
        positions=torch.full((MAX_TOKENS,), STALE, dtype=torch.int64),
        input_batch=SimpleNamespace(num_computed_tokens_cpu=computed),
    )
    return runner


def _cpu_seq_lens(runner):
    return @@CPU_SEQ_LENS@@


def _device_seq_lens(runner):
    return @@DEVICE_SEQ_LENS@@


def _stage(runner, scheduled):
    return runner._stage_dummy_request_metadata(np.array(scheduled, dtype=np.int32))


def _assert_request_invariants(runner, scheduled):
    num_reqs = len(scheduled)
    seq_lens = _cpu_seq_lens(runner)[:num_reqs].astype(np.int64)
    computed = runner.input_batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64)
    assert (seq_lens == computed + np.array(scheduled)).all()
    assert (computed >= 0).all()
    expected = np.concatenate(
        [computed[i] + np.arange(n) for i, n in enumerate(scheduled)]
    )
    assert runner.positions[: sum(scheduled)].tolist() == expected.tolist()
    assert (_cpu_seq_lens(runner) == _device_seq_lens(runner)).all()


@pytest.mark.parametrize("profile_seq_len", [1, 4, 4096])
def test_profile_seq_len_with_four_scheduled_tokens(profile_seq_len):
    runner = _runner([profile_seq_len])

    _stage(runner, [4])

    _assert_request_invariants(runner, [4])
    expected_computed = max(profile_seq_len, 4) - 4
    assert runner.input_batch.num_computed_tokens_cpu[0] == expected_computed
    assert runner.positions[:4].tolist() == [expected_computed + i for i in range(4)]
    assert _cpu_seq_lens(runner)[0] == max(profile_seq_len, 4)


def test_padded_rows_and_tokens_are_cleared():
    scheduled = [3, 3, 2]
    runner = _runner([64, 64, 64, 64, 64])

    _stage(runner, scheduled)

    _assert_request_invariants(runner, scheduled)
    assert (runner.input_batch.num_computed_tokens_cpu[3:] == 0).all()
    assert (_cpu_seq_lens(runner)[3:] == 0).all()
    assert (runner.positions[8:] == 0).all()


def test_ragged_uniform_decode_batch_ends_at_the_causal_tail():
    runner = _runner([300, 300, 300])

    _stage(runner, [4, 4, 3])

    _assert_request_invariants(runner, [4, 4, 3])
    assert runner.positions[8:11].tolist() == [297, 298, 299]


def test_the_computed_counts_before_staging_are_returned_for_restoring():
    real = np.array([120, 7, 33], dtype=np.int32)
    runner = _runner([4096, 4096], saved_computed=real)

    saved = _stage(runner, [4, 4])

    assert saved[:3].tolist() == real.tolist()
    assert runner.input_batch.num_computed_tokens_cpu[:2].tolist() == [4092, 4092]
'''

_SEQ_LENS_STATES = {
    "optimistic_seq_lens_cpu": (
        "    runner.optimistic_seq_lens_cpu = seq_lens\n"
        "    runner.seq_lens = torch.zeros(MAX_ROWS, dtype=torch.int32)\n",
        "runner.optimistic_seq_lens_cpu.numpy()",
        "runner.seq_lens.numpy()",
    ),
    "seq_lens_cpu": (
        "    runner.seq_lens_cpu = seq_lens\n"
        "    runner.seq_lens = torch.zeros(MAX_ROWS, dtype=torch.int32)\n",
        "runner.seq_lens_cpu.numpy()",
        "runner.seq_lens.numpy()",
    ),
    "np": (
        "    runner.seq_lens = SimpleNamespace(\n"
        "        np=seq_lens.numpy(), gpu=torch.zeros(MAX_ROWS, dtype=torch.int32)\n"
        "    )\n"
        "    runner.seq_lens.copy_to_gpu = lambda *args: runner.seq_lens.gpu.copy_(\n"
        "        torch.from_numpy(runner.seq_lens.np)\n"
        "    )\n",
        "runner.seq_lens.np",
        "runner.seq_lens.gpu.numpy()",
    ),
}

_V1_DCP_HELPER = """

class _RecordingBlockTable:
    max_num_blocks_per_req = 4
    blocks_per_kv_block = 1

    def add_row(self, block_ids, row):
        pass

    def commit_block_table(self, num_reqs):
        pass


class _RecordingBlockTables:
    def __init__(self):
        self.block_tables = [_RecordingBlockTable()]
        self.slot_mapping_positions = []

    def commit_block_table(self, num_reqs):
        pass

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        self.slot_mapping_positions.append(positions.tolist())


def test_dcp_helper_consumes_the_staged_positions():
    from vllm.v1.worker.cp_utils import prepare_dcp_dummy_context_metadata

    dcp_context_len = 8
    scheduled = [4, 3]
    runner = _runner([4 + dcp_context_len] * 2)
    _stage(runner, scheduled)
    staged = runner.positions[:7].tolist()
    block_tables = _RecordingBlockTables()
    query_pos = SimpleNamespace(
        np=np.zeros(MAX_TOKENS, dtype=np.int64),
        gpu=torch.zeros(MAX_TOKENS, dtype=torch.int64),
        copy_to_gpu=lambda *args: None,
    )
    query_start_loc = SimpleNamespace(gpu=torch.tensor([0, 4, 7]))

    prepare_dcp_dummy_context_metadata(
        input_batch=SimpleNamespace(block_table=block_tables),
        kv_cache_config=SimpleNamespace(num_blocks=16),
        query_pos=query_pos,
        positions=runner.positions,
        query_start_loc=query_start_loc,
        num_reqs=2,
        num_tokens_unpadded=7,
        dcp_dummy_context_len=dcp_context_len,
    )

    assert runner.positions[:7].tolist() == staged
    assert staged[4:] == [9, 10, 11]
    assert block_tables.slot_mapping_positions == [staged]
"""


def v1_dummy_staging(dcp: bool, seq_lens_layout: str) -> str:
    state, cpu, device = _SEQ_LENS_STATES[seq_lens_layout]
    text = (
        _V1_DUMMY_STAGING.replace("@@SEQ_LENS_STATE@@\n", state)
        .replace("@@CPU_SEQ_LENS@@", cpu)
        .replace("@@DEVICE_SEQ_LENS@@", device)
    )
    return HEADER + text + (_V1_DCP_HELPER if dcp else "")


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
    runner = object.__new__(GPUModelRunner)
    runner.req_states = SimpleNamespace(
        num_computed_prefill_tokens=@@COMPUTED@@,
        prefill_len=@@PREFILL@@,
        index_to_req_id={row: req_id for req_id, (row, _, _) in requests.items()},
    )
    return runner


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
    return runner._get_uniform_decode_token_count(
        _scheduler_output(scheduled), dummy_run
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
