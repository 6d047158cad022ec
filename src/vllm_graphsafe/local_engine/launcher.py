"""A local vLLM OpenAI-compatible server with the tiny model: start, wait, stop.

The server runs in its own process group on loopback and logs to a file. Its
temporary files (vLLM's IPC sockets and distributed rendezvous files, which it
leaves behind when it is stopped) go to a folder of its own, removed once every
process of the server has ended; torch's compiled-kernel cache stays where it
would have been.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path

from vllm_graphsafe.local_engine.cpu_config import CPU_ENV, server_command

LOG_TAIL_CHARS = 3000


class ServerStartError(RuntimeError):
    """The server exited or stayed unhealthy; the message ends with its log."""


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_environment(
    overrides: Mapping[str, str] | None = None,
    *,
    drop: Sequence[str] = (),
) -> dict[str, str]:
    """The CPU settings and this environment, less ``drop``, plus ``overrides``
    (a user's own switches reach the server)."""
    env = {**CPU_ENV, **os.environ}
    for name in drop:
        env.pop(name, None)
    env.update(overrides or {})
    return env


@dataclass
class LocalServer:
    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path
    #: The environment the server was started with, where it is known.
    env: Mapping[str, str] | None
    #: The server's own temporary folder (its ``TMPDIR``), removed by :meth:`stop`.
    temp_dir: Path | None = None
    #: Whether ``/health`` has answered: vLLM handles its stop signal from then on.
    serving: bool = False

    def command_line(self, caller_env: Mapping[str, str] | None = None) -> str:
        """A shell line that starts the server again, led by each variable of
        its environment that ``caller_env`` lacks or holds otherwise."""
        command = [str(arg) for arg in self.process.args]  # type: ignore[union-attr]
        env = self.env or {}
        caller_env = os.environ if caller_env is None else caller_env
        changed = [
            f"{name}={shlex.quote(value)}"
            for name, value in sorted(env.items())
            if caller_env.get(name) != value
        ]
        unset = sorted(name for name in caller_env if env and name not in env)
        prefix = [f"-u {shlex.quote(name)}" for name in unset]
        lead = (["env", *prefix] if prefix else []) + changed
        return " ".join([*lead, shlex.join(command)])

    def wait_until_healthy(self, timeout: float) -> None:
        """Return once ``/health`` answers 200, else raise :class:`ServerStartError`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._failed(
                    f"the vLLM server exited with status {self.process.returncode}"
                )
            try:
                with urllib.request.urlopen(
                    f"{self.base_url}/health", timeout=2
                ) as response:
                    if response.status == 200:
                        self.serving = True
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self._failed(f"the vLLM server was not healthy after {timeout:.0f} s")

    def _failed(self, reason: str) -> None:
        tail = self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        raise ServerStartError(
            f"{reason}; the last lines of its log ({self.log_path}):\n{tail}"
        )

    def stop(self, signal_number: int = signal.SIGINT, timeout: float = 30.0) -> None:
        """Signal the server and wait until every process of its group has
        ended; kill the group if any lingers.

        A serving server gets the signal alone, as an orchestrator stops it:
        vLLM then stops its engine processes in order (a signal to each of them
        at once makes them race their parent's shutdown, which logs the engine
        as dead). One still starting handles no signal until it serves, so its
        whole group gets it.
        """
        if self.process.poll() is None:
            if self.serving:
                self.process.send_signal(signal_number)
            else:
                os.killpg(self.process.pid, signal_number)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        deadline = time.monotonic() + timeout
        killed = False
        while live_group_members(self.process.pid):
            if time.monotonic() > deadline:
                if killed:
                    return
                with suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                killed = True
                deadline = time.monotonic() + 10
            time.sleep(0.2)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def live_group_members(process_group: int) -> list[int]:
    """Pids still running (not zombies) in ``process_group``; empty off Linux."""
    members = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgid = fields[0], int(fields[2])
        if pgid == process_group and state != "Z":
            members.append(int(stat_file.parent.name))
    return members


def start_server(
    model_dir: Path | str,
    *,
    env: Mapping[str, str],
    log_path: Path,
    port: int = 0,
    num_speculative_tokens: int = 3,
    extra_args: Sequence[str] = (),
) -> LocalServer:
    """Start the server (``port`` 0 picks a free one); it is not healthy yet."""
    port = port or free_port()
    command = [*server_command(model_dir, port, num_speculative_tokens), *extra_args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    temp_dir = private_temp_dir(env)
    child_env = dict(env)
    if temp_dir is not None:
        # torch's kernel cache where it would be without the private TMPDIR, so
        # that start-ups keep reusing it.
        inductor = os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}")
        child_env.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor)
        child_env["TMPDIR"] = str(temp_dir)
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                env=child_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    base_url = f"http://127.0.0.1:{port}"
    return LocalServer(base_url, str(model_dir), process, log_path, dict(env), temp_dir)


#: vLLM names its IPC sockets ``$TMPDIR/<uuid4>``; a socket path holds 107 bytes.
IPC_NAME_ROOM = 107 - len("/00000000-0000-0000-0000-000000000000")


def private_temp_dir(env: Mapping[str, str]) -> Path | None:
    """A new folder for the server's temporary files, inside the temporary
    folder it would use; None where ``env`` names a ``TMPDIR`` of its own for
    the server (the caller keeps that), or vLLM's socket names would not fit."""
    chosen = env.get("TMPDIR")
    default = tempfile.gettempdir()
    if chosen and os.path.realpath(chosen) != os.path.realpath(default):
        return None
    if len(os.path.join(default, "graphsafe-server-xxxxxxxx")) > IPC_NAME_ROOM:
        return None
    return Path(tempfile.mkdtemp(prefix="graphsafe-server-", dir=default))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
