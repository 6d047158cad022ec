"""The data of the JSON report, gathered from what a probe learnt."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_graphsafe.probe.checks import FAIL, PASS, SKIP, not_run_sentences

if TYPE_CHECKING:
    from vllm_graphsafe.probe.session import ProbeState


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


def report_text(report: Mapping[str, Any]) -> str:
    """The report as the ``--json`` file (or standard output) holds it."""
    return json.dumps(report, indent=2) + "\n"
