"""The plugin loads through its entry point in every vLLM process, and can be kept out.

Every process that loads the plugin writes a record into the statistics
directory; the records say which process it was, the patch states there,
and which patches have their wrappers in place.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.engine.serving import running_server
from vllm_graphsafe.counts import read_process_files

V1_PATCHES = {"v1-phase-dispatch", "v1-dummy-staging"}


def serve_once(
    model_dir: Path,
    workdir: Path,
    env: dict[str, str],
    extra_args: Sequence[str] = (),
) -> tuple[int, list[dict[str, Any]]]:
    stats_dir = workdir / "stats"
    env = {**env, "GRAPHSAFE_STATS_DIR": str(stats_dir)}
    with running_server(model_dir, workdir, env=env, extra_args=extra_args) as server:
        answer = server.complete([5, 6, 7, 8], max_tokens=8)
        assert answer["choices"][0]["text"] is not None
        time.sleep(1.5)
        api_server_pid = server.process.pid
    return api_server_pid, read_process_files(stats_dir) if stats_dir.exists() else []


def test_plugin_runs_in_api_server_engine_core_and_worker(
    tiny_model: Path, tmp_path: Path
) -> None:
    api_pid, records = serve_once(
        tiny_model, tmp_path, {}, ["--distributed-executor-backend", "mp"]
    )
    by_pid = {record["pid"]: record for record in records}
    assert api_pid in by_pid, "the API server process did not load the plugin"
    assert by_pid[api_pid]["role"] == "api_server"
    engine_cores = [r for r in records if r["role"] == "engine_core"]
    workers = [r for r in records if r["role"] == "worker"]
    assert engine_cores, "no engine core process loaded the plugin"
    assert workers, "no worker process loaded the plugin"
    assert workers[0]["ppid"] == engine_cores[0]["pid"]

    for record in records:
        assert set(record["patches"].values()) <= {"applied", "native"}
    assert set(workers[0]["wrapped"]) >= V1_PATCHES
    assert workers[0]["counts"]["v1-phase-dispatch"], "the worker dispatched nothing"
    # The API server never imports the runner, so no runner hook is bound there;
    # it does import the module of vLLM's CUDA graph wrapper, where the replay
    # guard binds without ever being called.
    assert set(by_pid[api_pid]["wrapped"]) <= {"replay-guard"}


def test_vllm_plugins_filter_keeps_it_out(tiny_model: Path, tmp_path: Path) -> None:
    _, records = serve_once(tiny_model, tmp_path, {"VLLM_PLUGINS": "no_such_plugin"})
    assert records == []


def test_disable_switch_keeps_it_out(tiny_model: Path, tmp_path: Path) -> None:
    _, records = serve_once(tiny_model, tmp_path, {"GRAPHSAFE_DISABLE": "all"})
    assert len(records) >= 2, "expected the API server and engine core records"
    for record in records:
        # A fix this vLLM has natively stays native; every other patch is off.
        assert set(record["patches"].values()) <= {"disabled", "native"}
        assert "disabled" in record["patches"].values()
        assert record["wrapped"] == []
        assert record["counts"] == {}
