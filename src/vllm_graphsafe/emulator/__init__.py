"""The graph-hazard emulator: a test instrument, a CPU engine failing as a GPU would.

With ``GRAPHSAFE_EMULATE_GRAPH_HAZARD=1``, each vLLM process that runs a V1
model runner corrupts the answers of every step a GPU would replay through the
FULL decode graph over prefill metadata (docs/emulator.md). It observes the
decision that really reaches the dispatcher and knows nothing of this
project's fixes (nor they of it). Never set it on a server that answers real
users.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.emulator import physical
from vllm_graphsafe.emulator.hazard import EmulatorState
from vllm_graphsafe.settings import EMULATE_ENV, emulate_graph_hazard

#: This process's record (steps seen, hazardous steps, poisoned requests).
STATE = EmulatorState()

_lock = threading.Lock()
_installed = False
_bound_error: str | None = None
_bound = False


def install() -> None:
    """Bind to the V1 runner now if imported, else when it is. Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    wrapt.register_post_import_hook(_bind, vllm_layout.V1_RUNNER)


def installed() -> bool:
    """Whether this process waits for (or has bound to) the V1 runner."""
    return _installed


def _bind(module: ModuleType) -> None:
    global _bound, _bound_error
    from vllm_graphsafe.emulator.v1_runner import BindError, V1RunnerEmulator

    mode = physical.mode()
    if problem := physical.mode_problem():
        vllm_layout.vllm_logger().error("vllm-graphsafe: %s", problem)
    try:
        V1RunnerEmulator(STATE, mode).bind(module)
    except (BindError, AttributeError, ImportError) as error:
        _bound_error = str(error)
        vllm_layout.vllm_logger().error(
            "vllm-graphsafe: %s=1 but the graph-hazard emulator cannot bind in this "
            "process (%s); it corrupts nothing here.",
            EMULATE_ENV,
            error,
        )
        return
    _bound = True
    if mode == physical.PHYSICAL:
        vllm_layout.vllm_logger().warning(
            "vllm-graphsafe: GRAPH-HAZARD EMULATOR ACTIVE, PHYSICAL MODE (%s=1, "
            "%s=physical, a test instrument): steps dispatched as uniform decode "
            "while a row is a prefill build their linear-attention "
            "metadata as a FULL decode CUDA graph's replay would read it, so "
            "vLLM's own kernels corrupt the recurrent state. Never use it on a "
            "server that answers real users.",
            EMULATE_ENV,
            physical.MODE_ENV,
        )
        return
    vllm_layout.vllm_logger().warning(
        "vllm-graphsafe: GRAPH-HAZARD EMULATOR ACTIVE (%s=1, a test instrument): "
        "steps dispatched as uniform decode while a row is a prefill answer "
        "with out-of-vocabulary ids, as a GPU replaying a FULL decode CUDA graph "
        "would. Never use it on a server that answers real users.",
        EMULATE_ENV,
    )


def describe() -> dict[str, Any]:
    """Whether the emulator is switched on, and what it did here."""
    on = emulate_graph_hazard()
    if not on:
        summary = f"off ({EMULATE_ENV} is not set)"
    elif _bound:
        summary = (
            f"ON in this process: {STATE.real_steps} real steps seen, "
            f"{len(STATE.hazards)} hazardous, {STATE.corrupted_token_count} "
            "tokens corrupted"
        )
    else:
        summary = (
            f"ON ({EMULATE_ENV}=1): vLLM processes started with this environment "
            "corrupt the answers of steps a GPU would replay through a FULL decode "
            "CUDA graph while a row is a prefill. A test instrument: never "
            "on a production server."
        )
    return {
        "name": "graph-hazard emulator",
        "variable": EMULATE_ENV,
        "requested": on,
        "bound_in_this_process": _bound,
        "bind_error": _bound_error,
        "mode": physical.mode(),
        "runner": "V1 (vllm/v1/worker/gpu_model_runner.py and its CPU subclass)",
        "summary": summary,
    }
