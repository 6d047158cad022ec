"""What a probe shows: the table, the summary line, the JSON report, statistics."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from vllm_graphsafe.probe.checks import FAIL, PASS, SKIP, CheckResult
from vllm_graphsafe.probe.errors import bad_argument

if TYPE_CHECKING:
    from vllm_graphsafe.probe.run import ProbeResult
    from vllm_graphsafe.probe.session import ProbeState

REDACTED = "<api key>"


def format_table(checks: Sequence[CheckResult]) -> str:
    rows = [("check", "length", "result", "detail")]
    rows += [(c.name, c.length_label, c.status.upper(), c.detail) for c in checks]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}"
        for row in rows
    ]
    return "\n".join(lines)


def summary_line(checks: Sequence[CheckResult]) -> str:
    counts = {
        status: sum(c.status == status for c in checks) for status in (PASS, FAIL, SKIP)
    }
    verdict = "FAILED" if counts[FAIL] else "passed"
    return (
        f"probe {verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
        f"{counts[SKIP]} skipped"
    )


def build_report(
    state: ProbeState, requests_sent: int, exit_status: int, error: str | None
) -> dict[str, Any]:
    checks = state.checks
    return {
        "tool": "vllm-graphsafe probe",
        "exit_status": exit_status,
        "error": error,
        "server": {
            "base_url": state.base_url,
            "model": state.model.model_id if state.model else None,
            "max_model_len": state.model.max_model_len if state.model else None,
            "vocab_size": state.vocab_size,
            "vocab_size_source": state.vocab_size_source,
            "instruction_source": state.instruction_source,
            "decode_prompt_tokens": state.decode_prompt_tokens,
        },
        "settings": state.settings.to_json(),
        "salt": state.salt,
        "plan": state.plan.to_json(),
        "requests_sent": requests_sent,
        "checks": [
            {
                "name": c.name,
                "lengths": list(c.lengths),
                "status": c.status,
                "passed": c.status != FAIL,
                "detail": c.detail,
            }
            for c in checks
        ],
        "summary": {
            status: sum(c.status == status for c in checks)
            for status in (PASS, FAIL, SKIP)
        },
        "samples": [
            {
                "length": s.length,
                "phase": s.phase,
                "token_ids": list(s.output.token_ids),
                "text": s.output.text,
                "finish_reason": s.output.finish_reason,
            }
            for s in state.samples
        ],
    }


def redact(value: Any, secret: str | None) -> Any:
    """``value`` with every occurrence of ``secret`` in its strings replaced."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, REDACTED)
    if isinstance(value, Mapping):
        return {key: redact(item, secret) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact(item, secret) for item in value]
    return value


def report_text(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2) + "\n"


def check_report_path(path: str) -> None:
    """Raise a ``ProbeError`` now if the JSON report could not be written there."""
    if path == "-":
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        reason = "it is a directory"
    elif not folder.is_dir():
        reason = f"the directory {str(folder)!r} does not exist"
    elif target.exists() and not os.access(target, os.W_OK):
        reason = "the file is not writable"
    elif not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        reason = f"the directory {str(folder)!r} is not writable"
    else:
        return
    raise bad_argument(f"Cannot write the JSON report to {path}: {reason} (--json).")


def write_report(path: str, report: Mapping[str, Any]) -> None:
    """Write the report to a file; ``OSError`` if that fails."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(report_text(report))


def read_dispatch_stats(directory: str) -> dict[str, Any]:
    """The summed statistics the server's processes wrote, or a ``ProbeError``."""
    from vllm_graphsafe.counts import StatsDirError, read_stats_dir

    try:
        return read_stats_dir(directory)
    except StatsDirError as error:
        raise bad_argument(str(error)) from None
    except (AttributeError, KeyError, TypeError, ValueError):
        raise bad_argument(
            f"The statistics directory {directory} holds JSON files that are not "
            f"the plugin's statistics (--stats-dir)."
        ) from None


def render_dispatch_stats(stats: dict[str, Any]) -> list[str]:
    from vllm_graphsafe.counts import render_stats

    return render_stats(stats)


def print_result(
    result: ProbeResult,
    json_path: str | None,
    quiet: bool = False,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> None:
    """Show a probe's outcome on a terminal, as ``vllm-graphsafe probe`` does.

    The table goes to standard output, or to standard error when the JSON report
    does (``json_path`` ``-``); ``quiet`` keeps only failed rows and the summary.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    if result.error is not None:
        print(result.error, file=err)
    else:
        table_stream = err if json_path == "-" else out
        failed = [check for check in result.checks if check.status == FAIL]
        rows = failed if quiet else list(result.checks)
        if rows:
            print(format_table(rows), file=table_stream)
        print(summary_line(result.checks), file=table_stream)
    if result.dispatch_stats is not None:
        print("\n".join(render_dispatch_stats(dict(result.dispatch_stats))), file=err)
    if json_path == "-" and result.report:
        out.write(report_text(result.report))
    for sentence in result.late_errors:
        print(sentence, file=err)
