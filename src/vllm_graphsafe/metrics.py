"""The plugin's decisions and patch states on vLLM's own ``/metrics``, summed
from the records at scrape time (docs/architecture.md, "How the counts reach
/metrics"). Should the multi-process hook fail, vLLM's own metrics are served
as before, after one warning.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import signal
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.counts.records import read_records_leniently
from vllm_graphsafe.fixes import decision_events
from vllm_graphsafe.judging import PatchState

DECISIONS = "graphsafe_dispatch_decisions"


def decisions_help() -> str:
    return (
        "Dispatch decisions the vllm-graphsafe patches made, summed over vLLM's "
        f"engine-core and worker processes (decision: {', '.join(decision_events())})."
    )


PATCH_STATE = "graphsafe_patch_state"
PATCH_STATE_HELP = (
    "Number of vLLM processes in which each vllm-graphsafe patch is in each state "
    "(applied, native, not applicable, disabled, failed)."
)
#: An example Prometheus alerting rule, shown by the demo and the README.
EXAMPLE_ALERT = f"""\
- alert: GraphsafePatchFailed
  expr: sum by (patch) ({PATCH_STATE}{{state="failed"}}) > 0
  for: 1m
  annotations:
    summary: "vllm-graphsafe patch {{{{ $labels.patch }}}} failed; vLLM runs without it"
"""

logger = logging.getLogger(vllm_layout.LOGGER)

_warned = False


def create_metrics_directory() -> Path | None:
    """A new private directory, removed when this process exits; None where
    none can be made. The removal is registered before any SIGINT or SIGTERM
    can end the process in between."""
    deferred = {signal.SIGINT, signal.SIGTERM}
    held = signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    try:
        directory = Path(tempfile.mkdtemp(prefix="graphsafe-metrics-"))
        atexit.register(remove_directory, directory, os.getpid())
    except OSError:
        return None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return directory


def remove_directory(directory: Path, owner_pid: int) -> None:
    # Engine processes signalled with this one may still be writing their last
    # records into it: remove what they add until the directory itself is gone.
    if os.getpid() != owner_pid:
        return
    for _ in range(20):  # 2 s at most
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            return
        time.sleep(0.1)


def register_collector(directory: Path) -> bool:
    """Put the collector on prometheus_client's default registry (``/metrics``)."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return False
    try:
        REGISTRY.register(DispatchCollector(directory))
    except ValueError:  # already registered (a second plugin load)
        return False
    return True


def serve_with_multiprocess_collector(directory: Path) -> bool:
    """Have every ``MultiProcessCollector`` here also yield the plugin's families.
    Idempotent; never raises (an error is one warning, the collector left as is).
    """
    try:
        from prometheus_client import multiprocess
    except ImportError:
        return False
    try:
        collector_class: Any = multiprocess.MultiProcessCollector
        original = collector_class.collect
        if getattr(original, "graphsafe_hook", False):
            return True

        @functools.wraps(original)
        def collect(self: Any) -> Iterator[Any]:
            yield from original(self)
            try:
                families = metric_families(read_records_leniently(directory))
            except Exception as error:
                warn_once(error)
                return
            yield from families

        collect.graphsafe_hook = True  # type: ignore[attr-defined]
        collector_class.collect = collect
    except Exception as error:
        warn_once(error)
        return False
    return True


def warn_once(error: BaseException) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    logger.warning(
        "vllm-graphsafe: its metrics are not on /metrics (%s: %s); vLLM serves "
        "as usual. GRAPHSAFE_STATS_DIR and `vllm-graphsafe doctor --stats-dir` "
        "still show the counts.",
        type(error).__name__,
        error,
    )


class DispatchCollector:
    """Reads every process's record at scrape time."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield from metric_families(read_records_leniently(self.directory))


def resolved_dp_ranks(records: Iterable[dict[str, Any]]) -> dict[int, int | None]:
    """Each record's DP rank: its own, else its engine core parent's (a worker)."""
    by_pid = {record["pid"]: record for record in records}
    ranks: dict[int, int | None] = {}
    for pid, record in by_pid.items():
        rank = record.get("dp_rank")
        ancestor = record
        for _ in range(3):
            if rank is not None:
                break
            ancestor = by_pid.get(ancestor.get("ppid"), {})
            rank = ancestor.get("dp_rank")
        ranks[pid] = rank if isinstance(rank, int) else None
    return ranks


def metric_families(records: list[dict[str, Any]]) -> list[Any]:
    """The counters and gauges for ``records``; DP rank a label if there are several."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    ranks = resolved_dp_ranks(records)
    by_rank = len({rank for rank in ranks.values() if rank is not None}) > 1
    extra = ["dp_rank"] if by_rank else []
    decisions: dict[tuple[str, ...], int] = defaultdict(int)
    states: dict[tuple[str, ...], int] = defaultdict(int)
    patches_by_rank: set[tuple[str, ...]] = set()
    for record in records:
        rank: tuple[str, ...] = ()
        if by_rank:
            dp_rank = ranks[record["pid"]]
            rank = ("" if dp_rank is None else str(dp_rank),)
        for patch, events in record.get("counts", {}).items():
            for event, value in events.items():
                decision_key = (patch, event, *rank)
                decisions[decision_key] += int(value)
        for patch, state in record.get("patches", {}).items():
            state_key = (patch, state, *rank)
            states[state_key] += 1
            patches_by_rank.add((patch, *rank))
    decision_family = CounterMetricFamily(
        DECISIONS, decisions_help(), labels=["patch", "decision", *extra]
    )
    for labels, value in sorted(decisions.items()):
        decision_family.add_metric(list(labels), value)
    state_family = GaugeMetricFamily(
        PATCH_STATE, PATCH_STATE_HELP, labels=["patch", "state", *extra]
    )
    for patch, *label in sorted(patches_by_rank):
        for state in PatchState:
            value = states.get((patch, state.value, *label), 0)
            state_family.add_metric([patch, state.value, *label], value)
    return [decision_family, state_family]
