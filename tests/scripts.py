"""Running a test's helper script in a fresh interpreter, and reading its answer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any


def run_python(
    args: list[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with ``env``; asserts it exited 0, showing its stderr's end."""
    result = subprocess.run(
        [sys.executable, *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def json_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects a script printed, one per line, among vLLM's own output."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def last_answer(
    args: list[str], env: Mapping[str, str], timeout: float = 600
) -> dict[str, Any]:
    """Run ``python ARGS``; its answer is the last line it printed, as JSON."""
    result = run_python(args, env, timeout)
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer
