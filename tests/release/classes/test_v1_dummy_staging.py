"""Dummy runs that build attention metadata stage lengths and positions that agree.

Observed where vLLM builds the attention metadata of the real ``_dummy_run``.
On a vLLM without the fix (``VLLM_GRAPHSAFE_DISABLE=all``) positions and
computed lengths keep the previous step's values and these tests fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.release import v1_runner
from tests.support.vllm_fakes.v1_dummy import (
    STALE_POSITION,
    Snapshot,
    make_dummy_runner,
    run_dummy,
)
from vllm_graphsafe import vllm_layout

if not v1_runner.installed():
    pytest.skip(v1_runner.ABSENT, allow_module_level=True)

regression = pytest.mark.regression("v1-dummy-staging")


def release_stages_dcp_dummy_context() -> bool:
    cp_utils = vllm_layout.load(vllm_layout.V1_CP_UTILS)

    return hasattr(cp_utils, "prepare_dcp_dummy_context_metadata")


needs_dcp_dummy_context = pytest.mark.skipif(
    not release_stages_dcp_dummy_context(),
    reason="this vLLM release has no DCP dummy-context staging (added in 0.27)",
)


def active_counts(snapshot: Snapshot, num_reqs: int) -> np.ndarray:
    return np.diff(snapshot.query_start_loc[: num_reqs + 1])


def assert_request_invariants(snapshot: Snapshot, num_reqs: int) -> None:
    scheduled = active_counts(snapshot, num_reqs)
    seq_lens = snapshot.seq_lens_cpu[:num_reqs].astype(np.int64)
    computed = snapshot.num_computed[:num_reqs].astype(np.int64)
    assert (seq_lens == computed + scheduled).all(), (seq_lens, computed, scheduled)
    assert (computed >= 0).all()
    req_of_token = np.repeat(np.arange(num_reqs), scheduled)
    query_pos = np.concatenate([np.arange(n) for n in scheduled])
    num_tokens = int(scheduled.sum())
    assert (snapshot.positions[:num_tokens] == computed[req_of_token] + query_pos).all()


def assert_mirrors_agree(snapshot: Snapshot) -> None:
    assert (snapshot.seq_lens_cpu == snapshot.seq_lens_device).all()


@regression
@pytest.mark.parametrize("profile_len", [1, 4, 4096])
def test_profile_length_with_four_scheduled_tokens(
    profile_len: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=1)
    run_dummy(runner, 4, force_attention=True, profile_seq_lens=profile_len)

    (snapshot,) = record.snapshots
    assert_request_invariants(snapshot, 1)
    assert_mirrors_agree(snapshot)
    expected_computed = max(profile_len, 4) - 4
    assert snapshot.num_computed[0] == expected_computed
    assert snapshot.positions[:4].tolist() == [expected_computed + i for i in range(4)]


@regression
def test_long_profile_length_ends_the_query_at_the_causal_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=1)
    run_dummy(runner, 4, force_attention=True, profile_seq_lens=4096)
    (snapshot,) = record.snapshots
    assert snapshot.seq_lens_cpu[0] == 4096
    assert snapshot.num_computed[0] == 4092
    assert snapshot.positions[:4].tolist() == [4092, 4093, 4094, 4095]


@regression
def test_short_override_never_yields_negative_lengths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=1)
    run_dummy(runner, 4, force_attention=True, profile_seq_lens=1)
    (snapshot,) = record.snapshots
    assert snapshot.num_computed[0] == 0
    assert (snapshot.positions[:4] >= 0).all()
    assert snapshot.seq_lens_cpu[0] == snapshot.seq_lens_device[0] == 4


@regression
@pytest.mark.parametrize("num_tokens", [3, 8, 13])
def test_padded_rows_and_tokens_are_cleared(
    num_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    num_reqs = min(num_tokens, 4)
    runner, record = make_dummy_runner(
        monkeypatch,
        max_num_seqs=4,
        pad_reqs_to=num_reqs + 2,
        pad_tokens_to=num_tokens + 5,
    )
    run_dummy(runner, num_tokens, force_attention=True, profile_seq_lens=64)

    (snapshot,) = record.snapshots
    assert_request_invariants(snapshot, num_reqs)
    assert_mirrors_agree(snapshot)
    padded_rows = slice(num_reqs, snapshot.num_reqs_padded)
    assert (snapshot.num_computed[padded_rows] == 0).all()
    assert (snapshot.seq_lens_cpu[padded_rows] == 0).all()
    assert (snapshot.positions[num_tokens : num_tokens + 5] == 0).all()


@regression
def test_full_capture_of_a_uniform_decode_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=8, decode_query_len=4)
    run_dummy(runner, 11, uniform_decode=True, profile_seq_lens=300)
    (snapshot,) = record.snapshots
    assert_request_invariants(snapshot, 3)
    assert snapshot.positions[8:11].tolist() == [297, 298, 299]


@regression
@needs_dcp_dummy_context
def test_mixed_dcp_batch_keeps_the_dummy_context_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=2, dcp_world_size=2)
    context_len = 2 * 4
    run_dummy(runner, 7, create_mixed_batch=True, force_attention=True)

    (snapshot,) = record.snapshots
    assert active_counts(snapshot, 2).tolist() == [1, 6]
    assert_request_invariants(snapshot, 2)
    assert snapshot.num_computed[:2].tolist() == [context_len, context_len]
    (query_start_loc, positions) = record.slot_mapping_calls[-1]
    assert query_start_loc.tolist() == [0, 1, 7]
    # Both requests over the dummy context: computed == context_len.
    expected = [context_len] + [context_len + i for i in range(6)]
    assert positions.tolist() == expected
    assert snapshot.positions[:7].tolist() == expected


@regression
@needs_dcp_dummy_context
def test_ragged_uniform_decode_dcp_batch_moves_the_tail_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = make_dummy_runner(
        monkeypatch, max_num_seqs=4, decode_query_len=4, dcp_world_size=2
    )
    run_dummy(runner, 7, uniform_decode=True, is_graph_capturing=True)

    (snapshot,) = record.snapshots
    assert active_counts(snapshot, 2).tolist() == [4, 3]
    assert_request_invariants(snapshot, 2)
    # Every sequence is the dummy context (dcp_world_size *
    # cp_kv_cache_interleave_size tokens) plus one full decode query; each
    # request's query ends at that sequence's causal tail.
    seq_len = 2 * 4 + 4
    expected = [seq_len - 4 + i for i in range(4)] + [seq_len - 3 + i for i in range(3)]
    (query_start_loc, positions) = record.slot_mapping_calls[-1]
    assert query_start_loc.tolist() == [0, 4, 7]
    assert positions.tolist() == expected
    assert snapshot.positions[:7].tolist() == expected
    assert snapshot.seq_lens_cpu[:2].tolist() == [seq_len, seq_len]


def test_dummy_run_without_attention_metadata_is_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=2)
    runner._determine_batch_execution_and_padding = _piecewise_determine(runner)
    before = runner.positions.clone()
    run_dummy(runner, 4)
    assert record.snapshots == []
    assert (runner.positions == before).all()
    assert (runner.positions == STALE_POSITION).all()


def test_real_request_computed_counts_survive_a_dummy_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = np.array([120, 7, 33], dtype=np.int32)
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=4, real_computed=real)
    before = runner.input_batch.num_computed_tokens_cpu.copy()
    run_dummy(runner, 8, force_attention=True, profile_seq_lens=4096)
    assert record.snapshots
    assert (runner.input_batch.num_computed_tokens_cpu == before).all()


def _piecewise_determine(runner: object) -> object:
    CUDAGraphMode = vllm_layout.load(vllm_layout.CONFIG).CUDAGraphMode
    BatchDescriptor = vllm_layout.load(vllm_layout.FORWARD_CONTEXT).BatchDescriptor

    def determine(**kwargs: Any) -> object:
        descriptor = BatchDescriptor(num_tokens=kwargs["num_tokens"])
        return CUDAGraphMode.NONE, descriptor, False, None, None

    return determine


# -- failing open --------------------------------------------------------------------

PATCH_ID = "v1-dummy-staging"


@pytest.fixture
def applied_patch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session's patch, applied; re-applied after a test made it fail."""
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    patch = registry().get(PATCH_ID)
    if patch.state is not PatchState.APPLIED:
        pytest.skip(f"{PATCH_ID} is {patch.state} here (plugin switched off)")
    yield patch
    monkeypatch.undo()  # vLLM's own methods back before the hooks bind again
    patch._failed_at_run_time = False
    registry().apply_all()
    assert patch.state is PatchState.APPLIED, patch.reason


def dummy_snapshot(
    monkeypatch: pytest.MonkeyPatch, drift: Callable[[Any], None] | None = None
) -> Snapshot:
    """One FULL profile dummy run's staged buffers; the same random start each time."""
    import torch

    torch.manual_seed(0)
    runner, record = make_dummy_runner(
        monkeypatch, max_num_seqs=4, pad_reqs_to=4, pad_tokens_to=12
    )
    if drift is not None:
        drift(runner)
    run_dummy(runner, 8, force_attention=True, profile_seq_lens=64)
    (snapshot,) = record.snapshots
    return snapshot


def unpatched_snapshot(monkeypatch: pytest.MonkeyPatch, patch: Any) -> Snapshot:
    from vllm_graphsafe.plugin import registry

    patch.remove()
    try:
        return dummy_snapshot(monkeypatch)
    finally:
        monkeypatch.undo()  # vLLM's own methods back before the hooks bind again
        registry().apply_all()


def without_computed_counts(runner: Any) -> None:
    runner.input_batch = SimpleNamespace(block_table=runner.input_batch.block_table)


def read_only_computed_counts(runner: Any) -> None:
    # Staging writes seq_lens on both mirrors first, then fails on this one.
    runner.input_batch.num_computed_tokens_cpu.flags.writeable = False


@pytest.mark.parametrize(
    "drift",
    [without_computed_counts, read_only_computed_counts],
    ids=["computed-counts-missing", "staging-fails-half-way"],
)
def test_a_dummy_run_the_staging_cannot_read_gets_vllm_own_metadata(
    drift: Callable[[Any], None],
    applied_patch: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm_graphsafe.judging import PatchState

    vllm_own = unpatched_snapshot(monkeypatch, applied_patch)

    with caplog.at_level("WARNING", logger="vllm.graphsafe"):
        drifted = dummy_snapshot(monkeypatch, drift)

    assert applied_patch.state is PatchState.FAILED
    assert "num_computed_tokens_cpu" in applied_patch.reason
    ours = [r.getMessage() for r in caplog.records if r.name == "vllm.graphsafe"]
    assert len(ours) == 1 and PATCH_ID in ours[0]
    assert (drifted.seq_lens_cpu == vllm_own.seq_lens_cpu).all()
    assert (drifted.seq_lens_device == vllm_own.seq_lens_device).all()
    assert (drifted.positions == vllm_own.positions).all()
    # The rest of the process's dummy runs go straight to vLLM's code.
    assert dummy_snapshot(monkeypatch).positions.tolist() == vllm_own.positions.tolist()


def test_a_helper_without_a_parameter_the_staging_reads_is_not_bound() -> None:
    from vllm_graphsafe.fixes.v1_dummy_staging.hooks import bind_staged_dcp_helper

    def renamed(
        *,
        input_batch: Any,
        kv_cache_config: Any,
        query_pos: Any,
        token_positions: Any,
        query_start_loc: Any,
        num_reqs: int,
        num_tokens_unpadded: int,
        dcp_dummy_context_len: int,
    ) -> None:
        return None

    with pytest.raises(TypeError, match="positions"):
        bind_staged_dcp_helper(renamed, lambda error, reading: None)


@needs_dcp_dummy_context
@regression
def test_a_positional_call_of_the_dcp_helper_is_staged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release whose helper vLLM calls positionally still gets staged positions."""
    cp_utils = vllm_layout.load(vllm_layout.V1_CP_UTILS)
    runner_module = vllm_layout.load(vllm_layout.V1_RUNNER)

    from vllm_graphsafe.fixes.v1_dummy_staging.hooks import bind_staged_dcp_helper

    order = (
        "input_batch",
        "kv_cache_config",
        "query_pos",
        "positions",
        "query_start_loc",
        "num_reqs",
        "num_tokens_unpadded",
        "dcp_dummy_context_len",
    )
    vllm_helper = cp_utils.prepare_dcp_dummy_context_metadata

    def positional_helper(
        input_batch: Any,
        kv_cache_config: Any,
        query_pos: Any,
        positions: Any,
        query_start_loc: Any,
        num_reqs: int,
        num_tokens_unpadded: int,
        dcp_dummy_context_len: int,
    ) -> Any:
        arguments = locals()
        return vllm_helper(**{name: arguments[name] for name in order})

    def no_failure(error: BaseException, reading: str) -> None:
        raise AssertionError(f"{error} while reading {reading}")

    staged = bind_staged_dcp_helper(positional_helper, no_failure)

    def call_positionally(**kwargs: Any) -> Any:
        return staged(*(kwargs[name] for name in order))

    monkeypatch.setattr(
        runner_module, "prepare_dcp_dummy_context_metadata", call_positionally
    )
    runner, record = make_dummy_runner(monkeypatch, max_num_seqs=2, dcp_world_size=2)
    run_dummy(runner, 7, create_mixed_batch=True, force_attention=True)

    (snapshot,) = record.snapshots
    assert_request_invariants(snapshot, 2)
    assert snapshot.positions[:7].tolist() == [8, 8, 9, 10, 11, 12, 13]
