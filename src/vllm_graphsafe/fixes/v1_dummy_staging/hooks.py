# <!-- generated:facts:v1-dummy-staging -->
# v1-dummy-staging: V1 runner: consistent FULL dummy length and position metadata.
# What: In _dummy_run, where it builds attention metadata: a requested seq_len shorter
#   than the query is raised to it on both mirrors; computed lengths become seq_len -
#   scheduled and positions computed[req] + query_pos; padded rows and tokens are
#   cleared; the DCP helper consumes the staged positions. The input batch's CPU
#   computed counts are restored when the dummy run ends.
# Why: A long dummy seq_len beside stale positions makes kernels that count from
#   positions (MiniMax-M3's sparse indexer) disagree with kernels that count from
#   seq_lens; -1 sentinels land inside the consumed range.
# Binds to: _dummy_run and prepare_dcp_dummy_context_metadata (0.27+) or
#   _build_attention_metadata (0.22)
# Upstream: vllm-project/vllm#54604
# Delete when: the oldest vLLM you serve has no V1 model runner (0.34 removed it): no
#   release has upstream's fix, so it retires with the runner
# (made from the facts in this folder's __init__.py by
# `python -m vllm_graphsafe.catalogue --write`: edit those, not this)
# <!-- /generated:facts:v1-dummy-staging -->
"""V1 runner: FULL dummy runs stage lengths, computed counts and positions that
agree."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from vllm_graphsafe import counts
from vllm_graphsafe.fixes.v1_dummy_staging import FIX, STAGED_DUMMY
from vllm_graphsafe.fixes.v1_dummy_staging.judge import (
    BUILD_METADATA,
    BUILD_METADATA_PARAMETERS,
    DCP_HELPER,
    DCP_HELPER_PARAMETERS,
    DUMMY_RUN_ROLE,
)
from vllm_graphsafe.fixes.v1_dummy_staging.logic import stage_dummy_batch
from vllm_graphsafe.hook_points import HookPoint, OnFailure, ReplaceHook, WrapHook
from vllm_graphsafe.judging import Verdict

PATCH_ID = FIX.id

_BUFFERS = (
    "the runner's optimistic_seq_lens_cpu, seq_lens, "
    "input_batch.num_computed_tokens_cpu and positions"
)


class _StagedQueryPos:
    """``positions - context`` as the DCP helper's query positions: it writes
    ``query_pos + context`` back, exactly the staged positions."""

    def __init__(self, positions: Any, context_len: int, num_tokens: int) -> None:
        self.gpu = positions[:num_tokens] - context_len

    def copy_to_gpu(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def stage_runner_dummy_batch(
    runner: Any, num_reqs: int, num_tokens: int, query_start_loc: Any, positions: Any
) -> None:
    """Write the staged batch into the runner's buffers: all of it, or nothing."""
    import torch

    offsets = np.asarray(query_start_loc.np[: num_reqs + 1], dtype=np.int64)
    seq_lens_cpu = runner.optimistic_seq_lens_cpu
    seq_lens_device = runner.seq_lens
    computed = runner.input_batch.num_computed_tokens_cpu
    staged = stage_dummy_batch(
        requested_seq_lens=seq_lens_cpu[:num_reqs].numpy(),
        num_scheduled=np.diff(offsets),
        num_reqs_padded=seq_lens_cpu.shape[0],
        num_tokens_padded=num_tokens,
    )
    saved_cpu, saved_device = seq_lens_cpu.clone(), seq_lens_device.clone()
    saved_computed, saved_positions = computed.copy(), positions.clone()
    try:
        seq_lens_cpu.copy_(torch.from_numpy(staged.seq_lens))
        seq_lens_device.copy_(seq_lens_cpu, non_blocking=True)
        rows = min(len(computed), len(staged.num_computed))
        computed[:rows] = staged.num_computed[:rows]
        computed[rows:] = 0
        positions[:num_tokens].copy_(
            torch.from_numpy(staged.positions).to(positions.dtype), non_blocking=True
        )
        positions[num_tokens:].zero_()
    except BaseException:
        seq_lens_cpu.copy_(saved_cpu)
        seq_lens_device.copy_(saved_device)
        computed[:] = saved_computed
        positions.copy_(saved_positions)
        raise


class _DummyRun:
    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.restores: list[Callable[[], Any]] = []

    def keep_computed_counts(self) -> None:
        computed = self.runner.input_batch.num_computed_tokens_cpu
        self.restores.append(functools.partial(np.copyto, computed, computed.copy()))


_ACTIVE_DUMMY_RUN: contextvars.ContextVar[_DummyRun | None] = contextvars.ContextVar(
    "graphsafe_dummy_run", default=None
)


def consistent_dummy_run(
    wrapped: Any,
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    on_failure: OnFailure,
) -> Any:
    run = _DummyRun(instance)
    token = _ACTIVE_DUMMY_RUN.set(run)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _ACTIVE_DUMMY_RUN.reset(token)
        for restore in reversed(run.restores):
            try:
                restore()
            except Exception as error:
                on_failure(error, "GPUModelRunner.input_batch.num_computed_tokens_cpu")


def _signature_with(function: Callable[..., Any], needed: tuple[str, ...]) -> Any:
    signature = inspect.signature(function)
    lacking = [name for name in needed if name not in signature.parameters]
    if lacking:
        raise TypeError(
            f"{getattr(function, '__qualname__', function)} takes no "
            f"{', '.join(lacking)}"
        )
    return signature


def bind_staged_dcp_helper(helper: Any, on_failure: OnFailure) -> Callable[..., Any]:
    """The DCP helper, consuming positions staged consistently in a dummy run."""
    signature = _signature_with(helper, DCP_HELPER_PARAMETERS)

    @functools.wraps(helper)
    def staged_dcp_helper(*args: Any, **kwargs: Any) -> Any:
        original = staged_dcp_helper.__wrapped__
        run = _ACTIVE_DUMMY_RUN.get()
        if run is None:
            return original(*args, **kwargs)
        try:
            run.keep_computed_counts()
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            num_tokens = arguments["num_tokens_unpadded"]
            stage_runner_dummy_batch(
                run.runner,
                num_reqs=arguments["num_reqs"],
                num_tokens=num_tokens,
                query_start_loc=arguments["query_start_loc"],
                positions=arguments["positions"],
            )
            context_len = arguments["dcp_dummy_context_len"]
            if context_len:
                arguments["query_pos"] = _StagedQueryPos(
                    arguments["positions"], context_len, num_tokens
                )
            counts.STATS.count(PATCH_ID, STAGED_DUMMY)
            args, kwargs = bound.args, bound.kwargs
        except Exception as error:
            on_failure(error, f"the arguments of {DCP_HELPER} and {_BUFFERS}")
        return original(*args, **kwargs)

    return staged_dcp_helper


def bind_staged_metadata_build(build: Any, on_failure: OnFailure) -> Callable[..., Any]:
    """0.22: stage at the build of the attention metadata instead."""
    signature = _signature_with(build, ("self", *BUILD_METADATA_PARAMETERS))

    @functools.wraps(build)
    def staged_metadata_build(*args: Any, **kwargs: Any) -> Any:
        original = staged_metadata_build.__wrapped__
        run = _ACTIVE_DUMMY_RUN.get()
        if run is None or not args or args[0] is not run.runner:
            return original(*args, **kwargs)
        try:
            runner = run.runner
            run.keep_computed_counts()
            bound = signature.bind(*args, **kwargs)
            arguments = bound.arguments
            num_reqs_padded = arguments["num_reqs"]
            seq_lens = runner.optimistic_seq_lens_cpu[:num_reqs_padded].numpy()
            stage_runner_dummy_batch(
                runner,
                num_reqs=int(np.count_nonzero(seq_lens)),
                num_tokens=arguments["num_tokens"],
                query_start_loc=runner.query_start_loc,
                positions=runner.positions,
            )
            counts.STATS.count(PATCH_ID, STAGED_DUMMY)
        except Exception as error:
            on_failure(error, f"the arguments of {BUILD_METADATA} and {_BUFFERS}")
        return original(*args, **kwargs)

    return staged_metadata_build


def hook_points(verdict: Verdict) -> list[HookPoint]:
    staging = (
        bind_staged_dcp_helper
        if verdict.layout["stages_at_dcp_helper"]
        else bind_staged_metadata_build
    )
    return [
        WrapHook(point.module, point.qualname, consistent_dummy_run)
        if point.role == DUMMY_RUN_ROLE
        else ReplaceHook(point.module, point.qualname, staging)
        for point in verdict.points
    ]
