"""Child processes a test module starts together and then waits on, one by one."""

from __future__ import annotations

import subprocess


def finish_all(
    started: dict[str, subprocess.Popen[str]], timeout: float = 120
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each started process's exit status and output (pipes on both streams)."""
    finished = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=timeout)
        finished[name] = subprocess.CompletedProcess(
            process.args, process.returncode, stdout, stderr
        )
    return finished
