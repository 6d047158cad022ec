"""How the launcher stops a server: a serving one through its main process
(vLLM then stops its engine processes in order, nothing force-killed), one
still starting through its whole process group; nothing is left either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from vllm_graphsafe.local_engine.launcher import LocalServer, live_group_members

#: Stands in for vLLM's API server and its engine process: each notes the
#: signals it gets; the main process, on SIGINT, stops its child (SIGTERM),
#: waits for it, and exits, as vLLM's shutdown does. Before it stops the child
#: it waits up to 2 s for the child to note a SIGINT of its own: in this
#: sandbox a signal to a process group reaches its members one after another,
#: and the parent's SIGTERM once overtook it (CI, 2026-12-05).
FAKE_SERVER = """
import os, signal, subprocess, sys, time
notes = sys.argv[1]
def note(who, what):
    with open(notes, "a") as out:
        out.write(f"{who} {what}\\n")
if len(sys.argv) > 2:
    signal.signal(signal.SIGINT, lambda *_: note("engine", "SIGINT"))
    signal.signal(signal.SIGTERM, lambda *_: (note("engine", "SIGTERM"), sys.exit(0)))
    note("engine", "ready")
    while True:
        time.sleep(0.05)
child = subprocess.Popen([sys.executable, __file__, notes, "engine"])
def stop(*_):
    note("server", "SIGINT")
    # A signal to the whole group may reach the engine after this handler has
    # run: the engine's SIGTERM must not overtake it.
    deadline = time.monotonic() + 2
    while "engine SIGINT" not in open(notes).read() and time.monotonic() < deadline:
        time.sleep(0.01)
    child.terminate()
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
while True:
    time.sleep(0.05)
"""


@contextmanager
def fake_server(tmp_path: Path, serving: bool) -> Iterator[tuple[LocalServer, Path]]:
    """The fake server, its group killed after the test whatever happened."""
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    notes = tmp_path / "notes"
    process = subprocess.Popen(
        [sys.executable, str(script), str(notes)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while "engine ready" not in (notes.read_text() if notes.exists() else ""):
            assert time.monotonic() < deadline, "the fake server did not start"
            time.sleep(0.05)
        server = LocalServer(
            "http://127.0.0.1:1", "model", process, tmp_path / "log", None
        )
        server.serving = serving  # as wait_until_healthy leaves it
        yield server, notes
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_serving_server_is_stopped_through_its_main_process(tmp_path: Path) -> None:
    with fake_server(tmp_path, serving=True) as (server, notes):
        server.stop(timeout=20)
        said = notes.read_text().splitlines()
        # Its engine process heard only its parent's orderly stop.
        assert "server SIGINT" in said and "engine SIGTERM" in said, said
        assert "engine SIGINT" not in said, said
        assert server.process.returncode == 0
        assert live_group_members(server.process.pid) == []


def test_a_server_still_starting_gets_the_signal_in_every_process(
    tmp_path: Path,
) -> None:
    with fake_server(tmp_path, serving=False) as (server, notes):
        server.stop(timeout=20)
        said = notes.read_text().splitlines()
        assert "server SIGINT" in said and "engine SIGINT" in said, said
        assert live_group_members(server.process.pid) == []
