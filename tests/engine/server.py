"""A real vLLM OpenAI-compatible server on loopback, for engine tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_graphsafe.cli.demo import free_port, stop_server, wait_for_health
from vllm_graphsafe.testing.engine import CPU_ENV, server_command


@dataclass
class Server:
    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def complete(self, prompt: Any, max_tokens: int = 8) -> dict[str, Any]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        request = urllib.request.Request(
            f"{self.base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())


@contextmanager
def running_server(
    model_dir: Path,
    workdir: Path,
    env: dict[str, str] | None = None,
    extra_args: list[str] = (),  # type: ignore[assignment]
) -> Iterator[Server]:
    port = free_port()
    full_env = {
        **CPU_ENV,
        **os.environ,
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(workdir / "vllm")),
        **(env or {}),
    }
    for name in ("VLLM_GRAPHSAFE_DISABLE", "VLLM_PLUGINS", "VLLM_GRAPHSAFE_STATS_DIR"):
        if env is None or name not in env:
            full_env.pop(name, None)
    log_path = workdir / f"server-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*server_command(model_dir, port), *extra_args],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_health(base_url, process, timeout=400)
        except RuntimeError as error:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{error}\n{tail}") from error
        yield Server(base_url, str(model_dir), process, log_path)
    finally:
        stop_server(process)


def run_engine_script(script: Path, model_dir: Path, plugin: bool) -> dict[str, Any]:
    """Run ``script MODEL_DIR`` on an in-process engine; return its last JSON line."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("VLLM_GRAPHSAFE_DISABLE", None)
    if not plugin:
        env["VLLM_GRAPHSAFE_DISABLE"] = "all"
    result = subprocess.run(
        [sys.executable, str(script), str(model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
