"""``run_probe``: validate the settings, probe the server, gather the report."""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from vllm_graphsafe.probe.checks import FAIL, CheckResult
from vllm_graphsafe.probe.client import RequestBudget, ServerClient
from vllm_graphsafe.probe.errors import (
    EXIT_BAD_ARGUMENT,
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_REQUEST_BUDGET,
    ProbeError,
)
from vllm_graphsafe.probe.plan import make_plan
from vllm_graphsafe.probe.progress import Progress
from vllm_graphsafe.probe.report import (
    build_report,
    check_report_path,
    read_dispatch_stats,
    redact,
    write_report,
)
from vllm_graphsafe.probe.session import ProbeSession, ProbeState
from vllm_graphsafe.probe.settings import ProbeSettings, check_numbers, parse_base_url


@dataclass(frozen=True)
class ProbeResult:
    """How a probe ended: its exit code, its checks and the JSON report's data.

    ``error`` is the sentence that ended the probe early, if one did;
    ``late_errors`` are sentences about the statistics or the report file, found
    after the checks ran. None of them, nor ``report``, holds the API key.
    """

    exit_code: int
    checks: tuple[CheckResult, ...] = ()
    report: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    late_errors: tuple[str, ...] = ()
    dispatch_stats: Mapping[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_OK


def check_settings(settings: ProbeSettings) -> str:
    """The normalized base URL; a ``ProbeError`` before any request otherwise."""
    base_url = parse_base_url(settings.base_url)
    check_numbers(settings)
    if settings.json_path:
        check_report_path(settings.json_path)
    if settings.stats_dir:
        read_dispatch_stats(settings.stats_dir)
    return base_url


def run_probe(
    settings: ProbeSettings, progress_stream: TextIO | None = None
) -> ProbeResult:
    """Probe the server ``settings`` names; print nothing but the progress bar.

    The bar goes to ``progress_stream`` (default: standard error) when
    ``settings.progress`` is set and that stream is a terminal. The JSON report is
    written to ``settings.json_path`` unless that is ``-`` (the caller prints it).
    """
    stream = progress_stream or sys.stderr
    secret = settings.api_key
    try:
        base_url = check_settings(settings)
    except ProbeError as error:
        message = redact(error.message, secret)
        return ProbeResult(error.exit_status, error=message)

    plan = make_plan(
        settings.num_speculative_tokens,
        settings.block_size,
        settings.chunk_size,
        settings.concurrency,
        needs_vocab_probe=settings.vocab_size is None,
    )
    state = ProbeState(settings, base_url, plan, salt=f"{random.randrange(16**6):06x}")
    budget = RequestBudget(settings.max_requests)
    show_bar = settings.progress and stream.isatty()
    progress = Progress(plan.request_count, stream, enabled=show_bar)
    error_message: str | None = None
    try:
        if plan.request_count > settings.max_requests:
            raise ProbeError(
                EXIT_REQUEST_BUDGET,
                f"The probe plan needs {plan.request_count} requests but "
                f"--max-requests is {settings.max_requests}.",
            )
        with ServerClient(
            base_url, settings.timeout, budget, progress, settings.api_key
        ) as client:
            state.checks = ProbeSession(client, state).execute()
        failed = any(check.status == FAIL for check in state.checks)
        exit_code = EXIT_CHECK_FAILED if failed else EXIT_OK
    except ProbeError as error:
        exit_code = error.exit_status
        error_message = redact(error.message, secret)
    finally:
        progress.close()

    late_errors: list[str] = []
    dispatch_stats = None
    if settings.stats_dir:
        try:
            dispatch_stats = read_dispatch_stats(settings.stats_dir)
        except ProbeError as error:
            late_errors.append(error.message)
    report = build_report(state, budget.used, exit_code, error_message)
    if dispatch_stats is not None:
        report["dispatch_stats"] = dispatch_stats
    report = redact(report, secret)
    if settings.json_path and settings.json_path != "-":
        try:
            write_report(settings.json_path, report)
        except OSError as error:
            reason = error.strerror or type(error).__name__
            late_errors.append(
                f"Cannot write the JSON report to {settings.json_path}: {reason}."
            )
    if late_errors and exit_code == EXIT_OK:
        exit_code = EXIT_BAD_ARGUMENT
    return ProbeResult(
        exit_code=exit_code,
        checks=tuple(state.checks),
        report=report,
        error=error_message,
        late_errors=tuple(late_errors),
        dispatch_stats=dispatch_stats,
    )
