"""Per-process dispatch decision counters, readable from outside the worker.

Each process counts its decisions in memory. When ``VLLM_GRAPHSAFE_STATS_DIR``
is set, it also writes them to ``<dir>/<pid>.json`` at most once a second and
at exit, so that ``doctor``, ``probe`` and the demo can read what the workers
decided.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_graphsafe.settings import read_settings

#: Steps that replay a uniform-decode graph under the phase rule.
UNIFORM_DECODE = "uniform_decode"
#: Steps whose shape alone would have picked the decode graph, kept off by phase.
KEPT_OFF_DECODE = "prefill_kept_off_decode_graph"
#: Dummy, capture and profile runs, classified by shape as vLLM asks.
DUMMY = "dummy"
#: Real steps with a non-uniform shape, which skip the request-state scan.
NON_UNIFORM = "non_uniform"
#: Dummy runs whose metadata the staging patch made consistent.
STAGED_DUMMY = "staged_dummy"

_FLUSH_INTERVAL_S = 1.0


class DispatchStats:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._directory: Path | None = None
        self._next_flush = 0.0
        self._registered_exit = False
        #: Returns this process's patch states, written beside the counters.
        self.describe_patches: Callable[[], dict[str, str]] = dict
        #: Returns the ids of the patches whose wrappers are in place here.
        self.wrapped_patches: Callable[[], list[str]] = list

    def configure(self, directory: str | None) -> None:
        self._directory = Path(directory) if directory else None
        if self._directory is not None and not self._registered_exit:
            atexit.register(self.flush)
            self._registered_exit = True

    def count(self, patch_id: str, event: str) -> None:
        self.counts[patch_id][event] += 1
        if self._directory is not None:
            self._maybe_flush()

    def counter(self, patch_id: str) -> Callable[[str], None]:
        """``count`` bound to one patch, for the per-step path."""
        events = self.counts[patch_id]

        def count(event: str) -> None:
            events[event] += 1
            if self._directory is not None:
                self._maybe_flush()

        return count

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + _FLUSH_INTERVAL_S
            self.flush()

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {patch: dict(events) for patch, events in self.counts.items() if events}

    def reset(self) -> None:
        # Counters handed out by counter() keep their dictionaries.
        for events in self.counts.values():
            events.clear()

    def flush(self) -> None:
        if self._directory is None:
            return
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
            target = self._directory / f"{os.getpid()}.json"
            staging = target.with_suffix(".tmp")
            staging.write_text(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "ppid": os.getppid(),
                        "process_name": multiprocessing.current_process().name,
                        "argv": sys.argv[:3],
                        "patches": self.describe_patches(),
                        "wrapped": self.wrapped_patches(),
                        "counts": self.snapshot(),
                    }
                )
            )
            staging.replace(target)
        except OSError:
            self._directory = None


STATS = DispatchStats()


def configure_from_environment() -> None:
    STATS.configure(read_settings().stats_dir)


def read_process_files(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every process's last written record, in pid order."""
    records = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def render_stats(stats: dict[str, Any]) -> list[str]:
    """Lines for a terminal: the summed counters of every process."""
    lines = [f"patch states in {stats['processes']} vLLM process(es):"]
    for patch_id, states in sorted(stats.get("patch_states", {}).items()):
        detail = ", ".join(f"{state} in {n}" for state, n in sorted(states.items()))
        lines.append(f"  {patch_id}: {detail}")
    lines.append("dispatch decisions:")
    for patch_id, events in sorted(stats["counts"].items()):
        detail = ", ".join(f"{event}={n}" for event, n in sorted(events.items()))
        lines.append(f"  {patch_id}: {detail}")
    if not stats["counts"]:
        lines.append("  no dispatch decisions recorded yet")
    return lines


def read_stats_dir(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Sum the counters every process wrote into ``directory``."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    processes = 0
    patch_states: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for payload in read_process_files(directory):
        processes += 1
        for patch, state in payload.get("patches", {}).items():
            patch_states[patch][state] += 1
        for patch, events in payload.get("counts", {}).items():
            for event, value in events.items():
                totals[patch][event] += int(value)
    return {
        "processes": processes,
        "patch_states": {patch: dict(states) for patch, states in patch_states.items()},
        "counts": {patch: dict(events) for patch, events in totals.items()},
    }
