"""The soak server's step log: each real step's widths and prompt rows.

Loaded as the worker extension of the soak test's server (with the repository
root on ``PYTHONPATH``) while ``GRAPHSAFE_TEST_SOAK_LOG`` names a directory:
the worker appends one JSON line per step that schedules tokens, from the
scheduler's output (:class:`tests.engine.emulator.step_recording.StepRecorder`),
independent of the plugin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.engine.emulator.step_recording import Step, StepRecorder

SOAK_LOG_ENV = "GRAPHSAFE_TEST_SOAK_LOG"
WORKER_EXTENSION = f"{__name__}.SoakStepLog"


class SoakStepLog:
    """Adds nothing to the worker: importing this module installs the log."""


def _install(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)

    def log_step(step: Step) -> None:
        line = {"widths": step["widths"], "in_prompt": step["in_prompt"]}
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    StepRecorder(dispatch_call="last", on_step=log_step).install()


if os.environ.get(SOAK_LOG_ENV):
    _install(Path(os.environ[SOAK_LOG_ENV]) / f"{os.getpid()}.jsonl")
