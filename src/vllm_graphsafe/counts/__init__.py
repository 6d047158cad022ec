"""The dispatch decisions the fixes count, on disk for doctor, probe and ``/metrics``.

Each process counts in memory (:data:`STATS`), and into the directories the
plugin hands it (nothing here reads the environment).
"""

from __future__ import annotations

from vllm_graphsafe.counts.counter import STATS, DispatchStats
from vllm_graphsafe.counts.records import (
    NoStatisticsYet,
    StatsDirError,
    read_process_files,
    read_records_leniently,
    read_stats_dir,
    render_stats,
)
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
