"""The summed counts of a statistics directory, as lines for a terminal."""

from __future__ import annotations

from typing import Any


def render_stats(stats: dict[str, Any]) -> list[str]:
    """Lines for a terminal: the summed counters of every process."""
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
