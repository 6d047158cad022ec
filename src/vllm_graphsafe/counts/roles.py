"""Which of vLLM's processes this is, from the name vLLM gives it, or in a Ray
actor from the vLLM class Ray runs it as (docs/architecture.md, "Ray actors")."""

from __future__ import annotations

import multiprocessing
import os
import re
import sys

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.vllm_layout import SERVER_MODULES

ROLE_API_SERVER = "api_server"
#: A process that loaded vLLM without serving it (a script, a test, a tool).
ROLE_MAIN = "main"
ROLE_ENGINE_CORE = "engine_core"
ROLE_WORKER = "worker"

#: vLLM's Ray actor classes (``module.Class``), by the role of the process Ray
#: runs each in.
RAY_ACTOR_ROLES = {
    f"{vllm_layout.RAY_WORKER_WRAPPER}.{vllm_layout.RAY_WORKER_WRAPPER_CLASS}": (
        ROLE_WORKER
    ),
    f"{vllm_layout.RAY_EXECUTOR_V2}.{vllm_layout.RAY_WORKER_PROC_CLASS}": ROLE_WORKER,
    **{
        f"{vllm_layout.ENGINE_CORE}.{name}": ROLE_ENGINE_CORE
        for name in vllm_layout.RAY_ENGINE_CORE_ACTOR_CLASSES
    },
}

_ray_actor_role_in: tuple[int, str | None] | None = None


def process_role(process_name: str) -> str:
    if process_name.startswith(("EngineCore", "DPEngineCore")):
        return ROLE_ENGINE_CORE
    if "Worker" in process_name:
        return ROLE_WORKER
    return ROLE_API_SERVER if serves_http() else ROLE_MAIN


def current_role() -> str:
    """In a Ray actor, the role of the vLLM class Ray runs it as (Ray names
    every actor process ``MainProcess``), else the one its name says."""
    return ray_actor_role() or process_role(multiprocessing.current_process().name)


def ray_actor_role() -> str | None:
    """Decided once per process, at the first call: the plugin makes it while
    vLLM sets the actor up (``init_worker`` loads the plugins), when Ray names
    the task running, e.g. ``<module>.RayWorkerProc.initialize_worker``; a
    thread the actor starts later has no task of vLLM's."""
    global _ray_actor_role_in
    if _ray_actor_role_in is None or _ray_actor_role_in[0] != os.getpid():
        _ray_actor_role_in = (os.getpid(), _role_of_running_ray_task())
    return _ray_actor_role_in[1]


def _role_of_running_ray_task() -> str | None:
    # Only a process Ray started has Ray loaded: importing it here would cost
    # seconds in every other vLLM process.
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        if context.get_actor_id() is None:  # a driver: Ray warns on task names there
            return None
        task = context.get_task_function_name() or ""
    except Exception:  # a Ray without these calls: the process name decides
        return None
    for actor_class, role in RAY_ACTOR_ROLES.items():
        if task.startswith(f"{actor_class}."):
            return role
    return None


def serves_http() -> bool:
    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    return main_name in SERVER_MODULES or any(
        name in sys.modules for name in SERVER_MODULES
    )


def dp_rank_of(process_name: str) -> int | None:
    """The data-parallel rank in an engine core's name (``EngineCore_DP1``)."""
    match = re.search(r"_DP(\d+)", process_name)
    return int(match.group(1)) if match else None


def is_root_process() -> bool:
    """Whether this process creates the metrics directory: the API server the
    operator started, not one vLLM spawned."""
    return current_role() == ROLE_API_SERVER and not is_spawned_api_server()


def serves_vllm() -> bool:
    """Whether this is one of vLLM's serving processes below the root. Others
    that inherit the metrics directory (vLLM's model-inspection subprocess, a
    script started from the server's environment) stay out of ``/metrics``."""
    return current_role() in (ROLE_ENGINE_CORE, ROLE_WORKER) or is_spawned_api_server()


def is_spawned_api_server() -> bool:
    # vLLM names the API servers it spawns (--api-server-count) ApiServer_0...
    return multiprocessing.current_process().name.startswith("ApiServer")
