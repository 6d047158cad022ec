"""The dispatch decisions the fixes count, on disk for doctor, probe and ``/metrics``.

Each process counts in memory (:data:`STATS`); once the plugin hands it
directories, each count is also stored in a counts page there (:mod:`.page`)
and a thread writes the process's record (:mod:`.records`, :mod:`.writer`),
every file private (:mod:`vllm_graphsafe.private_files`). Nothing here reads
the environment: the plugin decides the directories.
"""

from __future__ import annotations

from vllm_graphsafe.counts.counter import STATS, DispatchStats
from vllm_graphsafe.counts.records import (
    NoStatisticsYet,
    StatsDirError,
    read_process_files,
    read_records_leniently,
    read_stats_dir,
)
from vllm_graphsafe.counts.render import render_stats
from vllm_graphsafe.counts.roles import (
    ROLE_API_SERVER,
    ROLE_ENGINE_CORE,
    ROLE_MAIN,
    ROLE_WORKER,
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
    "read_process_files",
    "read_records_leniently",
    "read_stats_dir",
    "render_stats",
]
