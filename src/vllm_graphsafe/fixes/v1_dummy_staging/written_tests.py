"""CPU tests the backport writes into a tree's ``tests/`` for v1-dummy-staging.

They exercise the edited vLLM code directly (no GPU, no model, no plugin), pass
on the edited tree and fail on the pristine one. Their oracles are closed
forms of the batch they build, never the code under test.
"""

from __future__ import annotations

from vllm_graphsafe.backport.plan import WRITTEN_TEST_HEADER as HEADER

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
