"""The device run's verdicts and its table, from the configurations' results.

Pure: every input is the JSON the run's engines wrote. A configuration's
answers are compared request by request with the eager engine of the same K
(the oracle: it replays no CUDA graph); its boundary steps are the steps the
step recorder saw holding a prompt row in a decode batch's shape, counted from
vLLM's scheduler output, independently of the plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The configurations of each K, in the order they run and are reported.
MODES = ("eager", "off", "on", "guard")
TITLES = {
    "eager": "eager (oracle)",
    "off": "FULL decode graphs, plugin off",
    "on": "FULL decode graphs, plugin on",
    "guard": "FULL decode graphs, replay guard alone",
}
PHASE_FIX, GUARD_FIX = "v1-phase-dispatch", "replay-guard"
KEPT_OFF, FELL_BACK = "prefill_kept_off_decode_graph", "decode_graph_fallback"


def differences(
    oracle: dict[str, list[int]], answers: dict[str, list[int]]
) -> dict[str, int | None]:
    """Each request whose ids differ from the oracle's: the first differing
    position (None when one answer is missing)."""
    found: dict[str, int | None] = {}
    for label, expected in oracle.items():
        got = answers.get(label)
        if got is None:
            found[label] = None
        elif got != expected:
            found[label] = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(expected, got, strict=False))
                    if a != b
                ),
                min(len(expected), len(got)),
            )
    return found


def count(result: dict[str, Any], fix: str, decision: str) -> int:
    return int(result.get("counts", {}).get(fix, {}).get(decision, 0))


def verdicts(k: int, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's checks for one K: each with ``check``, ``passed`` (None when
    it could not be judged) and ``detail``."""
    ran = {m: r for m, r in results.items() if r.get("status") == "ran"}
    out: list[dict[str, Any]] = []

    def add(check: str, passed: bool | None, detail: str) -> None:
        out.append({"k": k, "check": check, "passed": passed, "detail": detail})

    oracle = ran.get("eager")
    for mode in ("off", "on", "guard"):
        result = ran.get(mode)
        if oracle is None or result is None:
            add(
                f"{mode}: answers against the oracle",
                None,
                "not judged: "
                + ("the oracle" if oracle is None else "this engine")
                + " did not run to its end",
            )
            continue
        diff = differences(oracle["answers"], result["answers"])
        total = len(oracle["answers"])
        boundary = result["steps"]["boundary"]
        if mode == "off":
            add(
                "off: some request differs from the oracle",
                bool(diff) if boundary else None,
                f"{len(diff)} of {total} differ ({', '.join(sorted(diff)) or 'none'}); "
                f"{boundary} boundary steps",
            )
            continue
        add(
            f"{mode}: every request equals the oracle",
            not diff,
            f"{total - len(diff)} of {total} equal"
            + (f"; differ: {', '.join(sorted(diff))}" if diff else ""),
        )
        fix, decision = (
            (PHASE_FIX, KEPT_OFF) if mode == "on" else (GUARD_FIX, FELL_BACK)
        )
        counted = count(result, fix, decision)
        add(
            f"{mode}: {fix} {decision} equals the boundary steps",
            counted == boundary,
            f"{counted} counted, {boundary} boundary steps seen by the step recorder",
        )
    return out


def summarize(
    results: Mapping[tuple[int, str], dict[str, Any]], ks: Sequence[int], dtype: str
) -> dict[str, Any]:
    """The run's summary from each engine's result, keyed by (K, configuration)."""
    first = next((r for r in results.values() if "gpu" in r), {})
    configs = {
        f"k{k}": {m: results.get((k, m), {"status": "not run"}) for m in MODES}
        for k in ks
    }
    return {
        "gpu": first.get("gpu"),
        "vllm": first.get("vllm"),
        "torch": first.get("torch"),
        "dtype": dtype,
        "configs": configs,
        "verdicts": [c for k in ks for c in verdicts(k, configs[f"k{k}"])],
        "throughput": [
            {"k": k, "off": results.get((k, "tput-off")), "on": results[(k, "tput-on")]}
            for k in ks
            if (k, "tput-on") in results
        ],
    }


def throughput_line(tput: dict[str, Any]) -> str:
    off, on = tput.get("off"), tput.get("on")
    if not off or not on or off.get("status") != "ran" or on.get("status") != "ran":
        return "decode throughput: not measured (an engine did not run to its end)"
    ratio = on["tokens_per_s"] / off["tokens_per_s"]
    same = "same tokens" if on["answers"] == off["answers"] else "TOKENS DIFFER"
    return (
        f"decode throughput, K={tput['k']}: "
        f"plugin off {off['tokens_per_s']:.0f} tok/s, "
        f"on {on['tokens_per_s']:.0f} tok/s: on/off = {ratio:.3f} "
        f"(medians of {len(on['runs'])} runs; runs off {_runs(off)}, on {_runs(on)}; "
        f"{same})"
    )


def _runs(result: dict[str, Any]) -> str:
    return "/".join(f"{r:.0f}" for r in result["runs"])


def table(summary: dict[str, Any]) -> str:
    """The short markdown table of a device run."""
    lines = [
        f"GPU: {summary.get('gpu', 'unknown')}; vLLM {summary.get('vllm', '?')}; "
        f"torch {summary.get('torch', '?')}; dtype {summary.get('dtype', '?')}",
        "",
        "| K | configuration | ran | requests equal to the oracle | boundary steps "
        "| kept off (v1-phase-dispatch) | guard fallbacks | wall s |",
        "|--:|---|---|--:|--:|--:|--:|--:|",
    ]
    for key, per_mode in sorted(summary.get("configs", {}).items(), reverse=True):
        oracle = per_mode.get("eager", {})
        for mode in MODES:
            result = per_mode.get(mode)
            if result is None:
                continue
            lines.append(_row(key, mode, result, oracle))
    lines.append("")
    for key, per_mode in sorted(summary.get("configs", {}).items(), reverse=True):
        oracle = per_mode.get("eager", {})
        if oracle.get("status") == "ran":
            cached = oracle.get("cached", {}).get("prefix_tail/k_plus_1", 0)
            lines.append(
                f"- K={key.lstrip('k')}: block size {oracle.get('block_size')}; "
                f"prefix_tail/k_plus_1 found {cached} tokens in the prefix cache"
            )
    for check in summary.get("verdicts", []):
        mark = {True: "PASS", False: "FAIL", None: "NOT JUDGED"}[check["passed"]]
        lines.append(f"- K={check['k']} {mark}: {check['check']} ({check['detail']})")
    for tput in summary.get("throughput", []):
        lines.append(f"- {throughput_line(tput)}")
    return "\n".join(lines) + "\n"


def _row(key: str, mode: str, result: dict[str, Any], oracle: dict[str, Any]) -> str:
    k = key.lstrip("k")
    status = result.get("status", "not run")
    if status != "ran":
        return (
            f"| {k} | {TITLES[mode]} | {status} | | | | | {result.get('wall_s', '')} |"
        )
    if mode == "eager" or oracle.get("status") != "ran":
        equal = "(oracle)" if mode == "eager" else "n/a"
    else:
        total = len(oracle["answers"])
        equal = (
            f"{total - len(differences(oracle['answers'], result['answers']))}/{total}"
        )
    return (
        f"| {k} | {TITLES[mode]} | yes | {equal} | {result['steps']['boundary']} "
        f"| {count(result, PHASE_FIX, KEPT_OFF)} "
        f"| {count(result, GUARD_FIX, FELL_BACK)} "
        f"| {result.get('wall_s', '')} |"
    )
