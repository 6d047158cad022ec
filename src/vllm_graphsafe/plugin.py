"""The ``vllm.general_plugins`` entry point: runs in every vLLM process."""

from __future__ import annotations

import logging

from vllm_graphsafe import stats, vllm_layout
from vllm_graphsafe.patches import all_patches
from vllm_graphsafe.registry import PatchFailedError, Registry

_REGISTRY: Registry | None = None


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(all_patches())
    return _REGISTRY


def register() -> None:
    """Apply every patch this vLLM needs. Idempotent; never raises unless strict."""
    _load_graph_hazard_emulator()
    first_time = _REGISTRY is None
    try:
        registry().apply_all()
    except PatchFailedError:
        raise
    except Exception as error:
        _vllm_logger().warning(
            "vllm-graphsafe: could not load its patches (%s: %s); vLLM runs "
            "without them. Report this with the output of `vllm-graphsafe doctor`.",
            type(error).__name__,
            error,
        )
        return
    stats.STATS.describe_patches = registry().states
    stats.STATS.wrapped_patches = registry().wrapped
    stats.configure_from_environment()
    stats.STATS.flush()
    if first_time:
        # ops: logged once vLLM's logging is configured (the API server loads
        # plugins before it configures logging).
        stats.STATS.announce(_vllm_logger(), f"vllm-graphsafe: {registry().summary()}")


# --- graph-hazard emulator (test instrument; owned by the emulator) -----------
# Imported only when GRAPHSAFE_EMULATE_GRAPH_HAZARD is on. The patches know
# nothing of it and it knows nothing of them; it wraps no hook point of theirs.
def _load_graph_hazard_emulator() -> None:
    from vllm_graphsafe.settings import emulate_graph_hazard

    if emulate_graph_hazard():
        from vllm_graphsafe import emulator

        emulator.install()


# --- end of the graph-hazard emulator block -------------------------------------


def _vllm_logger() -> logging.Logger:
    try:
        init_logger = vllm_layout.load_name(vllm_layout.LOGGING, "init_logger")
    except ImportError:
        return logging.getLogger(vllm_layout.LOGGER)
    vllm_logger: logging.Logger = init_logger(vllm_layout.LOGGER)
    return vllm_logger
