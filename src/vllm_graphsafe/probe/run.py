"""``run_probe``: check the settings, probe the server, return what it found.

The statistics are read once after the checks, so that they count the probe's
own requests; the whole result is redacted once, at the end, since a server may
quote the API key back (an error page that echoes the request's headers).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar, cast

from vllm_graphsafe.probe import errors
from vllm_graphsafe.probe.checks import FAIL, PASS, SKIP, CheckResult, not_run_sentences
from vllm_graphsafe.probe.client import RequestBudget, ServerClient
from vllm_graphsafe.probe.errors import ProbeError
from vllm_graphsafe.probe.plan import make_plan
from vllm_graphsafe.probe.session import ProbeSession, ProbeState
from vllm_graphsafe.probe.settings import (
    ProbeSettings,
    check_settings,
    read_dispatch_stats,
)


@dataclass(frozen=True)
class ProbeResult:
    """How a probe ended. ``error`` is the sentence that ended it early, if one
    did; ``late_errors`` are about the statistics, read after the checks ran."""

    exit_code: int
    checks: tuple[CheckResult, ...] = ()
    report: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    late_errors: tuple[str, ...] = ()
    dispatch_stats: Mapping[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return self.exit_code == errors.EXIT_OK


def checks_exit_status(checks: Sequence[CheckResult]) -> int:
    """1 when a check failed, else 14 when one could not run, else 0: a probe
    that did not run every check never passes."""
    if any(check.status == FAIL for check in checks):
        return errors.EXIT_CHECK_FAILED
    if any(check.status == SKIP for check in checks):
        return errors.EXIT_INCOMPLETE
    return errors.EXIT_OK


def build_report(
    state: ProbeState,
    requests_sent: int,
    exit_status: int,
    error: str | None,
    dispatch_stats: Mapping[str, Any] | None,
) -> dict[str, Any]:
    checks = state.checks
    report: dict[str, Any] = {
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
                "passed": c.status == PASS,
                "detail": c.detail,
            }
            for c in checks
        ],
        "summary": {
            status: sum(c.status == status for c in checks)
            for status in (PASS, FAIL, SKIP)
        },
        "not_run": not_run_sentences(checks),
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
    if dispatch_stats is not None:
        report["dispatch_stats"] = dispatch_stats
    return report


REDACTED = "<api key>"
_Value = TypeVar("_Value")


def redact(value: _Value, secret: str | None) -> _Value:
    """A copy of ``value`` with ``secret`` replaced in its strings, to any depth of
    mappings, lists, tuples and dataclasses."""
    if not secret:
        return value
    return cast(_Value, _redacted(value, secret))


def _redacted(value: Any, secret: str) -> Any:
    if isinstance(value, str):
        return value.replace(secret, REDACTED)
    if isinstance(value, Mapping):
        return {key: _redacted(item, secret) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item, secret) for item in value]
    if isinstance(value, tuple):
        return tuple(_redacted(item, secret) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            attribute.name: _redacted(getattr(value, attribute.name), secret)
            for attribute in dataclasses.fields(value)
            if attribute.init
        }
        return dataclasses.replace(value, **changes)
    return value


def run_probe(
    settings: ProbeSettings, progress_stream: TextIO | None = None
) -> ProbeResult:
    """Probe the server ``settings`` names; print nothing but the progress bar, to
    ``progress_stream`` (default: stderr) if it is a terminal and settings allow."""
    result = _probe(settings, progress_stream or sys.stderr)
    return redact(result, settings.api_key)


def _probe(settings: ProbeSettings, stream: TextIO) -> ProbeResult:
    """The result as found, before the API key is taken out of it."""
    try:
        base_url = check_settings(settings)
    except ProbeError as error:
        return ProbeResult(error.exit_status, error=error.message)

    plan = make_plan(
        settings.num_speculative_tokens,
        settings.block_size,
        settings.chunk_size,
        settings.concurrency,
        needs_vocab_probe=settings.vocab_size is None,
    )
    state = ProbeState(settings, base_url, plan, salt=f"{random.randrange(16**6):06x}")
    budget = RequestBudget(settings.max_requests)
    from tqdm import tqdm

    progress = tqdm(
        total=max(plan.request_count, 1),
        desc="probe",
        unit="request",
        file=stream,
        leave=False,
        dynamic_ncols=True,
        disable=not (settings.progress and stream.isatty()),
    )
    error_message: str | None = None
    try:
        if plan.request_count > settings.max_requests:
            raise ProbeError(
                errors.EXIT_REQUEST_BUDGET,
                f"The probe plan needs {plan.request_count} requests but "
                f"--max-requests is {settings.max_requests}.",
            )
        with ServerClient(
            base_url, settings.timeout, budget, progress, settings.api_key
        ) as client:
            state.checks = ProbeSession(client, state).execute()
        exit_code = checks_exit_status(state.checks)
    except ProbeError as error:
        exit_code = error.exit_status
        error_message = error.message
    finally:
        progress.close()

    late_errors: list[str] = []
    dispatch_stats = None
    if settings.stats_dir and error_message is None:
        # A probe that ended early judged nothing: no statistics beside it.
        try:
            dispatch_stats = read_dispatch_stats(settings.stats_dir)
        except ProbeError as error:
            late_errors.append(error.message)
    report = build_report(state, budget.used, exit_code, error_message, dispatch_stats)
    if late_errors and exit_code == errors.EXIT_OK:
        exit_code = errors.EXIT_BAD_ARGUMENT
    return ProbeResult(
        exit_code=exit_code,
        checks=tuple(state.checks),
        report=report,
        error=error_message,
        late_errors=tuple(late_errors),
        dispatch_stats=dispatch_stats,
    )
