"""Log, in a vLLM server's worker, which requests each real step scheduled.

Load it as the server's worker extension (``--worker-extension-cls``
:data:`WORKER_EXTENSION`, with the repository root on ``PYTHONPATH``) and set
``GRAPHSAFE_TEST_STEP_LOG`` to a directory: importing this module in the
worker wraps the V1 runner's ``execute_model``, and the worker appends one
JSON line per step that schedules tokens to ``<dir>/<pid>.jsonl``, as
:class:`tests.engine.emulator.step_recording.StepRecorder` sees it:

- ``scheduled``: the engine's ids of the requests the step scheduled;
- ``widths``: the tokens it scheduled for each of them;
- ``in_prompt``: those that had not computed their whole prompt before it;
- ``prefill_rows``: those a hybrid model's metadata builders run as prefills.

The ground truth is the scheduler's output, independent of the emulator and
of the plugin: a test reads from it whether a prompt really shared a step
with another request (the same on every server, stock or emulating).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.engine.emulator.step_recording import Step, StepRecorder

STEP_LOG_ENV = "GRAPHSAFE_TEST_STEP_LOG"
#: Seconds each step that schedules a request named :data:`SLOW_REQUEST_MARK`
#: is held after it ran: the tiny model decodes 2,000 tokens in under two
#: seconds, too short a window for prompts sent once the decode is seen
#: running to reach a loaded server in time. Answers are unchanged.
STEP_DELAY_ENV = "GRAPHSAFE_TEST_SLOW_STEP_S"
SLOW_REQUEST_MARK = "graphsafe-decode-"
WORKER_EXTENSION = f"{__name__}.StepLogExtension"


class StepLogExtension:
    """Adds nothing to the worker: importing this module installs the log."""


def _install(path: Path, slow_step_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)

    def log_step(step: Step) -> None:
        line = {
            "scheduled": step["scheduled"],
            "in_prompt": step["in_prompt"],
            "prefill_rows": step["prefill_rows"],
            "widths": step["widths"],
        }
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")
        if slow_step_s and any(SLOW_REQUEST_MARK in r for r in step["scheduled"]):
            time.sleep(slow_step_s)

    StepRecorder(dispatch_call="last", on_step=log_step).install()


def read_steps(directory: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every logged step of every worker writing to ``directory``."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        # The worker may be appending: a last line without its newline is
        # not written yet.
        *lines, _partial = path.read_text(encoding="utf-8").split("\n")
        for line in lines:
            yield json.loads(line)


if os.environ.get(STEP_LOG_ENV):
    _install(
        Path(os.environ[STEP_LOG_ENV]) / f"{os.getpid()}.jsonl",
        float(os.environ.get(STEP_DELAY_ENV) or 0),
    )
