# <!-- generated:facts:v1-phase-dispatch -->
# v1-phase-dispatch: V1 runner: phase-aware uniform-decode dispatch.
# What: On a real step whose shape is uniform decode, vLLM's shape rule answers False
#   unless every scheduled row is a decode as the attention metadata builders see it
#   (with K speculative tokens: the row schedules exactly 1 + its drafts; without: one
#   token over prior state), before the runner dispatches the CUDA graph and syncs it
#   across DP ranks. Capture, warm-up and dummy runs keep their own classification;
#   other shapes skip the scan. Cost: a reclassified step of 32-511 tokens also runs
#   without DBO microbatching on every DP rank.
# Why: With K speculative tokens a prompt chunk of K+1 tokens, or K+1 output tokens
#   re-computed after preemption, has the shape of a uniform speculative-decode batch;
#   replaying the FULL decode graph over it skips the recurrent-state writes of
#   GDN/Mamba layers: garbage output. A row padded with placeholder drafts is a decode
#   and keeps the graph.
# Binds to: GPUModelRunner._is_uniform_decode (the shape rule
#   _determine_batch_execution_and_padding consults on every step, before it dispatches
#   and syncs DP), on real steps; on 0.20-0.31 also Worker.execute_model, which under
#   pipeline + sequence parallel classifies the step before the runner updates its
#   state: there both calls decide from the step's scheduler output
# Upstream: vllm-project/vllm#49918, vllm-project/vllm#53051, vllm-project/vllm#47123,
#   vllm-project/vllm#53059
# Delete when: the oldest vLLM you serve has no V1 model runner (0.34 removed it): no
#   release has upstream's fix, so it retires with the runner
# (made from the facts in this folder's __init__.py by
# `python -m vllm_graphsafe.catalogue --write`: edit those, not this)
# <!-- /generated:facts:v1-phase-dispatch -->
"""V1 runner: a batch is uniform decode only when every scheduled row is a
decode as the metadata builders see it."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

from vllm_graphsafe import counts
from vllm_graphsafe.fixes.phase_events import (
    DUMMY,
    KEPT_OFF_DECODE,
    NON_UNIFORM,
    UNIFORM_DECODE,
)
from vllm_graphsafe.fixes.phase_rows import (
    rows_are_speculative_decodes,
    rows_have_prior_state,
    rows_past_prompt_with_drafts,
)
from vllm_graphsafe.fixes.scheduled_rows import DraftCounting
from vllm_graphsafe.fixes.v1_phase_dispatch import FIX
from vllm_graphsafe.fixes.v1_phase_dispatch.early import (
    ScheduledStepRule,
    StepHoldingExecute,
    classifies_before_state_update,
)
from vllm_graphsafe.fixes.v1_phase_dispatch.judge import (
    HOLD_STEPS_ROLE,
    SHAPE_RULE,
    SHAPE_RULE_ROLE,
)
from vllm_graphsafe.hook_points import Factory, HookPoint, OnFailure, ReplaceHook
from vllm_graphsafe.judging import Verdict

PATCH_ID = FIX.id

_SHAPE_RULE_NAME = SHAPE_RULE.rsplit(".", 1)[-1]
_READING = (
    "GPUModelRunner.num_decode_draft_tokens, GPUModelRunner.input_batch "
    "(num_computed_tokens_cpu, spec_token_ids; without the draft counts, "
    "num_prompt_tokens) "
    "or its parallel_config.pipeline_parallel_size / pass_config.enable_sp; "
    "under pipeline plus sequence parallelism, the step's scheduler output"
)
#: The shape rule's parameters, in order; a release that differs is not patched.
_SHAPE_RULE_PARAMETERS = (
    "max_num_scheduled_tokens",
    "uniform_decode_query_len",
    "num_tokens",
    "num_reqs",
    "force_uniform_decode",
)

ShapeRule = Callable[[int, int, int, int, "bool | None"], bool]


def first_row_has_drafts(runner: Any, num_drafts: int) -> bool:
    """Whether the batch's first row was handed ``num_drafts`` drafts this step:
    on a step that scheduled none, every K+1-token row is a prefill chunk.
    True where the runner holds no draft counts either (a test's runner): no
    count can be stale, and the rows decide."""
    try:
        scheduled_drafts = runner.input_batch.spec_token_ids
    except AttributeError:
        if getattr(runner, "num_decode_draft_tokens", None) is not None:
            raise
        return True
    return len(scheduled_drafts[0]) == num_drafts


class PhaseAwareShapeRule:
    """vLLM's static rule on the class; on a runner, the phase-aware rule kept
    in its ``__dict__``, which wins over this non-data descriptor next step."""

    def __init__(
        self,
        rule: ShapeRule,
        on_failure: OnFailure,
        step_rule: ScheduledStepRule | None = None,
        stale_draft_counts: bool = False,
    ) -> None:
        self.rule = rule
        self.on_failure = on_failure
        #: The draft-count column is left as it was on steps without drafts.
        self.stale_draft_counts = stale_draft_counts
        #: Where the worker may classify early (pipeline + sequence parallel).
        self.step_rule = step_rule
        self._runners: weakref.WeakSet[Any] = weakref.WeakSet()
        functools.update_wrapper(self, rule)  # type: ignore[arg-type]

    def __get__(self, runner: Any, owner: type | None = None) -> Callable[..., bool]:
        if runner is None:
            return self.rule
        bound = self.bind(runner)
        try:
            self._runners.add(runner)
            runner.__dict__[_SHAPE_RULE_NAME] = bound
        except (AttributeError, TypeError):
            # No __dict__ or no weak reference: bind on each access instead.
            self._runners.discard(runner)
        return bound

    def release(self) -> None:
        for runner in list(self._runners):
            runner.__dict__.pop(_SHAPE_RULE_NAME, None)
        self._runners = weakref.WeakSet()

    def bind(self, runner: Any) -> Callable[..., bool]:
        """The phase-aware rule for ``runner``, run once per step: the rows as
        ``_prepare_inputs`` just classified them for the metadata builders, or
        where the worker classifies first (:mod:`.early`), the scheduler output.
        """
        shape_rule, on_failure, step_rule = self.rule, self.on_failure, self.step_rule
        stale_draft_counts = self.stale_draft_counts
        count = counts.STATS.counter(PATCH_ID)
        # [None] until the first uniform real step, then whether it classifies early.
        early: list[bool | None] = [None if step_rule is not None else False]

        @functools.wraps(shape_rule)
        def phase_aware_is_uniform_decode(
            max_num_scheduled_tokens: int,
            uniform_decode_query_len: int,
            num_tokens: int,
            num_reqs: int,
            force_uniform_decode: bool | None = None,
        ) -> bool:
            uniform = shape_rule(
                max_num_scheduled_tokens,
                uniform_decode_query_len,
                num_tokens,
                num_reqs,
                force_uniform_decode,
            )
            try:
                if force_uniform_decode is not None:
                    count(DUMMY)
                    return uniform
                if not uniform:
                    count(NON_UNIFORM)
                    return uniform
                classifies_early = early[0]
                if classifies_early is None:
                    classifies_early = early[0] = classifies_before_state_update(runner)
                if classifies_early and step_rule is not None:
                    decodes = step_rule(runner, uniform_decode_query_len)
                else:
                    decodes = (
                        not stale_draft_counts
                        or uniform_decode_query_len == 1
                        or first_row_has_drafts(runner, uniform_decode_query_len - 1)
                    ) and rows_are_decodes(runner, num_reqs, uniform_decode_query_len)
                if decodes:
                    count(UNIFORM_DECODE)
                    return uniform
                count(KEPT_OFF_DECODE)
                return False
            except Exception as error:
                on_failure(error, _READING)
                return uniform

        return phase_aware_is_uniform_decode


def rows_are_decodes(runner: Any, num_reqs: int, decode_query_len: int) -> bool:
    """Whether the runner's builders see each of the first rows as a decode
    (with speculation, a runner without their draft counts, as upstream's tests
    build one, is read from its input batch)."""
    if decode_query_len > 1:
        try:
            column = runner.num_decode_draft_tokens.np
        except AttributeError:
            batch = runner.input_batch
            return rows_past_prompt_with_drafts(
                batch.num_computed_tokens_cpu,
                batch.num_prompt_tokens,
                getattr(batch, "spec_token_ids", None),
                num_reqs,
                decode_query_len - 1,
            )
        return rows_are_speculative_decodes(column, num_reqs, decode_query_len - 1)
    return rows_have_prior_state(runner.input_batch.num_computed_tokens_cpu, num_reqs)


def bind_phase_aware_shape_rule(
    original: Any,
    on_failure: OnFailure,
    *,
    step_rule: ScheduledStepRule | None = None,
    stale_draft_counts: bool = False,
) -> PhaseAwareShapeRule:
    rule = original.__func__ if isinstance(original, staticmethod) else original
    if not inspect.isfunction(rule):
        raise TypeError(f"{SHAPE_RULE} is {type(original).__name__}, not the static")
    # Not through functools.wraps' __wrapped__: a runner method has a ``self``
    # that the static rule must not have.
    parameters = tuple(inspect.signature(rule, follow_wrapped=False).parameters)
    if parameters != _SHAPE_RULE_PARAMETERS:
        raise TypeError(
            f"{SHAPE_RULE} takes {parameters}, not the static "
            f"{_SHAPE_RULE_PARAMETERS} this patch binds to"
        )
    return PhaseAwareShapeRule(rule, on_failure, step_rule, stale_draft_counts)


def hook_points(verdict: Verdict) -> list[HookPoint]:
    layout = verdict.layout
    counting = layout["draft_counting"]
    factories: dict[str, Factory] = {
        SHAPE_RULE_ROLE: functools.partial(
            bind_phase_aware_shape_rule,
            stale_draft_counts=layout["stale_draft_counts"],
            step_rule=ScheduledStepRule(
                None if counting is None else DraftCounting(**counting)
            )
            if layout["classifies_early"]
            else None,
        ),
        HOLD_STEPS_ROLE: StepHoldingExecute,
    }
    return [
        ReplaceHook(point.module, point.qualname, factories[point.role])
        for point in verdict.points
    ]
