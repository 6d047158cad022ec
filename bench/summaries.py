"""Summaries of the raw measurements, and the goals judged on what the run measured.

``bench/run.py`` stores both in results.json; ``bench/report.py`` renders them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from bench.timing import difference, median_interval, paired, ratio, summarize
from vllm_graphsafe.fixes.phase_events import (
    KEPT_OFF_DECODE,
    NON_UNIFORM,
    UNIFORM_DECODE,
)

#: Per-step goal: what a phase rule adds to a step may be up to what vLLM's own
#: rule that it wraps costs in the same rounds (V1: the shape rule; MRV2 before
#: 0.28: the shape-only count it replaces), at each of these batch sizes, in the
#: typical and the worst case. One rule decides both ways: the paired median of
#: the share at or under it is met, over it missed.
ADDED_SHARE_BUDGET = 1.0
GOAL_SIZES = ("256", "1024")
#: Every later process of an installation (its verdicts kept).
PLUGIN_BUDGET_MS = 50.0
#: The first process of an installation, which judges vLLM's source: about 1%
#: of the demo server's start-up.
JUDGED_BUDGET_MS = 300.0
#: Fewer repetitions (quick mode) only show that the servers run.
MIN_E2E_REPETITIONS = 4

CASE_LABELS = {
    "v1.shape": "V1 shape rule (vLLM)",
    "v1.phase": "V1 phase rule (graphsafe), all rows decoding",
    "v1.phase_prefill": "V1 phase rule (graphsafe), one row a prompt chunk",
    "mrv2.shape": "MRV2 shape rule (vLLM <= 0.27)",
    "mrv2.phase": "MRV2 phase rule (graphsafe), no row in prefill",
    "mrv2.phase_stale": "MRV2 phase rule (graphsafe), +64 unscheduled rows mid-prefill",
    "mrv2.native": "MRV2 native phase rule (vLLM 0.28+, gather_batch_req_state)",
    "replay_v1.vllm": "V1 FULL replay call (vLLM's CUDAGraphWrapper)",
    "replay_v1.guard": "V1 replay guard (graphsafe), 48 layers in 4 KV-cache groups",
    "replay_v1.guard_worst": "V1 replay guard (graphsafe), 48 layers, 48 groups",
    "replay_mrv2.vllm": "MRV2 FULL replay call (vLLM's run_fullgraph, from the step)",
    "replay_mrv2.guard": "MRV2 replay guard (graphsafe), 48 layers in 4 groups",
}
BASELINE = {
    "v1": "v1.shape",
    "mrv2": "mrv2.shape",
    "replay_v1": "replay_v1.vllm",
    "replay_mrv2": "replay_mrv2.vllm",
}
#: The replay guard's cases, each beside its runner's own replay call.
REPLAY_GUARD_CASES = (
    ("replay_v1.guard", "V1", "48 layers in 4 KV-cache groups"),
    ("replay_v1.guard_worst", "V1", "48 layers, each its own group (worst case)"),
    ("replay_mrv2.guard", "MRV2", "48 layers in 4 KV-cache groups"),
)
#: The phase rule's typical and worst case, per runner.
GOAL_CASES = {
    "v1": (("typical", "v1.phase"), ("worst", "v1.phase_prefill")),
    "mrv2": (("typical", "mrv2.phase"), ("worst", "mrv2.phase_stale")),
}


def added_share(a: float, b: float) -> float:
    """What ``a`` adds to ``b``, as a share of ``b``."""
    return (a - b) / b


# -- benchmark 1 -----------------------------------------------------------------


def summarize_dispatch(worker: dict[str, Any]) -> dict[str, Any]:
    """Per case and size: µs per step, and against the shape rule of its runner.

    ``added_share`` is (case - shape rule) / shape rule, paired within rounds.
    """
    samples: dict[str, dict[str, list[float]]] = worker["seconds_per_call"]
    cases: dict[str, Any] = {}
    for name, per_size in samples.items():
        baseline = samples.get(BASELINE[name.split(".")[0]], {})
        rows: dict[str, Any] = {}
        for size, values in per_size.items():
            row: dict[str, Any] = {"us": summarize(values, 1e6)}
            if name not in BASELINE.values() and size in baseline:
                row["ratio"] = summarize(paired(values, baseline[size], ratio))
                row["added_us"] = summarize(
                    paired(values, baseline[size], difference), 1e6
                )
                row["added_share"] = summarize(
                    paired(values, baseline[size], added_share)
                )
            rows[size] = row
        cases[name] = rows
    return {"cases": cases, "replay_reads": worker.get("replay_reads", {})}


# -- benchmark 2 -----------------------------------------------------------------


def summarize_plugin(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per release, vLLM context, bytecode and verdicts (kept or judged).

    ``own_ms`` is ``register_ms`` less the garbage collector's passes inside
    it: a full pass walks every object vLLM and torch made before the plugin
    loaded (about 0.5 s), and it falls to whichever allocation comes next, the
    plugin's or vLLM's own an instant later. Both are kept.
    """
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        plugin = run["plugin"]
        key = (
            run["vllm"],
            plugin["context"],
            plugin["bytecode"],
            plugin.get("verdicts", "judged"),
        )
        groups.setdefault(key, []).append(run)
    summary: dict[str, Any] = {}
    for (version, context, bytecode, verdicts), group in sorted(groups.items()):
        added: dict[str, list[float]] = {}
        for run in group:
            for module, timing in run.get("runner_imports", {}).items():
                added.setdefault(module, []).append(timing["added_ms"])
        plugins = [run["plugin"] for run in group]
        summary[f"{version}/{context}/{bytecode}/{verdicts}"] = {
            "vllm": version,
            "context": context,
            "bytecode": bytecode,
            "verdicts": verdicts,
            "register_ms": summarize([p["register_ms"] for p in plugins]),
            "collector_ms": summarize([p.get("collector_ms", 0.0) for p in plugins]),
            "own_ms": summarize(
                [p["register_ms"] - p.get("collector_ms", 0.0) for p in plugins]
            ),
            "modules_imported": statistics.median(
                run["plugin"]["modules_imported"] for run in group
            ),
            "states": group[0]["plugin"]["states"],
            "runner_import_added_ms": {
                module: summarize(values) for module, values in added.items()
            },
        }
    return summary


# -- benchmark 3 -----------------------------------------------------------------


#: The figures of each end-to-end turn (vLLM's serving benchmark): key, label,
#: whether higher is better. One throughput: with a fixed prompt set and
#: output length, vLLM's request, output and total throughputs are one ratio.
END_TO_END_FIGURES = (
    ("output_throughput", "output throughput, tokens/s", True),
    ("median_ttft_ms", "median time to first token, ms", False),
    ("p99_ttft_ms", "p99 time to first token, ms", False),
    ("median_tpot_ms", "median time per output token, ms", False),
    ("p99_tpot_ms", "p99 time per output token, ms", False),
    ("median_itl_ms", "median inter-token latency, ms", False),
    ("p99_itl_ms", "p99 inter-token latency, ms", False),
)


def on_off_ratio(on: float, off: float) -> float:
    """``on / off``; a figure of 0 ms with the plugin off (a median gap the
    client read as none) makes any other value infinitely larger."""
    if off:
        return on / off
    return 1.0 if on == off else math.inf


def summarize_end_to_end(result: dict[str, Any]) -> dict[str, Any]:
    """Per figure: the turns of each server, and the on/off ratios of the pairs
    with the 95% interval of their median."""
    turns = result["turns"]
    summary: dict[str, Any] = {}
    for metric, _, _ in END_TO_END_FIGURES:
        on = [turn[metric] for turn in turns["on"]]
        off = [turn[metric] for turn in turns["off"]]
        ratios = paired(on, off, on_off_ratio)
        summary[metric] = {
            "on": summarize(on),
            "off": summarize(off),
            "ratio_on_off": summarize(ratios),
            "ratio_median_ci95": list(median_interval(ratios)),
        }
    return summary


# -- goals -----------------------------------------------------------------------


def goal(
    met: bool | None,
    detail: str,
    verdict: str | None = None,
    row: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """``met`` None: not measured, unless ``verdict`` says what else.

    ``row`` is the goal's line in docs/benchmarks.md's table: (measure, result, target).
    """
    result: dict[str, Any] = {"met": met, "detail": detail}
    if verdict is not None:
        result["verdict"] = verdict
    if row is not None:
        result["row"] = list(row)
    return result


def dispatch_goals(version: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Added cost per step <= ADDED_SHARE_BUDGET x vLLM's own rule, where it runs.

    A runner whose phase cases were not measured on this release (MRV2 where
    vLLM classifies by phase itself, so the patch stays inert) has no goal.
    """
    goals: dict[str, Any] = {}
    cases = summary["cases"]
    for family, kinds in GOAL_CASES.items():
        native = f"{family}.native" in cases
        if native or not any(name in cases for _, name in kinds):
            continue
        shape = cases.get(BASELINE[family], {})
        for size in GOAL_SIZES:
            for kind, name in kinds:
                key = f"{family}_added_per_step ({kind}, {size} requests, {version})"
                row = cases.get(name, {}).get(size)
                measure = (
                    f"{family.upper()} phase rule, {kind} case, {size} requests "
                    f"(vLLM {version}): added per step"
                )
                target = f"<= x{ADDED_SHARE_BUDGET:.1f} the rule it wraps"
                if row is None or size not in shape:
                    goals[key] = goal(
                        None,
                        f"{name} at {size} requests not measured",
                        row=(measure, "not measured", target),
                    )
                    continue
                share = row["added_share"]
                met = share["median"] <= ADDED_SHARE_BUDGET
                goals[key] = goal(
                    met,
                    f"{CASE_LABELS.get(name, name)} adds "
                    f"{row['added_us']['median']:+.2f} µs "
                    f"[{row['added_us']['p10']:+.2f}…{row['added_us']['p90']:+.2f}] "
                    f"to vLLM's shape rule at {shape[size]['us']['median']:.2f} µs: "
                    f"x{share['median']:.2f} of it "
                    f"[{share['p10']:.2f}…{share['p90']:.2f}], paired within "
                    f"{row['us']['n']:.0f} rounds (goal <= x{ADDED_SHARE_BUDGET:.1f})",
                    row=(
                        measure,
                        f"x{share['median']:.2f} ({row['added_us']['median']:+.2f} µs "
                        f"on {shape[size]['us']['median']:.2f} µs)",
                        target,
                    ),
                )
    return goals


def replay_guard_goals(version: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The guard reads one count per KV-cache group on a replayed step; what
    that adds to the replay call is reported beside it, raw µs too."""
    goals: dict[str, Any] = {}
    cases, reads = summary["cases"], summary.get("replay_reads", {})
    for name, runner, shape in REPLAY_GUARD_CASES:
        per_size = cases.get(name)
        counted = reads.get(name)
        if not per_size or counted is None:
            continue
        size, row = next(reversed(per_size.items()))
        baseline = cases[BASELINE[name.split(".")[0]]][size]["us"]["median"]
        met = counted["reads"] <= counted["groups"]
        goals[f"replay_guard ({name}, {version})"] = goal(
            met,
            f"{CASE_LABELS[name]}: {counted['reads']} count reads for "
            f"{counted['groups']} groups on a learned step; adds "
            f"{row['added_us']['median']:+.2f} µs "
            f"[{row['added_us']['p10']:+.2f}…{row['added_us']['p90']:+.2f}] to "
            f"vLLM's replay call at {baseline:.2f} µs: "
            f"x{row['added_share']['median']:.2f} of it, paired within "
            f"{row['us']['n']:.0f} rounds",
            row=(
                f"{runner} replay guard, {shape} (vLLM {version}): added per "
                "replayed decode step",
                f"{counted['reads']} reads for {counted['groups']} groups; "
                f"x{row['added_share']['median']:.2f} "
                f"({row['added_us']['median']:+.2f} µs on vLLM's replay call, "
                f"{baseline:.2f} µs)",
                "one count read per KV-cache group",
            ),
        )
    return goals


def interval_verdict(
    low: float, high: float, higher_is_better: bool
) -> tuple[bool | None, str]:
    """One symmetric rule for an on/off ratio's interval of the median.

    An interval holding 1.0 detects no difference, within its half-width; one
    that excludes 1.0 says which way. Only a detected slowdown is a miss.
    """
    if low <= 1.0 <= high:
        return None, f"no difference detected within ±{50 * (high - low):.1f}%"
    better = (low > 1.0) == higher_is_better
    return (None, "faster") if better else (False, "**slower**")


def end_to_end_goals(e2e: dict[str, Any]) -> dict[str, Any]:
    """Per figure the run summarised: the symmetric verdict on its on/off ratio."""
    goals: dict[str, Any] = {}
    repetitions = e2e["raw"]["repetitions"]
    for metric, label, higher_is_better in END_TO_END_FIGURES:
        if metric not in e2e["summary"]:
            continue
        summary = e2e["summary"][metric]
        median = summary["ratio_on_off"]["median"]
        low, high = summary["ratio_median_ci95"]
        name = label.rsplit(",", 1)[0]
        detail = (
            f"{name} plugin on/off: median x{median:.3f}, 95% interval of the "
            f"median x{low:.3f}…x{high:.3f}, {repetitions} paired repetition(s)"
        )
        key = f"end_to_end_{metric}"
        measure = f"end to end, {name}, plugin on/off ({repetitions} pairs)"
        result = f"x{median:.3f} (95% interval of the median x{low:.3f}…x{high:.3f})"
        target = "no slowdown detected"
        if repetitions < MIN_E2E_REPETITIONS:
            goals[key] = goal(
                None, detail + "; too few to judge", row=(measure, result, target)
            )
            continue
        met, verdict = interval_verdict(low, high, higher_is_better)
        goals[key] = goal(met, detail, verdict=verdict, row=(measure, result, target))
    return goals


def coverage_goals(coverage: dict[str, Any]) -> dict[str, Any]:
    """Each installed phase rule: every genuine decode kept, no prompt step let in."""
    goals: dict[str, Any] = {}
    kept, leaked = coverage["decode_kept_pct"], coverage["prompt_as_decode_pct"]
    for runner in ("v1", "mrv2"):
        key = f"full_graph_coverage ({runner}, vLLM {coverage['vllm']})"
        measure = (
            f"FULL-graph coverage, {runner.upper()} (vLLM {coverage['vllm']}): "
            "genuine decode kept / prompt steps let in"
        )
        target = "100% / 0%"
        if runner in coverage["skipped"]:
            goals[key] = goal(
                None, coverage["skipped"][runner], row=(measure, "not measured", target)
            )
            continue
        phase, shape = f"{runner}.phase", f"{runner}.shape"
        goals[key] = goal(
            kept[phase] == 100.0 and leaked[phase] == 0.0,
            f"genuine uniform decode kept on the FULL decode graph {kept[phase]:.1f}% "
            f"(vLLM's shape rule {kept[shape]:.1f}%); steps holding a prompt sent "
            f"to it {leaked[phase]:.2f}% (shape rule {leaked[shape]:.2f}%), over "
            f"{coverage['steps']} steps (goal 100% / 0%)",
            row=(
                measure,
                f"{kept[phase]:.1f}% / {leaked[phase]:.2f}% (vLLM's shape rule "
                f"{kept[shape]:.1f}% / {leaked[shape]:.2f}%)",
                target,
            ),
        )
    return goals


#: Where a process's verdicts came from, as the report names it.
VERDICT_ORIGINS = {
    "kept": "every later process (verdicts kept)",
    "judged": "first process of an installation (verdicts judged from source)",
}


def plugin_goal(summary: dict[str, Any]) -> dict[str, Any]:
    """50 ms for a process that finds its verdicts kept, 300 ms for the first
    process of an installation, which judges vLLM's source."""
    own = summary.get("own_ms", summary["register_ms"])["median"]
    collector = summary.get("collector_ms", {"median": 0.0})["median"]
    added = sum(
        timing["median"] for timing in summary["runner_import_added_ms"].values()
    )
    total = own + added
    origin = summary.get("verdicts", "judged")
    when = VERDICT_ORIGINS.get(origin, f"verdicts {origin}")
    collector_note = f"; +{collector:.0f} ms collector pass" if collector >= 1 else ""
    budget = JUDGED_BUDGET_MS if origin == "judged" else PLUGIN_BUDGET_MS
    return goal(
        total < budget,
        f"import + register() {own:.1f} ms (garbage collector passes inside it "
        f"{collector:.1f} ms, not counted), post-import wrapping {added:.1f} ms: "
        f"{total:.1f} ms per process (budget {budget:.0f} ms, n="
        f"{summary['register_ms']['n']:.0f})",
        row=(
            f"plugin import + register + post-import wrapping, {when} "
            f"(vLLM {summary['vllm']})",
            f"{total:.1f} ms (n={summary['register_ms']['n']:.0f}{collector_note})",
            f"< {budget:.0f} ms",
        ),
    )


# -- benchmark 5: the soak -------------------------------------------------------

#: The plugin's decision events, in the order the soak reports them.
SOAK_EVENTS = (
    (UNIFORM_DECODE, "uniform decode"),
    (KEPT_OFF_DECODE, "kept off the decode graph"),
    (NON_UNIFORM, "non-uniform"),
)
RSS_GROWTH_BUDGET = 0.05


def resident_growth(soak: dict[str, Any]) -> dict[str, float]:
    """Each process's resident memory at the end over after the warm-up, less 1,
    by ``pid (name)``; a process gone by the end is left out."""
    resident = soak["resident_kib"]
    after, at_end = resident["after_warm_up"], resident["at_end"]
    return {
        f"{pid} ({before['name']})": at_end[pid]["kib"] / before["kib"] - 1.0
        for pid, before in after.items()
        if pid in at_end and before["kib"] > 0
    }


def _decisions(counts: dict[str, int]) -> str:
    return ", ".join(f"{label} {counts.get(event, 0)}" for event, label in SOAK_EVENTS)


def soak_goals(soak: dict[str, Any]) -> dict[str, Any]:
    """No request fails; the plugin's counts equal both tallies of the step log;
    no process's resident memory grows more than RSS_GROWTH_BUDGET; ``/metrics``
    answered every second, and its last page holds the counts."""
    load, decisions, metrics = soak["load"], soak["decisions"], soak["metrics"]
    requests = soak["requests"]
    failed = load["failed"] + soak["warm_up_failed"]
    measure = f"soak, {requests} requests at concurrency {soak['concurrency']}"
    goals = {
        "soak_failed_requests": goal(
            failed == 0 and load["completed"] == requests,
            f"{load['completed']:.0f} of {requests} requests completed, "
            f"{load['failed']:.0f} failed ({soak['warm_up_failed']:.0f} of the "
            f"warm-up's {soak['warm_up']}), in {load['seconds']:.0f} s at "
            f"{load['output_throughput']:.0f} output tokens/s",
            row=(
                f"{measure} ({load['seconds']:.0f} s): requests failed",
                f"{failed:.0f} of {requests + soak['warm_up']}",
                "0",
            ),
        )
    }
    counted = decisions["counted"]
    equal = counted == decisions["scheduler"] == decisions["engine"]
    kept = counted.get(KEPT_OFF_DECODE, 0)
    # Equal counts of a load with no decode-shaped prompt step show too little.
    judged = (True if kept else None) if equal else False
    goals["soak_decision_counts"] = goal(
        judged,
        f"over the server's {decisions['steps']} steps (warm-up included) the "
        f"plugin counted {_decisions(counted)}; "
        f"the scheduler's output calls for {_decisions(decisions['scheduler'])}; "
        f"the runner handed the dispatcher {_decisions(decisions['engine'])}"
        + ("" if kept else "; no prompt step had a decode's shape"),
        row=(
            f"{measure}: the plugin's decision counts against the step log "
            "(scheduler's output, dispatcher's input)",
            ("equal: " if equal else "**differ**: counted ") + _decisions(counted),
            "equal",
        ),
    )
    growth = resident_growth(soak)
    worst = max(growth.values(), default=float("nan"))
    rounds = soak.get("warm_up_rounds", [])
    warm_up = f"a warm-up of {soak['warm_up']} requests" + (
        f" in {len(rounds)} rounds, the last growing memory "
        f"{rounds[-1]['growth']:+.1%} at most"
        + ("" if soak["warm_up_settled"] else ", not settled")
        if rounds
        else ""
    )
    goals["soak_resident_memory"] = goal(
        bool(growth) and worst <= RSS_GROWTH_BUDGET,
        f"resident memory at the end against after {warm_up}: "
        + (
            ", ".join(f"pid {name} {share:+.1%}" for name, share in growth.items())
            or "no process measured twice"
        )
        + f" (goal <= +{RSS_GROWTH_BUDGET:.0%} each)",
        row=(
            f"{measure}: resident memory growth of each vLLM process, end against "
            "after the warm-up",
            f"{worst:+.1%} at most ({len(growth)} processes)",
            f"<= +{RSS_GROWTH_BUDGET:.0%} each",
        ),
    )
    due = int(metrics["seconds"])
    answered = metrics["statuses"].get("200", 0)
    last = metrics["last_decisions"]
    same = all(last.get(event, 0) == counted.get(event, 0) for event, _ in SOAK_EVENTS)
    goals["soak_metrics_scrapes"] = goal(
        metrics["error_count"] == 0 and answered >= due and same,
        f"{metrics['scrapes']} scrapes of /metrics in {metrics['seconds']:.0f} s "
        f"(statuses {metrics['statuses']}), {metrics['error_count']} errors"
        + (f" (first: {metrics['errors'][0]})" if metrics["errors"] else "")
        + f", slowest {metrics['slowest_s'] * 1e3:.0f} ms; the last page's decisions "
        + ("equal the counts" if same else f"are {metrics['last_decisions']}"),
        row=(
            f"{measure}: /metrics scraped once a second through the load",
            f"{answered} answered of {metrics['scrapes']}, "
            f"{metrics['error_count']} errors",
            "every second, no error",
        ),
    )
    return goals


def check_goals(results: dict[str, Any]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    dispatch = results.get("dispatch_cost", {}).get("summary", {})
    for version, summary in dispatch.items():
        goals.update(dispatch_goals(version, summary))
        goals.update(replay_guard_goals(version, summary))
    for key, summary in results.get("plugin_cost", {}).get("summary", {}).items():
        if summary["context"] != "process" or summary["bytecode"] != "cached":
            continue
        goals[f"plugin_cost_ms ({key})"] = plugin_goal(summary)
    e2e = results.get("end_to_end", {})
    if "summary" in e2e:
        goals.update(end_to_end_goals(e2e))
    coverage = results.get("full_graph_coverage")
    if coverage:
        goals.update(coverage_goals(coverage))
    if "soak" in results:
        goals.update(soak_goals(results["soak"]))
    return goals
