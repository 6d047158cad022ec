"""Test helpers around the local server: a healthy server for a ``with`` block,
and a greedy completion on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vllm_graphsafe.local_engine.launcher import LocalServer, start_server


@contextmanager
def running_server(
    model_dir: Path | str, *, startup_timeout: float, **start: Any
) -> Iterator[LocalServer]:
    """A healthy server (``start``: :func:`start_server`'s keywords) for the
    ``with`` block, stopped after it."""
    server = start_server(model_dir, **start)
    try:
        server.wait_until_healthy(startup_timeout)
        yield server
    finally:
        server.stop()


def complete(
    server: LocalServer,
    prompt: str | list[int],
    max_tokens: int,
    *,
    data_parallel_rank: int | None = None,
    timeout: float = 180.0,
) -> dict[str, Any]:
    """A greedy completion that ignores end-of-sequence tokens, on the
    ``data_parallel_rank`` given (vLLM's ``X-data-parallel-rank`` header)."""
    import httpx

    headers = {}
    if data_parallel_rank is not None:
        headers["X-data-parallel-rank"] = str(data_parallel_rank)
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    response = httpx.post(
        f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=timeout
    )
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
