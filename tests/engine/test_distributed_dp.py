"""Data parallel 2 with batch coordination, on vLLM's own multi-process server.

vLLM steps data-parallel ranks together (every rank enters
``coordinate_batch_across_dp`` once per step, idle ranks with a dummy batch)
only for models it treats as a mixture of experts, so the server runs the tiny
Qwen2-MoE whose layers are all dense. Requests are steered to a rank with the
``X-data-parallel-rank`` header: a long generation decodes on rank 1 while
``K+1``-token prompts arrive on rank 0, until one of them is prefilled in the
same synchronised step as one of rank 1's speculative-decode steps.

A recorder loaded as vLLM's worker extension (independent of the plugin) writes,
per rank, what the scheduler scheduled and what reached the CUDA graph
dispatcher, numbered by that rank's ``coordinate_batch_across_dp`` calls: equal
numbers on both ranks are the same synchronised step. With the plugin, the rank
prefilling the ``K+1`` prompt classifies it non-uniform while the other rank's
genuine decode stays uniform; with the plugin disabled both are uniform (the
bug). The plugin's own per-process statistics must agree with the recorder.

What CPU cannot show: the ranks exchange only their token counts and the CUDA
graph mode, and on CPU that mode is always NONE (no graphs are captured), so
neither the FULL-graph replay over a prefill nor a rank being dragged into
another rank's decode graph by the DP sync happens here. What this test pins is
the input to that sync: each rank's own classification on the synchronised step.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.serving import on_every_core
from tests.support import step_recorder as recorder
from tests.support.local_server import complete
from tests.support.step_recorder import STEP_DIR_ENV, WORKER_EXTENSION
from vllm_graphsafe.counts import read_process_files
from vllm_graphsafe.local_engine import launcher as local
from vllm_graphsafe.local_engine.tiny_model import build_tiny_moe_model

SPEC_TOKENS = 3
STARTUP_TIMEOUT_S = 900.0
DECODE_TIMEOUT_S = 180.0
# Pairing needs rank 1 to draft all K tokens in the very step rank 0 prefills;
# a loaded host misses that now and then, and each further prompt costs ~1 s.
MAX_BOUNDARY_PROMPTS = 24
LONG_DECODE_TOKENS = 1500
LONG_DECODE_PROMPT = "one two three one two three one two three one two three"
PATCH = "v1-phase-dispatch"
STATS_DIR_NAMES = ("GRAPHSAFE_STATS_DIR", "VLLM_GRAPHSAFE_STATS_DIR")
DISABLE_NAMES = ("GRAPHSAFE_DISABLE", "VLLM_GRAPHSAFE_DISABLE")
CALLER_ONLY = (*STATS_DIR_NAMES, *DISABLE_NAMES, "VLLM_PLUGINS", STEP_DIR_ENV)


@dataclass
class DataParallelRun:
    #: The recorder's workers by DP rank.
    ranks: dict[int, dict[str, Any]]
    #: The plugin's statistics records, every process.
    stats: list[dict[str, Any]]
    #: The synchronisation number of the step that paired the two, if any.
    paired_sync: int | None
    boundary_prompts_sent: int
    startup_s: float
    total_s: float


def boundary_prompt(attempt: int) -> list[int]:
    """``K+1`` token ids, different on every attempt."""
    return [100 + 7 * attempt + offset for offset in range(SPEC_TOKENS + 1)]


def is_boundary_prefill(step: dict[str, Any]) -> bool:
    return recorder.is_boundary_prefill(step, SPEC_TOKENS)


def is_genuine_decode(step: dict[str, Any]) -> bool:
    return recorder.is_genuine_decode(step, SPEC_TOKENS)


def steps_by_sync(worker: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {step["sync"]: step for step in worker["steps"] if step["sync"]}


def paired_syncs(ranks: dict[int, dict[str, Any]]) -> list[int]:
    """Synchronised steps where rank 0 prefills a ``K+1`` prompt and rank 1
    runs a pure speculative decode of the same width."""
    if set(ranks) != {0, 1}:
        return []
    prefills = steps_by_sync(ranks[0])
    decodes = steps_by_sync(ranks[1])
    return sorted(
        sync
        for sync, step in prefills.items()
        if is_boundary_prefill(step)
        and sync in decodes
        and is_genuine_decode(decodes[sync])
    )


def recorded_ranks(step_dir: Path) -> dict[int, dict[str, Any]]:
    return {
        worker["dp_rank"]: worker
        for worker in recorder.read_step_files(step_dir)
        if "dp_rank" in worker
    }


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def wait_until_steps_settle(step_dir: Path, quiet_s: float = 1.0) -> None:
    """Return once no rank has recorded a step for ``quiet_s``: a step still
    running at the stop would be counted by the plugin (at its dispatch) but
    never written by the recorder (at its end)."""
    deadline = time.monotonic() + DECODE_TIMEOUT_S
    recorded, since = -1, time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the ranks kept stepping after the load"
        now = sum(len(w["steps"]) for w in recorded_ranks(step_dir).values())
        if now != recorded:
            recorded, since = now, time.monotonic()
        time.sleep(0.1)


def server_env(workdir: Path, plugin: bool) -> dict[str, str]:
    stats_dir = str(workdir / "stats")
    overrides = {
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(workdir / "vllm")),
        STEP_DIR_ENV: str(workdir / "steps"),
        **dict.fromkeys(STATS_DIR_NAMES, stats_dir),
        # One core per DP rank (vLLM maps the lists as DP x PP x TP).
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    }
    if not plugin:
        overrides |= dict.fromkeys(DISABLE_NAMES, "all")
    return local.server_environment(overrides, drop=CALLER_ONLY)


def serve_data_parallel(
    model_dir: Path, workdir: Path, plugin: bool
) -> DataParallelRun:
    started = time.monotonic()
    with on_every_core():
        server = local.start_server(
            model_dir,
            env=server_env(workdir, plugin),
            log_path=workdir / "server.log",
            num_speculative_tokens=SPEC_TOKENS,
            extra_args=[
                "--data-parallel-size",
                "2",
                "--worker-extension-cls",
                WORKER_EXTENSION,
            ],
        )
    step_dir = workdir / "steps"
    try:
        try:
            server.wait_until_healthy(STARTUP_TIMEOUT_S)
        except local.ServerStartError as error:
            raise AssertionError(str(error)) from error
        startup_s = time.monotonic() - started
        paired, sent = drive_ranks(server, step_dir)
        wait_until_steps_settle(step_dir)
    finally:
        server.stop(signal.SIGTERM)
    assert not local.live_group_members(server.process.pid)
    return DataParallelRun(
        ranks=recorded_ranks(step_dir),
        stats=read_process_files(workdir / "stats"),
        paired_sync=paired,
        boundary_prompts_sent=sent,
        startup_s=startup_s,
        total_s=time.monotonic() - started,
    )


def drive_ranks(server: local.LocalServer, step_dir: Path) -> tuple[int | None, int]:
    """Decode long on rank 1; send ``K+1`` prompts to rank 0 until one is
    prefilled in a synchronised step where rank 1 decodes."""
    errors: list[BaseException] = []
    enough = threading.Event()

    def long_decode() -> None:
        # Streamed, so that closing it once the pair is found aborts the rest.
        try:
            with httpx.stream(
                "POST",
                f"{server.base_url}/v1/completions",
                json={
                    "model": server.model,
                    "prompt": LONG_DECODE_PROMPT,
                    "max_tokens": LONG_DECODE_TOKENS,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    "stream": True,
                },
                headers={"X-data-parallel-rank": "1"},
                timeout=DECODE_TIMEOUT_S,
            ) as response:
                response.raise_for_status()
                for _ in response.iter_lines():
                    if enough.is_set():
                        break
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def decode_steps() -> int:
        steps = recorded_ranks(step_dir).get(1, {}).get("steps", [])
        return sum(is_genuine_decode(step) for step in steps)

    def start_decoding() -> threading.Thread:
        before = decode_steps()
        thread = threading.Thread(target=long_decode, daemon=True)
        thread.start()
        wait_for(
            lambda: decode_steps() > before or errors,
            DECODE_TIMEOUT_S,
            "rank 1 to decode speculatively",
        )
        return thread

    decoder = start_decoding()
    try:
        paired: int | None = None
        sent = 0
        while paired is None and sent < MAX_BOUNDARY_PROMPTS and not errors:
            if not decoder.is_alive():
                # A loaded host can reach the end of the decode between two
                # prompts: rank 1 decodes again before the next one.
                decoder = start_decoding()
            complete(server, boundary_prompt(sent), 2, data_parallel_rank=0)
            sent += 1
            found = paired_syncs(recorded_ranks(step_dir))
            paired = found[0] if found else None
    finally:
        enough.set()
        decoder.join(DECODE_TIMEOUT_S)
    assert not errors, f"the long generation on rank 1 failed: {errors[0]!r}"
    return paired, sent


def dp_rank_of(record: dict[str, Any], records: list[dict[str, Any]]) -> int | None:
    """A statistics record's DP rank: its own, else its engine core parent's."""
    if record.get("dp_rank") is not None:
        return int(record["dp_rank"])
    parents = [r for r in records if r["pid"] == record["ppid"]]
    if parents and parents[0].get("dp_rank") is not None:
        return int(parents[0]["dp_rank"])
    return None


def worker_stats(run: DataParallelRun) -> dict[int, dict[str, Any]]:
    """The statistics record of the process that ran each rank's model."""
    by_pid = {record["pid"]: record for record in run.stats}
    return {rank: by_pid[worker["pid"]] for rank, worker in run.ranks.items()}


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("VLLM_GRAPHSAFE_CACHE") or tmp_path_factory.mktemp("models")
    return build_tiny_moe_model(cache, seed=0)


@pytest.fixture(scope="module")
def with_plugin(
    moe_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DataParallelRun]:
    run = serve_data_parallel(moe_model, tmp_path_factory.mktemp("dp-on"), True)
    print(
        f"DP=2 with the plugin: healthy {run.startup_s:.0f} s, {run.total_s:.0f} s, "
        f"{run.boundary_prompts_sent} K+1 prompts"
    )
    yield run


@pytest.fixture(scope="module")
def without_plugin(
    moe_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DataParallelRun]:
    run = serve_data_parallel(moe_model, tmp_path_factory.mktemp("dp-off"), False)
    print(
        f"DP=2 without the plugin: healthy {run.startup_s:.0f} s, {run.total_s:.0f} s, "
        f"{run.boundary_prompts_sent} K+1 prompts"
    )
    yield run


def what_rank_1_ran(ranks: dict[int, dict[str, Any]]) -> dict[int, Any]:
    """Rank 1's scheduled widths at each synchronised step where rank 0
    prefilled a ``K+1`` prompt (None: rank 1 recorded no step there)."""
    decodes = steps_by_sync(ranks.get(1, {"steps": []}))
    return {
        sync: decodes[sync]["widths"] if sync in decodes else None
        for sync, step in steps_by_sync(ranks.get(0, {"steps": []})).items()
        if is_boundary_prefill(step)
    }


def paired_steps(run: DataParallelRun) -> tuple[dict[str, Any], dict[str, Any]]:
    assert set(run.ranks) == {0, 1}, f"recorded DP ranks: {sorted(run.ranks)}"
    assert run.paired_sync is not None, (
        f"none of {run.boundary_prompts_sent} K+1 prompts on rank 0 shared a "
        "synchronised step with a speculative decode on rank 1; "
        f"rank 1 at rank 0's K+1 prefills: {what_rank_1_ran(run.ranks)}"
    )
    sync = run.paired_sync
    return steps_by_sync(run.ranks[0])[sync], steps_by_sync(run.ranks[1])[sync]


def test_both_ranks_load_and_apply_the_plugin(with_plugin: DataParallelRun) -> None:
    stats = worker_stats(with_plugin)
    assert set(stats) == {0, 1}
    for rank, record in stats.items():
        assert dp_rank_of(record, with_plugin.stats) == rank
        assert record["patches"][PATCH] == "applied"
        assert PATCH in record["wrapped"]


def test_synced_step_keeps_the_prefill_off_and_the_decode_on(
    with_plugin: DataParallelRun,
) -> None:
    prefill, decode = paired_steps(with_plugin)
    assert prefill["uniform_decode"] is False
    assert decode["uniform_decode"] is True
    for worker in with_plugin.ranks.values():
        assert not [
            step
            for step in worker["steps"]
            if step["holds_prefill_rows"] and step["uniform_decode"]
        ]


def test_without_the_plugin_both_ranks_call_the_synced_step_uniform(
    without_plugin: DataParallelRun,
) -> None:
    prefill, decode = paired_steps(without_plugin)
    assert prefill["uniform_decode"] is True
    assert decode["uniform_decode"] is True
    for record in without_plugin.stats:
        assert record["patches"][PATCH] == "disabled"
        assert record["wrapped"] == []
        assert record["counts"] == {}


def test_each_ranks_statistics_match_its_recorded_steps(
    with_plugin: DataParallelRun,
) -> None:
    for rank, record in worker_stats(with_plugin).items():
        steps = with_plugin.ranks[rank]["steps"]
        counts = record["counts"].get(PATCH, {})
        kept_off = sum(1 for step in steps if is_boundary_prefill(step))
        uniform = sum(1 for step in steps if step["uniform_decode"])
        assert counts.get("prefill_kept_off_decode_graph", 0) == kept_off, rank
        assert counts.get("uniform_decode", 0) == uniform, rank
    stats = worker_stats(with_plugin)
    assert stats[0]["counts"][PATCH]["prefill_kept_off_decode_graph"] >= 1
    assert stats[1]["counts"][PATCH]["uniform_decode"] >= 1
