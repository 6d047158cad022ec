"""Each process's record: its identity, patch states and counts, as one file.

A record identifies its process by pid, parent pid, role and DP rank, never by
its command line (which can hold an API key). Readers raise each count to what
the process's counts page holds, where the page is ahead.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_graphsafe import private_files
from vllm_graphsafe.counts import page
from vllm_graphsafe.counts.roles import current_role, dp_rank_of

SUFFIX = ".json"


class StatsDirError(ValueError):
    """A statistics directory that cannot be read; ``str()`` is one sentence."""


class NoStatisticsYet(StatsDirError):
    """The statistics directory does not exist yet."""


def process_record(
    patches: dict[str, str],
    wrapped: list[str],
    counts: dict[str, dict[str, int]],
) -> dict[str, Any]:
    name = multiprocessing.current_process().name
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "role": current_role(),
        "dp_rank": dp_rank_of(name),
        "process_name": name,
        "written_at": time.time(),
        "patches": patches,
        "wrapped": wrapped,
        "counts": counts,
    }


def write_record(directory: Path, pid: int, data: bytes) -> None:
    private_files.write_private_file(directory, f"{pid}{SUFFIX}", data)


def _is_count_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(event, str) and isinstance(n, int) and not isinstance(n, bool)
        for event, n in value.items()
    )


def check_record(record: Any) -> str | None:
    """Why ``record`` is not a statistics record, or None when it is one."""
    if not isinstance(record, Mapping):
        return "it is not a JSON object"
    if not isinstance(record.get("pid"), int):
        return "it has no integer pid"
    patches = record.get("patches", {})
    if not isinstance(patches, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in patches.items()
    ):
        return "its patches are not a map of patch ids to states"
    counts = record.get("counts", {})
    if not isinstance(counts, Mapping) or not all(
        isinstance(k, str) and _is_count_map(v) for k, v in counts.items()
    ):
        return "its counts are not a map of patch ids to event counts"
    return None


def read_process_files(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every process's last written record, in pid order; a
    :class:`StatsDirError` where the directory or a record cannot be read."""
    path = Path(directory)
    if not path.exists():
        raise NoStatisticsYet(
            f"No vLLM process has written statistics to {path} yet: the directory "
            "does not exist (the first vLLM process started with "
            f"GRAPHSAFE_STATS_DIR={path} creates it)."
        )
    if not path.is_dir():
        raise StatsDirError(f"The statistics directory {path} is not a directory.")
    try:
        files = sorted(
            path.glob(f"*{SUFFIX}"), key=lambda file: (len(file.name), file.name)
        )
    except OSError as error:
        raise StatsDirError(
            f"The statistics directory {path} cannot be read "
            f"({error.strerror or error})."
        ) from None
    return [_read_record(file) for file in files]


def _read_record(file: Path) -> dict[str, Any]:
    try:
        record = json.loads(file.read_bytes())
    except OSError as error:
        raise StatsDirError(
            f"The statistics file {file} cannot be read ({error.strerror or error})."
        ) from None
    except ValueError:
        raise StatsDirError(
            f"The statistics file {file} is not valid JSON; remove it or point "
            "--stats-dir at the directory vLLM writes."
        ) from None
    problem = check_record(record)
    if problem is not None:
        raise StatsDirError(
            f"The statistics file {file} is not a vllm-graphsafe statistics record "
            f"({problem})."
        )
    # Each count raised to what its process's page holds.
    stored = page.read_counts_page(file.with_suffix(page.SUFFIX))
    return {**record, "counts": page.merged_counts(record.get("counts", {}), stored)}


def read_records_leniently(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The readable records in ``directory``, skipping anything else (for scrapes)."""
    records = []
    try:
        files = list(Path(directory).glob(f"*{SUFFIX}"))
    except OSError:
        return []
    for file in files:
        with contextlib.suppress(StatsDirError):
            records.append(_read_record(file))
    return records


def read_stats_dir(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The counts every process wrote into ``directory``, summed, and how many
    processes are in each patch state."""
    records = read_process_files(directory)
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    patch_states: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for payload in records:
        for patch, state in payload.get("patches", {}).items():
            patch_states[patch][state] += 1
        for patch, events in payload.get("counts", {}).items():
            for event, value in events.items():
                totals[patch][event] += int(value)
    return {
        "processes": len(records),
        "patch_states": {patch: dict(states) for patch, states in patch_states.items()},
        "counts": {patch: dict(events) for patch, events in totals.items()},
        "directory": str(Path(directory)),
    }


def render_stats(stats: dict[str, Any]) -> list[str]:
    """:func:`read_stats_dir`'s answer, as lines for a terminal."""
    if not stats["processes"]:
        where = stats.get("directory") or "the statistics directory"
        return [
            f"{where} holds no vllm-graphsafe statistics: no vLLM process has "
            "written there (is it the directory GRAPHSAFE_STATS_DIR names?)."
        ]
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
