"""The dispatch decisions the fixes count, on disk for doctor, probe and ``/metrics``.

Each process counts in memory (:data:`STATS`); once the plugin hands it
directories, each count is also stored in a counts page there (:mod:`.page`)
and a thread writes the process's record (:mod:`.records`, :mod:`.writer`).
Every file is private (:mod:`.private_files`). :mod:`.metrics` serves the
records on vLLM's ``/metrics``. Nothing here reads the environment: the plugin
decides the directories and hands them over.
"""

from __future__ import annotations

from vllm_graphsafe.counts.counter import STATS, DispatchStats
from vllm_graphsafe.counts.records import (
    NoStatisticsYet,
    StatsDirError,
    check_record,
    read_process_files,
    read_records_leniently,
    read_stats_dir,
    summarize,
)
from vllm_graphsafe.counts.render import render_stats
from vllm_graphsafe.counts.roles import (
    ROLE_API_SERVER,
    ROLE_ENGINE_CORE,
    ROLE_MAIN,
    ROLE_WORKER,
    process_role,
)
from vllm_graphsafe.private_files import UnsafeTargetError

__all__ = [
    "ROLE_API_SERVER",
    "ROLE_ENGINE_CORE",
    "ROLE_MAIN",
    "ROLE_WORKER",
    "STATS",
    "DispatchStats",
    "NoStatisticsYet",
    "StatsDirError",
    "UnsafeTargetError",
    "check_record",
    "process_role",
    "read_process_files",
    "read_records_leniently",
    "read_stats_dir",
    "render_stats",
    "summarize",
]
