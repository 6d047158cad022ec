"""A real vLLM OpenAI-compatible server on loopback, for engine tests."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.scripts import last_answer
from tests.support.local_server import running_server as running_server_for_block
from vllm_graphsafe.local_engine import launcher as local
from vllm_graphsafe.local_engine.launcher import LocalServer, ServerStartError

STARTUP_TIMEOUT_S = 400.0
#: Set only where a test passes them: the plugin's switches and vLLM's plugin list.
_CALLER_ONLY = (
    "VLLM_GRAPHSAFE_DISABLE",
    "VLLM_PLUGINS",
    "VLLM_GRAPHSAFE_STATS_DIR",
    "GRAPHSAFE_DISABLE",  # ops: the settings' new names (contract 1)
    "GRAPHSAFE_STATS_DIR",
)


@contextmanager
def on_every_core() -> Iterator[None]:
    """What starts inside runs on every CPU of the machine, whatever share this
    test run was given (scripts/run_suite.py keeps each release's tests to one
    core of two): a server with a rank per core needs them all."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


class Server(LocalServer):
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
            completion: dict[str, Any] = json.loads(response.read())
        return completion


@contextmanager
def running_server(
    model_dir: Path,
    workdir: Path,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[Server]:
    overrides = {
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(workdir / "vllm")),
        **(env or {}),
    }
    port = local.free_port()
    try:
        with running_server_for_block(
            model_dir,
            env=local.server_environment(overrides, drop=_CALLER_ONLY),
            log_path=workdir / f"server-{port}.log",
            startup_timeout=STARTUP_TIMEOUT_S,
            port=port,
            extra_args=extra_args,
        ) as server:
            yield Server(**vars(server))
    except ServerStartError as error:
        raise AssertionError(str(error)) from error


def run_engine_script(script: Path, model_dir: Path, plugin: bool) -> dict[str, Any]:
    """Run ``script MODEL_DIR`` on an in-process engine; return its last JSON line."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("VLLM_GRAPHSAFE_DISABLE", None)
    if not plugin:
        env["VLLM_GRAPHSAFE_DISABLE"] = "all"
    return last_answer([str(script), str(model_dir)], env)
