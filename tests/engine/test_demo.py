"""The README's main job, end to end, and the demo never leaving a server behind."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from tests.support import demo_output
from vllm_graphsafe.cli import demo
from vllm_graphsafe.local_engine.launcher import free_port, live_group_members

#: The demo's start-up progress: seconds since it began, two spaces, the phase.
PROGRESS_LINE = re.compile(r"\s*\d+ s  \S")


def demo_env(temp_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_GRAPHSAFE_D", "GRAPHSAFE_"))
    }
    return {**env, "TMPDIR": str(temp_dir)}


def demo_command(cache: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm_graphsafe.cli.main",
        "demo",
        "--cache-dir",
        str(cache),
        *args,
    ]


def ours(temp_dir: Path) -> list[Path]:
    """What the demo and the plugin left in the temporary directory (vLLM and
    torch keep their own sockets and caches there)."""
    return [path for path in temp_dir.iterdir() if path.name.startswith("graphsafe-")]


def model_cache(tmp_path: Path) -> Path:
    return Path(os.environ.get("VLLM_GRAPHSAFE_CACHE", tmp_path / "models")).parent


def test_demo_runs_and_shows_prefill_kept_off_decode_graphs(tmp_path: Path) -> None:
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    cache = model_cache(tmp_path)
    user_cache = tmp_path / "user-cache"
    result = subprocess.run(
        demo_command(cache),
        env={**demo_env(temp_dir), "XDG_CACHE_HOME": str(user_cache)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, output[-3000:] + result.stderr[-3000:]
    assert "a CPU runs no CUDA graphs" in output
    assert "random weights" in output
    assert "every fix this vLLM needs is active" in output
    kept = [line for line in output.splitlines() if line.startswith("The plugin kept")]
    assert kept and not kept[0].startswith("The plugin kept 0 "), output[-2000:]
    # The statistics are shown once, then the same counts on /metrics.
    assert (output + result.stderr).count("dispatch decisions:") == 1
    assert "graphsafe_dispatch_decisions_total{" in output
    assert "alert: GraphsafePatchFailed" in output
    assert "server stopped" in output
    # The emulated bug: garbage without the plugin, clean with it, said plainly.
    assert "the corruption below is emulated" in output.lower()
    verdicts = [line.strip() for line in output.splitlines() if "GARBAGE" in line]
    assert verdicts, output[-2000:]
    assert "second server stopped" in output
    assert ours(temp_dir) == []
    # The fixes' verdicts stay in the demo's cache directory, not the user's.
    assert any((cache / "verdicts").iterdir())
    assert not (user_cache / "vllm-graphsafe").exists()
    # Both servers were stopped in order: vLLM force-killed none of its processes.
    for log in ("demo-server.log", "demo-server-without-plugin.log"):
        assert "force killing" not in (cache / log).read_text(errors="replace"), log
    # The run has the structure docs/demo-output.md documents: phases named while
    # the servers start (never a log line), every check run, the exit status.
    demo_output.check_run(output + result.stderr + f"\nexit status {result.returncode}")


def test_a_short_startup_timeout_says_what_the_server_did(tmp_path: Path) -> None:
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    result = subprocess.run(
        demo_command(model_cache(tmp_path), "--startup-timeout", "5"),
        env=demo_env(temp_dir),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == demo.EXIT_SERVER_FAILED
    assert "was not healthy after 5 s" in result.stderr
    tail = result.stderr.split("log", 1)[-1]
    assert "no output yet" in result.stderr or tail.strip(), result.stderr
    assert "Traceback" not in result.stderr
    announced = re.search(r"server pid (\d+)", result.stdout)
    assert announced, result.stdout
    pid = int(announced.group(1))
    assert live_group_members(pid) == []
    assert ours(temp_dir) == []


def port_is_free(port: int) -> bool:
    """Nothing listens there, and a new server could bind it (as servers do, with
    SO_REUSEADDR, past the closed connections' TIME_WAIT)."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_sigterm_to_the_demo_stops_its_whole_server(tmp_path: Path) -> None:
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    port = free_port()
    process = subprocess.Popen(
        demo_command(model_cache(tmp_path), "--port", str(port)),
        env=demo_env(temp_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server_pid = None
    seen: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 600
        for line in process.stdout:
            seen.append(line)
            found = re.search(r"server pid (\d+)", line)
            if found:
                server_pid = int(found.group(1))
            if line.startswith("healthy at"):
                break
            assert time.monotonic() < deadline, "".join(seen[-20:])
        assert server_pid is not None and not port_is_free(port), "".join(seen[-20:])
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, "".join(seen[-20:]) + rest
    assert live_group_members(server_pid) == []
    assert port_is_free(port)
    assert ours(temp_dir) == []


def test_ctrl_c_during_start_up_says_so_at_once_stops_soon_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    process = subprocess.Popen(
        demo_command(model_cache(tmp_path), "--no-hazard"),
        env=demo_env(temp_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server_pid = None
    seen: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            found = re.search(r"server pid (\d+)", line)
            if found:
                server_pid = int(found.group(1))
                break
        assert server_pid is not None, "".join(seen)
        time.sleep(8)  # the server is loading the model, not yet healthy
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        # Progress lines printed while the test slept are still in the pipe.
        announced = process.stdout.readline()
        while PROGRESS_LINE.match(announced):
            announced = process.stdout.readline()
        said_after = time.monotonic() - interrupted
        rest, _ = process.communicate(timeout=60)
        stopped_after = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert announced.startswith(f"stopping the vLLM server (pid {server_pid})"), (
        announced + rest
    )
    assert said_after < 2, said_after
    assert stopped_after < 12, stopped_after
    assert process.returncode == demo.EXIT_INTERRUPTED, rest
    assert live_group_members(server_pid) == []
    assert ours(temp_dir) == []
