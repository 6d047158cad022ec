"""MRV2: a uniform batch is decode only when no scheduled request is in prefill.

The fix's facts (what, why, upstream, removal) are in this folder's
``__init__``; ``vllm-graphsafe doctor --catalogue`` renders them.

Why it binds there: ``get_uniform_token_count`` is replaced in each calling
module's namespace, never in ``cudagraph_utils``, so other callers keep the shape
rule; the callers themselves are replaced only to publish their step (runner and
scheduler output, or speculator and input batch, plus ``dummy_run``) in a context
variable that the count reads.

Where the target's input batch carries no phase column (0.20: no
``InputBatch.is_prefilling_np``), the draft prefill, which runs after the step
has advanced the request states, takes the answer vLLM itself computed for the
same batch before the forward: ``RequestState.any_prefills`` is replaced to
remember its answer per ``idx_mapping_np`` (the array ``prepare_inputs`` also
stores in the batch), and the draft count looks that answer up by identity.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from vllm_graphsafe import counts, recognition
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.fixes.mrv2_phase_dispatch import DRAFT_EVENT_PREFIX, FIX
from vllm_graphsafe.fixes.phase_events import (
    DUMMY,
    KEPT_OFF_DECODE,
    NON_UNIFORM,
    UNIFORM_DECODE,
)
from vllm_graphsafe.fixes.phase_rows import PrefillColumns
from vllm_graphsafe.forwarding import publishing_method
from vllm_graphsafe.registry import (
    HookPoint,
    OnFailure,
    Patch,
    ReplaceHook,
    Requirement,
    SetsAttribute,
    SourceReader,
    TakesParameters,
    unhooked,
)
from vllm_graphsafe.vllm_layout import (
    MRV2_AUTOREGRESSIVE_SPECULATOR,
    MRV2_EAGLE_SPECULATOR,
    MRV2_INPUT_BATCH,
    MRV2_MULTI_MODULE_MTP_SPECULATOR,
    MRV2_RUNNER,
    MRV2_RUNNER_CLASS,
    MRV2_SPECULATORS,
    MRV2_STATES,
)

PATCH_ID = FIX.id
RUNNER_MODULE = MRV2_RUNNER
RUNNER_STEP = "GPUModelRunner.execute_model"
#: The shape rule, wrapped by name in each module that calls it.
SHAPE_RULE = "get_uniform_token_count"
#: Calls in ``execute_model`` that mean the release classifies by phase itself.
_NATIVE_MARKERS = (
    "gather_batch_req_state",
    "get_uniform_decode_token_count",
    "_get_uniform_decode_token_count",
)


class DraftPrefillDispatcher(NamedTuple):
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
        MRV2_EAGLE_SPECULATOR,
        "EagleSpeculator.propose",
        "eagle/ (releases before the autoregressive/ split)",
        only_without=MRV2_AUTOREGRESSIVE_SPECULATOR,
    ),
    # 0.24-0.27: Eagle, MTP and Gemma4 MTP subclass this one.
    DraftPrefillDispatcher(
        MRV2_AUTOREGRESSIVE_SPECULATOR,
        "AutoRegressiveSpeculator.propose",
        "autoregressive/ (0.24-0.27)",
    ),
    DraftPrefillDispatcher(
        MRV2_MULTI_MODULE_MTP_SPECULATOR,
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

STATES_MODULE = MRV2_STATES
INPUT_BATCH_MODULE = MRV2_INPUT_BATCH
#: The batch's own pre-step phase column (0.22-0.27).
BATCH_PHASE_COLUMN = "is_prefilling_np"
#: vLLM's pre-step phase question, asked in ``prepare_inputs`` (0.20).
PRE_STEP_QUESTION = "RequestState.any_prefills"
PREPARE_INPUTS = "GPUModelRunner.prepare_inputs"

_TARGET_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "graphsafe_mrv2_target_step", default=None
)
_DRAFT_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "graphsafe_mrv2_draft_step", default=None
)


def _step_publisher(
    step_var: contextvars.ContextVar[Step | None], argument: str
) -> Callable[[Any, OnFailure], Callable[..., Any]]:
    """Factory of a :class:`ReplaceHook`: the method, publishing its step.

    The replacement declares the method's own parameters
    (:func:`~vllm_graphsafe.forwarding.publishing_method`); a method whose
    parameters are not all named is not supported (``TypeError``: the patch
    binds as ``failed``).
    """

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


#: ``GPUModelRunner.execute_model``, publishing its step.
bind_target_step = _step_publisher(_TARGET_STEP, "scheduler_output")
#: A speculator's ``propose``, publishing its step.
bind_draft_step = _step_publisher(_DRAFT_STEP, "input_batch")


# -- is a scheduled request still in prefill? ----------------------------------


def _host(values: Any) -> np.ndarray:
    """The CPU numpy view of a request-state column (a UVA buffer keeps it in .np)."""
    return values.np if hasattr(values, "np") else np.asarray(values)


def _kept_host(values: Any) -> np.ndarray | None:
    """The column's own host array, the same object on every step (a numpy
    column, or a UVA buffer's ``.np``); None where each read may copy."""
    if isinstance(values, np.ndarray):
        return values
    host = getattr(values, "np", None)
    return host if isinstance(host, np.ndarray) else None


InPrefill = Callable[[Any, Any], bool]
_any = np.any


def target_phase_reader() -> InPrefill:
    """Whether a request the runner schedules this step is still in prefill.

    Each scheduled request's row is found by its id (``req_id_to_index``) and
    its two phase columns compared there: the request state upstream's fix
    and forks' tests build, and nothing else of it, is read. The ids are
    looked up only where some row of the table is in prefill
    (:class:`PrefillColumns`); the columns' host arrays are taken once, and
    again when the runner holds other column objects.
    """
    # (computed column, prefill_len column, PrefillColumns over their host
    # arrays or None), replaced whole.
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
        rows = _rows_of(row_of, scheduled)
        return bool(_any(_host(computed)[rows] < _host(prefill_len)[rows]))

    return scheduled_request_in_prefill


def _prefill_columns(computed: Any, prefill_len: Any) -> PrefillColumns | None:
    """The two columns' kept host arrays, where both are one-dimensional
    arrays of one length; None: read them through ``_host`` on each step."""
    host_computed, host_prefill_len = _kept_host(computed), _kept_host(prefill_len)
    if (
        host_computed is None
        or host_prefill_len is None
        or host_computed.ndim != 1
        or host_computed.shape != host_prefill_len.shape
    ):
        return None
    return PrefillColumns(host_computed, host_prefill_len)


def _rows_of(req_id_to_index: Any, req_ids: Any) -> np.ndarray:
    """The state rows of ``req_ids``; a request without one is an error."""
    return np.fromiter(
        map(req_id_to_index.__getitem__, req_ids), dtype=np.intp, count=len(req_ids)
    )


def draft_phase_reader() -> InPrefill:
    """Whether a row of the target's input batch was in prefill before this step.

    Reads the first ``num_reqs`` rows of ``is_prefilling_np``, the batch's
    pre-step ``computed prefill < prefill_len`` per row, which the target's
    input batch carries from 0.22 through 0.27 (0.20's does not: see
    :func:`pre_step_phase_reader`).
    """

    def input_batch_in_prefill(speculator: Any, input_batch: Any) -> bool:
        return bool(_any(input_batch.is_prefilling_np[: input_batch.num_reqs]))

    return input_batch_in_prefill


# -- the pre-step answer, where the batch carries no phase column (0.20) --------


class PreStepAnswers:
    """What ``RequestState.any_prefills`` answered, by the batch it was asked about.

    ``prepare_inputs`` asks about the step's ``idx_mapping_np`` before the
    forward and stores that same array in the input batch, so the answer is
    found again by identity once ``postprocess`` has advanced the request
    states. The last ``depth`` answers are kept (holding their arrays, whose
    identity cannot then be reused); a batch not among them is an error that
    fails the patch open, never a guess.
    """

    def __init__(self, depth: int = 4) -> None:
        self._answers: collections.deque[tuple[Any, bool]] = collections.deque(
            maxlen=depth
        )
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
    """Factory of a :class:`ReplaceHook`: ``any_prefills``, remembering its answer."""
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
    """Whether a row of the target's input batch was in prefill before this step.

    The answer ``any_prefills`` gave in ``prepare_inputs`` for this batch's
    ``idx_mapping_np``, before the forward (0.20).
    """
    answer_for = PRE_STEP_ANSWERS.answer_for

    def batch_was_in_prefill(speculator: Any, input_batch: Any) -> bool:
        return answer_for(input_batch.idx_mapping_np)

    return batch_was_in_prefill


def batch_lacks_phase_column(sources: SourceReader) -> bool:
    """The 0.20 layout: no phase column in the input batch, but vLLM's own
    pre-step question in ``prepare_inputs``. Any other layout is read as one
    whose batch carries the column (and fails naming it when it does not)."""
    if sources.sets_attribute(INPUT_BATCH_MODULE, "InputBatch", BATCH_PHASE_COLUMN):
        return False
    return sources.calls(RUNNER_MODULE, PREPARE_INPUTS, PRE_STEP_QUESTION.split(".")[1])


# -- the phase-aware count ----------------------------------------------------


def _phase_aware_count(
    step_var: contextvars.ContextVar[Step | None],
    phase_reader: Callable[[], InPrefill],
    event_prefix: str,
    reading: str,
) -> Callable[[Any, OnFailure], ShapeCount]:
    """Factory of a :class:`ReplaceHook`: ``get_uniform_token_count`` made phase-aware.

    vLLM's shape count decides first (it is cheap); a uniform count is then
    withdrawn while the published step holds a request in prefill, as
    ``phase_reader()`` reads it.
    """
    dummy, non_uniform, kept_off, uniform_decode = (
        event_prefix + event
        for event in (DUMMY, NON_UNIFORM, KEPT_OFF_DECODE, UNIFORM_DECODE)
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


#: The runner's count: a scheduled request's state says whether it is in prefill.
bind_target_count = _phase_aware_count(
    _TARGET_STEP,
    target_phase_reader,
    "",
    "GPUModelRunner.req_states (req_id_to_index, num_computed_prefill_tokens, "
    "prefill_len) and scheduler_output.num_scheduled_tokens",
)
#: A speculator's draft-prefill count: the target's pre-step phase arrays say it.
bind_draft_count = _phase_aware_count(
    _DRAFT_STEP,
    draft_phase_reader,
    DRAFT_EVENT_PREFIX,
    "input_batch (num_reqs, is_prefilling_np)",
)
#: The same, where the batch has no phase column: vLLM's pre-step answer says it.
bind_draft_count_pre_step = _phase_aware_count(
    _DRAFT_STEP,
    pre_step_phase_reader,
    DRAFT_EVENT_PREFIX,
    f"input_batch.idx_mapping_np and {PRE_STEP_QUESTION}'s pre-step answer for it",
)


def native_reason(sources: SourceReader) -> str | None:
    """``execute_model`` calls upstream's phase-aware classification."""
    if all(
        sources.mentions(RUNNER_MODULE, RUNNER_STEP, marker) is False
        for marker in _NATIVE_MARKERS
    ):
        return None  # names none of them: not parsed
    node = sources.function_node(RUNNER_MODULE, RUNNER_STEP)
    if node is None:
        return None
    for marker in _NATIVE_MARKERS:
        if recognition.calls_name(node, marker):
            return (
                f"{RUNNER_STEP} classifies by request phase ({marker}, "
                "vllm-project/vllm#51865)"
            )
    return None


class MRV2PhaseDispatchPatch(Patch):
    def __init__(self) -> None:
        super().__init__(**FIX.catalogue_facts(), anchor_module=RUNNER_MODULE)

    def hook_points(self) -> list[HookPoint]:
        hooks: list[HookPoint] = [
            ReplaceHook(RUNNER_MODULE, RUNNER_STEP, bind_target_step),
            ReplaceHook(
                RUNNER_MODULE, SHAPE_RULE, bind_target_count, caller=RUNNER_STEP
            ),
        ]
        dispatchers = draft_prefill_dispatchers(self.sources)
        draft_count = bind_draft_count
        if dispatchers and batch_lacks_phase_column(self.sources):
            draft_count = bind_draft_count_pre_step
            hooks.append(
                ReplaceHook(STATES_MODULE, PRE_STEP_QUESTION, bind_pre_step_answers)
            )
        for dispatcher in dispatchers:
            hooks += [
                ReplaceHook(dispatcher.module, dispatcher.propose, bind_draft_step),
                ReplaceHook(
                    dispatcher.module,
                    SHAPE_RULE,
                    draft_count,
                    caller=dispatcher.propose,
                ),
            ]
        return hooks

    def reads(self) -> list[Requirement]:
        reads: list[Requirement] = [
            SetsAttribute(RUNNER_MODULE, "GPUModelRunner", "req_states", SHAPE_RULE)
        ]
        reads += [
            SetsAttribute(STATES_MODULE, "RequestState", name, SHAPE_RULE)
            for name in (
                "req_id_to_index",
                "num_computed_prefill_tokens",
                "prefill_len",
            )
        ]
        if not draft_prefill_dispatchers(self.sources):
            return reads
        if batch_lacks_phase_column(self.sources):
            reads += [
                SetsAttribute(
                    INPUT_BATCH_MODULE, "InputBatch", "idx_mapping_np", SHAPE_RULE
                ),
                TakesParameters(
                    STATES_MODULE,
                    PRE_STEP_QUESTION,
                    ("idx_mapping_np",),
                    SHAPE_RULE,
                ),
            ]
        else:
            reads += [
                SetsAttribute(INPUT_BATCH_MODULE, "InputBatch", name, SHAPE_RULE)
                for name in ("num_reqs", BATCH_PHASE_COLUMN)
            ]
        return reads

    def native_reason(self, sources: SourceReader) -> str | None:
        return native_reason(sources)

    native_summary = (
        "Model Runner V2's target and draft-prefill dispatch keep prompt chunks "
        "off the FULL decode graph"
    )

    def behaviour(self, sources: SourceReader) -> Evidence | None:
        from vllm_graphsafe.fixes.mrv2_phase_dispatch import behaviour

        return behaviour.judge_source(sources)

    def live_modules(self) -> list[str]:
        return [
            RUNNER_MODULE,
            MRV2_INPUT_BATCH,
            *(m for m, _ in MRV2_SPECULATORS if self.sources.exists(m)),
        ]

    def confirm_behaviour(self) -> Evidence | None:
        """The target's cases alone (the draft's would be compiled from the
        same source the verdict was judged on): about a millisecond."""
        return self.live_behaviour(draft=False)

    def live_behaviour(self, draft: bool = True) -> Evidence | None:
        classes: dict[tuple[str, str], type] = {}
        for module, owner in ((RUNNER_MODULE, MRV2_RUNNER_CLASS), *MRV2_SPECULATORS):
            found = getattr(sys.modules.get(module), owner, None)
            if isinstance(found, type):
                classes[(module, owner)] = unhooked(found)
        if (RUNNER_MODULE, MRV2_RUNNER_CLASS) not in classes:
            return None
        input_batch = getattr(sys.modules.get(MRV2_INPUT_BATCH), "InputBatch", None)
        from vllm_graphsafe.fixes.mrv2_phase_dispatch import behaviour

        return behaviour.judge_live(
            classes,
            input_batch if isinstance(input_batch, type) else None,
            SourceReader(),
            draft=draft,
        )


def make_patch() -> MRV2PhaseDispatchPatch:
    return MRV2PhaseDispatchPatch()
