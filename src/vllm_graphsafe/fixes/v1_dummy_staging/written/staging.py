"""FULL dummy runs of the V1 runner stage seq_len == num_computed + num_scheduled
and position == num_computed[req] + query_pos, padding cleared
(vllm-project/vllm#54604)."""

from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

MAX_ROWS = 8
MAX_TOKENS = 32
STALE = 777
#: The host tensor beside the device tensor ``seq_lens``, or "np" for a buffer
#: ``seq_lens`` with both views (set by the backport).
SEQ_LENS_LAYOUT = "optimistic_seq_lens_cpu"


def _runner(
    requested_seq_lens: list[int], saved_computed: npt.NDArray[np.int32] | None = None
) -> GPUModelRunner:
    """A runner holding stale buffers and the requested dummy seq_lens."""
    runner = object.__new__(GPUModelRunner)
    computed = np.full(MAX_ROWS, STALE, dtype=np.int32)
    if saved_computed is not None:
        computed[: len(saved_computed)] = saved_computed
    seq_lens = torch.zeros(MAX_ROWS, dtype=torch.int32)
    seq_lens[: len(requested_seq_lens)] = torch.tensor(requested_seq_lens)
    if SEQ_LENS_LAYOUT == "np":
        runner.seq_lens = SimpleNamespace(
            np=seq_lens.numpy(), gpu=torch.zeros(MAX_ROWS, dtype=torch.int32)
        )
        runner.seq_lens.copy_to_gpu = lambda *args: runner.seq_lens.gpu.copy_(
            torch.from_numpy(runner.seq_lens.np)
        )
    else:
        setattr(runner, SEQ_LENS_LAYOUT, seq_lens)
        runner.seq_lens = torch.zeros(MAX_ROWS, dtype=torch.int32)
    runner.__dict__.update(
        positions=torch.full((MAX_TOKENS,), STALE, dtype=torch.int64),
        input_batch=SimpleNamespace(num_computed_tokens_cpu=computed),
    )
    return runner


def _cpu_seq_lens(runner: GPUModelRunner) -> Any:
    if SEQ_LENS_LAYOUT == "np":
        return runner.seq_lens.np
    return getattr(runner, SEQ_LENS_LAYOUT).numpy()


def _device_seq_lens(runner: GPUModelRunner) -> Any:
    if SEQ_LENS_LAYOUT == "np":
        return runner.seq_lens.gpu.numpy()
    return runner.seq_lens.numpy()


def _stage(runner: GPUModelRunner, scheduled: list[int]) -> Any:
    return runner._stage_dummy_request_metadata(np.array(scheduled, dtype=np.int32))


def _assert_request_invariants(runner: GPUModelRunner, scheduled: list[int]) -> None:
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
def test_profile_seq_len_with_four_scheduled_tokens(profile_seq_len: int) -> None:
    runner = _runner([profile_seq_len])

    _stage(runner, [4])

    _assert_request_invariants(runner, [4])
    expected_computed = max(profile_seq_len, 4) - 4
    assert runner.input_batch.num_computed_tokens_cpu[0] == expected_computed
    assert runner.positions[:4].tolist() == [expected_computed + i for i in range(4)]
    assert _cpu_seq_lens(runner)[0] == max(profile_seq_len, 4)


def test_padded_rows_and_tokens_are_cleared() -> None:
    scheduled = [3, 3, 2]
    runner = _runner([64, 64, 64, 64, 64])

    _stage(runner, scheduled)

    _assert_request_invariants(runner, scheduled)
    assert (runner.input_batch.num_computed_tokens_cpu[3:] == 0).all()
    assert (_cpu_seq_lens(runner)[3:] == 0).all()
    assert (runner.positions[8:] == 0).all()


def test_ragged_uniform_decode_batch_ends_at_the_causal_tail() -> None:
    runner = _runner([300, 300, 300])

    _stage(runner, [4, 4, 3])

    _assert_request_invariants(runner, [4, 4, 3])
    assert runner.positions[8:11].tolist() == [297, 298, 299]


def test_the_computed_counts_before_staging_are_returned_for_restoring() -> None:
    real = np.array([120, 7, 33], dtype=np.int32)
    runner = _runner([4096, 4096], saved_computed=real)

    saved = _stage(runner, [4, 4])

    assert saved[:3].tolist() == real.tolist()
    assert runner.input_batch.num_computed_tokens_cpu[:2].tolist() == [4092, 4092]
