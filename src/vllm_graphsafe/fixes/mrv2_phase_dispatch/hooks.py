# <!-- generated:facts:mrv2-phase-dispatch -->
# mrv2-phase-dispatch: Model Runner V2: phase-aware target and draft-prefill dispatch.
# What: On a real step with a uniform shape, the uniform token count that execute_model
#   hands to dispatch_cg_and_sync_dp (which picks the CUDA graph and agrees it across DP
#   ranks) is withdrawn while a scheduled request is still in prefill, read from the
#   request states the step has just updated. Eagle/MTP draft prefill gets the same rule
#   from the target batch's pre-step phase; draft decode steps, fixed-width speculators
#   (DFlash), dummy and capture runs and genuine decode keep their count.
# Why: With K speculative tokens a prompt chunk of exactly K+1 tokens has the shape of a
#   uniform speculative-decode batch; replaying the FULL decode graph over prefill
#   metadata corrupts stateful hybrid (GDN/Mamba) models, and a decode sharing the batch
#   too.
# Binds to: get_uniform_token_count where execute_model and the speculators call it (and
#   those callers, to know the step); where the input batch has no is_prefilling_np
#   (0.20), also RequestState.any_prefills, to remember its pre-step answer
# Upstream: vllm-project/vllm#51865, vllm-project/vllm#50532, vllm-project/vllm#49918
# Delete when: the oldest supported vLLM has vllm-project/vllm#51865 (released in 0.28):
#   MRV2 classifies by request phase
# (made from the facts in this folder's __init__.py by
# `python -m vllm_graphsafe.catalogue --write`: edit those, not this)
# <!-- /generated:facts:mrv2-phase-dispatch -->
"""MRV2: a uniform batch is decode only when no scheduled request is in prefill.

``get_uniform_token_count`` is replaced in each caller's namespace (other callers
keep the shape rule); the callers publish their step in a context variable."""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from vllm_graphsafe import counts
from vllm_graphsafe.fixes.mrv2_phase_dispatch import DRAFT_EVENT_PREFIX, FIX
from vllm_graphsafe.fixes.mrv2_phase_dispatch.judge import (
    DRAFT_COUNT_ROLE,
    DRAFT_STEP_ROLE,
    PRE_STEP_QUESTION,
    PRE_STEP_ROLE,
    SHAPE_RULE,
    TARGET_COUNT_ROLE,
    TARGET_STEP_ROLE,
)
from vllm_graphsafe.fixes.phase_events import PHASE_RULE_EVENTS
from vllm_graphsafe.fixes.phase_rows import PrefillColumns
from vllm_graphsafe.forwarding import publishing_method
from vllm_graphsafe.hook_points import HookPoint, OnFailure, ReplaceHook
from vllm_graphsafe.judging import Verdict

PATCH_ID = FIX.id

#: What the replaced execute_model / propose publish: (runner, scheduler_output,
#: dummy_run) or (speculator, input_batch, dummy_run).
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


def _step_publisher(
    step_var: contextvars.ContextVar[Step | None], argument: str
) -> Callable[[Any, OnFailure], Callable[..., Any]]:
    def bind(method: Callable[..., Any], on_failure: OnFailure) -> Callable[..., Any]:
        receiver = next(iter(inspect.signature(method).parameters), None)
        published = publishing_method(
            method,
            (str(receiver), argument, "dummy_run"),
            step_var.set,
            step_var.reset,
            on_failure,
        )
        if published is None:
            raise TypeError(
                f"{getattr(method, '__qualname__', method)} does not take named "
                f"({receiver}, {argument}, dummy_run) parameters only"
            )
        return published

    return bind


bind_target_step = _step_publisher(_TARGET_STEP, "scheduler_output")
bind_draft_step = _step_publisher(_DRAFT_STEP, "input_batch")


def _host(values: Any) -> np.ndarray:
    """A request-state column's CPU numpy view (a UVA buffer keeps it in .np)."""
    return values.np if hasattr(values, "np") else np.asarray(values)


InPrefill = Callable[[Any, Any], bool]
_any = np.any


def target_phase_reader() -> InPrefill:
    """Whether a request the runner schedules this step is still in prefill:
    its row (``req_id_to_index``) in the two phase columns, the only request
    state upstream's fix and forks' tests build."""
    # (computed column, prefill_len column, their PrefillColumns or None),
    # replaced whole; made again when the runner holds other column objects.
    kept: list[tuple[Any, Any, PrefillColumns | None]] = [(None, None, None)]

    def scheduled_request_in_prefill(runner: Any, scheduler_output: Any) -> bool:
        req_states = runner.req_states
        row_of = req_states.req_id_to_index
        computed = req_states.num_computed_prefill_tokens
        prefill_len = req_states.prefill_len
        scheduled = scheduler_output.num_scheduled_tokens
        kept_computed, kept_prefill_len, columns = kept[0]
        if kept_computed is not computed or kept_prefill_len is not prefill_len:
            columns = _prefill_columns(computed, prefill_len)
            kept[0] = (computed, prefill_len, columns)
        if columns is not None:
            return columns.scheduled_in_prefill(row_of, scheduled)
        # A scheduled request without a state row is an error (fails open).
        rows = np.fromiter(
            map(row_of.__getitem__, scheduled), dtype=np.intp, count=len(scheduled)
        )
        return bool(_any(_host(computed)[rows] < _host(prefill_len)[rows]))

    return scheduled_request_in_prefill


def _prefill_columns(computed: Any, prefill_len: Any) -> PrefillColumns | None:
    """Over the columns' own host arrays (a UVA buffer's ``.np``), the same
    objects on every step; None where they are not 1-D numpy arrays of one
    length (each read may copy): read them through ``_host`` on each step."""
    host_computed = getattr(computed, "np", computed)
    host_prefill_len = getattr(prefill_len, "np", prefill_len)
    if (
        not isinstance(host_computed, np.ndarray)
        or not isinstance(host_prefill_len, np.ndarray)
        or host_computed.ndim != 1
        or host_computed.shape != host_prefill_len.shape
    ):
        return None
    return PrefillColumns(host_computed, host_prefill_len)


def input_batch_in_prefill(speculator: Any, input_batch: Any) -> bool:
    """Whether a row of the target's input batch was in prefill before this
    step (``is_prefilling_np``: 0.22 through 0.27)."""
    return bool(_any(input_batch.is_prefilling_np[: input_batch.num_reqs]))


class PreStepAnswers:
    """What ``RequestState.any_prefills`` answered, by the batch it was asked
    about. The last answers are kept, holding their arrays so that their
    identity cannot be reused; a batch not among them fails open, never a guess.
    """

    def __init__(self) -> None:
        self._answers: collections.deque[tuple[Any, bool]] = collections.deque(maxlen=4)
        self._lock = threading.Lock()

    def remember(self, idx_mapping_np: Any, answer: Any) -> None:
        with self._lock:
            self._answers.append((idx_mapping_np, bool(answer)))

    def answer_for(self, idx_mapping_np: Any) -> bool:
        with self._lock:
            for asked, answer in reversed(self._answers):
                if asked is idx_mapping_np:
                    return bool(answer)
        raise LookupError(
            f"{PRE_STEP_QUESTION} was not asked about this batch before its step"
        )


PRE_STEP_ANSWERS = PreStepAnswers()
_PRE_STEP_PARAMETERS = ("self", "idx_mapping_np")


def bind_pre_step_answers(
    any_prefills: Callable[[Any, Any], Any], on_failure: OnFailure
) -> Callable[[Any, Any], Any]:
    parameters = tuple(inspect.signature(any_prefills).parameters)
    if parameters != _PRE_STEP_PARAMETERS:
        raise TypeError(
            f"{PRE_STEP_QUESTION} takes {parameters}, not the "
            f"{_PRE_STEP_PARAMETERS} this patch binds to"
        )
    remember = PRE_STEP_ANSWERS.remember

    @functools.wraps(any_prefills)
    def remembering_any_prefills(self: Any, idx_mapping_np: Any) -> Any:
        answer = any_prefills(self, idx_mapping_np)
        try:
            remember(idx_mapping_np, answer)
        except Exception as error:
            on_failure(error, f"{PRE_STEP_QUESTION}'s answer")
        return answer

    return remembering_any_prefills


def pre_step_phase_reader() -> InPrefill:
    """What ``any_prefills`` answered for this batch before the forward (0.20)."""
    answer_for = PRE_STEP_ANSWERS.answer_for

    def batch_was_in_prefill(speculator: Any, input_batch: Any) -> bool:
        return answer_for(input_batch.idx_mapping_np)

    return batch_was_in_prefill


def _phase_aware_count(
    step_var: contextvars.ContextVar[Step | None],
    phase_reader: Callable[[], InPrefill],
    event_prefix: str,
    reading: str,
) -> Callable[[Any, OnFailure], ShapeCount]:
    """``get_uniform_token_count`` made phase-aware: vLLM's cheap shape count
    decides first; a uniform count is withdrawn while the step is in prefill."""
    uniform_decode, kept_off, dummy, non_uniform = (
        event_prefix + event for event in PHASE_RULE_EVENTS
    )

    def bind(shape_count: ShapeCount, on_failure: OnFailure) -> ShapeCount:
        parameters = tuple(inspect.signature(shape_count).parameters)
        if parameters != _SHAPE_COUNT_PARAMETERS:
            raise TypeError(
                f"{SHAPE_RULE} takes {parameters}, not the "
                f"{_SHAPE_COUNT_PARAMETERS} this patch binds to"
            )
        count = counts.STATS.counter(PATCH_ID)
        in_prefill = phase_reader()
        published_step = step_var.get

        @functools.wraps(shape_count)
        def phase_aware_count(
            num_reqs: int, num_tokens: int, max_query_len: int
        ) -> int | None:
            uniform = shape_count(num_reqs, num_tokens, max_query_len)
            try:
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
            except Exception as error:
                on_failure(error, reading)
                return uniform

        return phase_aware_count

    return bind


bind_target_count = _phase_aware_count(
    _TARGET_STEP,
    target_phase_reader,
    "",
    "GPUModelRunner.req_states (req_id_to_index, num_computed_prefill_tokens, "
    "prefill_len) and scheduler_output.num_scheduled_tokens",
)
bind_draft_count = _phase_aware_count(
    _DRAFT_STEP,
    lambda: input_batch_in_prefill,
    DRAFT_EVENT_PREFIX,
    "input_batch (num_reqs, is_prefilling_np)",
)
bind_draft_count_pre_step = _phase_aware_count(
    _DRAFT_STEP,
    pre_step_phase_reader,
    DRAFT_EVENT_PREFIX,
    f"input_batch.idx_mapping_np and {PRE_STEP_QUESTION}'s pre-step answer for it",
)


def hook_points(verdict: Verdict) -> list[HookPoint]:
    draft_count = (
        bind_draft_count_pre_step
        if verdict.layout["pre_step_answers"]
        else bind_draft_count
    )
    factories = {
        TARGET_STEP_ROLE: bind_target_step,
        TARGET_COUNT_ROLE: bind_target_count,
        PRE_STEP_ROLE: bind_pre_step_answers,
        DRAFT_STEP_ROLE: bind_draft_step,
        DRAFT_COUNT_ROLE: draft_count,
    }
    return [
        ReplaceHook(point.module, point.qualname, factories[point.role])
        for point in verdict.points
    ]
