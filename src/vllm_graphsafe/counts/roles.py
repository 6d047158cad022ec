"""Which of vLLM's processes this is, from the name vLLM gives it.

A record names its process by role and DP rank, never by its command line
(which can hold an API key).
"""

from __future__ import annotations

import multiprocessing
import re
import sys

from vllm_graphsafe.vllm_layout import SERVER_MODULES

ROLE_API_SERVER = "api_server"
#: A process that loaded vLLM without serving it (a script, a test, a tool).
ROLE_MAIN = "main"
ROLE_ENGINE_CORE = "engine_core"
ROLE_WORKER = "worker"

#: The names vLLM gives the API server processes it spawns (``ApiServer_0``...).
SPAWNED_API_SERVER_PREFIX = "ApiServer"

_DP_RANK_IN_NAME = re.compile(r"_DP(\d+)")


def process_role(process_name: str) -> str:
    """The vLLM role of a process, from the name vLLM gives its processes."""
    if process_name.startswith(("EngineCore", "DPEngineCore")):
        return ROLE_ENGINE_CORE
    if "Worker" in process_name:
        return ROLE_WORKER
    return ROLE_API_SERVER if serves_http() else ROLE_MAIN


def current_role() -> str:
    """The vLLM role of this process."""
    return process_role(multiprocessing.current_process().name)


def serves_http() -> bool:
    """Whether this process runs vLLM's OpenAI-compatible server."""
    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    return main_name in SERVER_MODULES or any(
        name in sys.modules for name in SERVER_MODULES
    )


def dp_rank_of(process_name: str) -> int | None:
    """The data-parallel rank in an engine core's name (``EngineCore_DP1``)."""
    match = _DP_RANK_IN_NAME.search(process_name)
    return int(match.group(1)) if match else None


def is_root_process() -> bool:
    """Whether this process creates the metrics directory: the one the operator
    started to serve ``/metrics``, not an engine process nor an API server vLLM
    spawned."""
    return current_role() == ROLE_API_SERVER and not is_spawned_api_server()


def serves_vllm() -> bool:
    """Whether this process is one of vLLM's serving processes below the root:
    an engine core, a worker, or an API server vLLM spawned. Others that inherit
    the metrics directory (vLLM's model-inspection subprocess, a script started
    from the server's environment) stay out of ``/metrics``."""
    return current_role() in (ROLE_ENGINE_CORE, ROLE_WORKER) or is_spawned_api_server()


def is_spawned_api_server() -> bool:
    """Whether vLLM spawned this process to serve (``--api-server-count`` above 1)."""
    return multiprocessing.current_process().name.startswith(SPAWNED_API_SERVER_PREFIX)
