"""Benchmarks 1 and 2, inside one vLLM release: run with that venv's python.

Plugin cost (benchmark 2)
    In this fresh interpreter, with vLLM imported the way a vLLM process has it
    when it loads its plugins (``vllm.engine.arg_utils``; ``--context bare``:
    ``import vllm`` alone), time ``import vllm_graphsafe.plugin; register()``.
    Whether the package's bytecode is cached is recorded (run.py stages a
    byte-compiled copy, as a wheel install leaves it).
    Then import the runner modules and time what the post-import wrapping adds
    to them: the patches' hooks, and wrapt's import finder, which sees every
    import once a hook is pending.

Classification cost (benchmark 1)
    Per-step cost of deciding "uniform decode?" for a uniform batch of
    ``num_reqs`` requests, every one past its prompt (the phase scans run to
    the end). Each rule is driven the way the runner runs it, on the
    release's own classes:

    ``v1.shape``  ``int(num_scheduled_tokens_np.max())`` plus
                  ``_determine_batch_execution_and_padding`` cut after its
                  first statement (``_is_uniform_decode``).
    ``v1.phase``  the same, with the patch's hook point (the shape rule
                  made phase-aware) installed on the runner class as the
                  registry installs it, over input-batch arrays of
                  ``TABLE_ROWS`` rows.
    ``mrv2.shape``  ``execute_model``'s classification lines: the ``max()``
                  over the scheduled dict and ``get_uniform_token_count``.
    ``mrv2.phase``  the same lines with ``execute_model`` and the count
                  bound to the patch's hook points as the registry binds
                  them, over request states of
                  ``TABLE_ROWS`` rows filled by the release's ``add_request``.
    ``mrv2.phase_stale``  as ``mrv2.phase`` with ``STALE_ROWS`` more live
                  requests mid-prefill that are not scheduled this step (the
                  scan's own worst case: each such row costs a lookup).
    ``mrv2.native``  releases that classify by phase (0.28+): the ``max()``
                  and ``gather_batch_req_state``, as ``execute_model`` runs them.

Writes JSON to ``--out``; vLLM logs to stdout, so nothing else goes there.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.timing import interleaved_samples

SIZES = (1, 8, 64, 256, 1024)
#: Rows of the V1 input batch and the MRV2 request-state table (max_num_seqs).
TABLE_ROWS = 1024
NUM_SPECULATIVE_TOKENS = 3
DECODE_QUERY_LEN = 1 + NUM_SPECULATIVE_TOKENS
STALE_ROWS = 64
SEED = 0

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner"

Step = Callable[[], Any]


# -- benchmark 2: plugin import and apply --------------------------------------


def import_vllm(context: str) -> float:
    """Import vLLM as a process has it when plugins load; seconds taken."""
    started = time.perf_counter()
    importlib.import_module("vllm")
    if context == "process":
        # vLLM loads general plugins from EngineArgs (API server), the engine
        # core and the workers: vllm.config and the engine args are in by then.
        importlib.import_module("vllm.engine.arg_utils")
    return time.perf_counter() - started


def time_register() -> dict[str, Any]:
    modules_before = set(sys.modules)
    started = time.perf_counter()
    plugin = importlib.import_module("vllm_graphsafe.plugin")
    plugin.register()
    elapsed = time.perf_counter() - started
    new_modules = set(sys.modules) - modules_before
    source = str(plugin.__file__)
    bytecode = Path(importlib.util.cache_from_source(source)).exists()
    return {
        "bytecode": "cached" if bytecode else "source",
        "package": str(Path(source).parent),
        "register_ms": elapsed * 1e3,
        "modules_imported": len(new_modules),
        "vllm_modules_imported": sorted(
            name for name in new_modules if name.split(".")[0] == "vllm"
        )[:40],
        "states": plugin.registry().states(),
    }


@contextmanager
def timed_import_machinery(totals: dict[str, float]) -> Iterator[None]:
    """Accumulate time spent in post-import hooks and in wrapt's import finder."""
    import wrapt.importer as importer

    hooks: dict[str, list[Any]] = getattr(importer, "_post_import_hooks", {})
    originals = {name: list(callbacks) for name, callbacks in hooks.items()}

    def timed_hook(callback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def hook(module: Any) -> Any:
            started = time.perf_counter()
            try:
                return callback(module)
            finally:
                totals["hooks_s"] += time.perf_counter() - started

        return hook

    for name, callbacks in originals.items():
        hooks[name] = [timed_hook(callback) for callback in callbacks]
    finders = [f for f in sys.meta_path if isinstance(f, importer.ImportHookFinder)]
    for finder in finders:
        original_find_spec = finder.find_spec

        def find_spec(*args: Any, _original: Any = original_find_spec) -> Any:
            started = time.perf_counter()
            spec = _original(*args)
            elapsed = time.perf_counter() - started
            if spec is None:
                # Not a hooked module: pure overhead on an ordinary import.
                totals["finder_s"] += elapsed
                totals["finder_calls"] += 1
            else:
                # A hooked module: includes the path search the import needs
                # anyway, done on the finder's behalf.
                totals["hooked_find_s"] += elapsed
            return spec

        finder.find_spec = find_spec  # type: ignore[method-assign]
    try:
        yield
    finally:
        for finder in finders:
            vars(finder).pop("find_spec", None)


def time_runner_imports() -> dict[str, Any]:
    """What the post-import wrapping adds to importing each runner module."""
    import wrapt.importer as importer

    pending = sorted(getattr(importer, "_post_import_hooks", {}))
    order = [m for m in (V1_RUNNER, MRV2_RUNNER) if m in pending or _exists(m)]
    order += [m for m in pending if m not in order]
    results: dict[str, Any] = {}
    for module in order:
        if module in sys.modules or not _exists(module):
            continue
        totals: dict[str, float] = defaultdict(float)
        with timed_import_machinery(totals):
            started = time.perf_counter()
            importlib.import_module(module)
            import_s = time.perf_counter() - started
        results[module] = {
            "import_s": import_s,
            "hooks_ms": totals["hooks_s"] * 1e3,
            "finder_ms": totals["finder_s"] * 1e3,
            "finder_calls": int(totals["finder_calls"]),
            "hooked_find_ms": totals["hooked_find_s"] * 1e3,
            "added_ms": (totals["hooks_s"] + totals["finder_s"]) * 1e3,
        }
    return results


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# -- benchmark 1: V1 runner -----------------------------------------------------


def _v1_classify_only(
    self: Any,
    num_tokens: int,
    num_reqs: int,
    num_scheduled_tokens_np: Any,
    max_num_scheduled_tokens: int,
    use_cascade_attn: bool = False,
    allow_microbatching: bool = True,
    force_eager: bool = False,
    force_uniform_decode: bool | None = None,
    force_has_lora: bool | None = None,
    force_num_active_loras: int | None = None,
    num_encoder_reqs: int = 0,
) -> bool:
    """``_determine_batch_execution_and_padding`` cut after its classification."""
    uniform_decode: bool = self._is_uniform_decode(
        max_num_scheduled_tokens=max_num_scheduled_tokens,
        uniform_decode_query_len=self.uniform_decode_query_len,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        force_uniform_decode=force_uniform_decode,
    )
    return uniform_decode


def _v1_runner(cls: type, num_computed: Any, num_prompt: Any) -> Any:
    runner: Any = object.__new__(cls)
    parallel = SimpleNamespace(
        pipeline_parallel_size=1, data_parallel_size=1, tensor_parallel_size=1
    )
    runner.__dict__.update(
        uniform_decode_query_len=DECODE_QUERY_LEN,
        input_batch=SimpleNamespace(
            num_computed_tokens_cpu=num_computed,
            num_prompt_tokens=num_prompt,
            lora_id_to_lora_request={},
        ),
        parallel_config=parallel,
        compilation_config=SimpleNamespace(
            pass_config=SimpleNamespace(enable_sp=False)
        ),
    )
    return runner


def v1_cases(sizes: tuple[int, ...]) -> dict[int, dict[str, Step]]:
    import numpy as np
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_graphsafe.patches.v1_phase_dispatch import V1PhaseDispatchPatch

    real = GPUModelRunner._determine_batch_execution_and_padding
    real = getattr(real, "__wrapped__", real)
    signature = inspect.signature(real)
    ours = inspect.signature(_v1_classify_only)
    if set(signature.parameters) != set(ours.parameters):
        raise RuntimeError(
            "this release's _determine_batch_execution_and_padding takes "
            f"{list(signature.parameters)}; update the benchmark's cut copy"
        )

    # Both runners run the cut copy over vLLM's own shape rule (the plugin may
    # have hooked GPUModelRunner's already: take the rule from under it); the
    # phase runner's class then gets the patch's hook point.
    shape_rule = inspect.getattr_static(GPUModelRunner, "_is_uniform_decode")
    shape_rule = getattr(shape_rule, "__func__", shape_rule)
    shape_rule = getattr(shape_rule, "__wrapped__", shape_rule)
    shape_cls = type("ShapeRuleRunner", (GPUModelRunner,), {})
    phase_cls = type("PhaseRuleRunner", (GPUModelRunner,), {})
    for cls in (shape_cls, phase_cls):
        cls._determine_batch_execution_and_padding = _v1_classify_only  # type: ignore[attr-defined]
        cls._is_uniform_decode = staticmethod(shape_rule)  # type: ignore[attr-defined]
    (shape_rule_hook,) = V1PhaseDispatchPatch().hook_points()
    shape_rule_hook.install(phase_cls)

    # The persistent batch keeps its per-row counts in CPU tensors and reads
    # them through .numpy(): every row past its prompt.
    generator = np.random.default_rng(SEED)
    prompt = generator.integers(4, 2048, TABLE_ROWS, dtype=np.int32)
    computed = prompt + generator.integers(0, 512, TABLE_ROWS, dtype=np.int32)
    num_prompt = torch.from_numpy(prompt).numpy()
    num_computed = torch.from_numpy(computed).numpy()
    shape_runner = _v1_runner(shape_cls, num_computed, num_prompt)
    phase_runner = _v1_runner(phase_cls, num_computed, num_prompt)

    cases: dict[int, dict[str, Step]] = {}
    for num_reqs in sizes:
        scheduled = np.full(num_reqs, DECODE_QUERY_LEN, dtype=np.int32)
        cases[num_reqs] = {
            "v1.shape": _v1_step(shape_runner, scheduled),
            "v1.phase": _v1_step(phase_runner, scheduled),
        }
        for name, case in cases[num_reqs].items():
            if case() is not True:
                raise RuntimeError(f"{name} did not classify a decode batch as decode")
    _check_v1_keeps_prefill_off(phase_runner, num_computed)
    return cases


def _v1_step(runner: Any, scheduled: Any) -> Step:
    """One step's classification, as ``execute_model`` calls it."""
    num_reqs = len(scheduled)

    def step() -> Any:
        max_num_scheduled_tokens = int(scheduled.max())
        return runner._determine_batch_execution_and_padding(
            num_tokens=num_reqs * DECODE_QUERY_LEN,
            num_reqs=num_reqs,
            num_scheduled_tokens_np=scheduled,
            max_num_scheduled_tokens=max_num_scheduled_tokens,
            use_cascade_attn=False,
            num_encoder_reqs=0,
        )

    return step


def _check_v1_keeps_prefill_off(runner: Any, num_computed: Any) -> None:
    """The harness exercises the real rule: one row in prefill flips the answer."""
    import numpy as np

    saved = int(num_computed[3])
    num_computed[3] = 0
    try:
        scheduled = np.full(8, DECODE_QUERY_LEN, dtype=np.int32)
        decided = runner._determine_batch_execution_and_padding(
            num_tokens=8 * DECODE_QUERY_LEN,
            num_reqs=8,
            num_scheduled_tokens_np=scheduled,
            max_num_scheduled_tokens=DECODE_QUERY_LEN,
            use_cascade_attn=False,
            num_encoder_reqs=0,
        )
    finally:
        num_computed[3] = saved
    if decided is not False:
        raise RuntimeError("v1.phase classified a batch with a prefill as decode")


# -- benchmark 1: Model Runner V2 ----------------------------------------------


def _uniform_token_count_027(
    num_reqs: int, num_tokens: int, max_query_len: int
) -> int | None:
    """``cudagraph_utils.get_uniform_token_count`` as vLLM 0.20-0.27 write it."""
    if (max_query_len == num_tokens // num_reqs) and (
        num_tokens == max_query_len * num_reqs
    ):
        return max_query_len
    return None


class _HostColumn:
    """A UVA-backed column on CPU: the runner reads and writes its ``.np``."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.np = np.zeros(size, dtype=np.int32)


class _StagedWrites:
    """A device column whose staged writes nothing here reads back."""

    def stage_write_elem(self, *_: Any) -> None:
        return None

    def stage_write(self, *_: Any) -> None:
        return None


def request_states(rows: int) -> Any:
    """The release's ``RequestState`` without a device, as the class tests build it."""
    import numpy as np
    import torch
    from vllm.v1.worker.gpu.states import RequestState

    state = object.__new__(RequestState)
    state.__dict__.update(
        max_num_reqs=rows,
        max_model_len=4096,
        num_speculative_steps=NUM_SPECULATIVE_TOKENS,
        req_id_to_index={},
        index_to_req_id={},
        free_indices=list(range(rows)),
        prompt_len=_HostColumn(rows),
        prefill_len=_HostColumn(rows),
        total_len=_StagedWrites(),
        all_token_ids=_StagedWrites(),
        num_computed_prefill_tokens=np.zeros(rows, dtype=np.int32),
        num_computed_tokens=_StagedWrites(),
        num_computed_tokens_np=np.zeros(rows, dtype=np.int32),
        max_seq_len=np.zeros(rows, dtype=np.int32),
        draft_tokens=torch.zeros(rows, NUM_SPECULATIVE_TOKENS, dtype=torch.int64),
    )
    return state


def _add_request(state: Any, req_id: str, prompt_len: int, computed: int) -> None:
    extra = (
        {"max_tokens": 256}
        if "max_tokens" in inspect.signature(state.add_request).parameters
        else {}
    )
    state.add_request(req_id, prompt_len, list(range(prompt_len)), computed, **extra)


def scheduler_output(req_ids: list[str]) -> SimpleNamespace:
    """A uniform speculative-decode step: every request schedules 1 + K tokens."""
    return SimpleNamespace(
        num_scheduled_tokens=dict.fromkeys(req_ids, DECODE_QUERY_LEN),
        total_num_scheduled_tokens=DECODE_QUERY_LEN * len(req_ids),
        scheduled_spec_decode_tokens={
            req_id: [7] * NUM_SPECULATIVE_TOKENS for req_id in req_ids
        },
        scheduled_encoder_inputs={},
    )


def _mrv2_runner(cls: type, state: Any) -> Any:
    runner: Any = object.__new__(cls)
    runner.__dict__.update(
        req_states=state,
        decode_query_len=DECODE_QUERY_LEN,
        num_speculative_steps=NUM_SPECULATIVE_TOKENS,
        use_pp=False,
        adaptive_verification=None,
        pcp_manager=None,
        lora_config=None,
    )
    return runner


def _classification_lines(count: Callable[[int, int, int], Any]) -> Callable[..., Any]:
    """``execute_model`` of 0.20-0.27 cut to its classification lines."""

    def execute_model(
        self: Any, scheduler_output: Any, *args: Any, **kwargs: Any
    ) -> Any:
        num_reqs = len(scheduler_output.num_scheduled_tokens)
        num_toks = scheduler_output.total_num_scheduled_tokens
        max_query_len = max(scheduler_output.num_scheduled_tokens.values())
        return count(num_reqs, num_toks, max_query_len)

    return execute_model


def _native_lines(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
    """``execute_model`` of 0.28+ cut to its classification lines."""
    num_toks = scheduler_output.total_num_scheduled_tokens
    max_query_len: int | None = max(scheduler_output.num_scheduled_tokens.values())
    batch_req_state, uniform_tok_count = self.gather_batch_req_state(
        scheduler_output, False
    )
    if batch_req_state is not None:
        num_toks = batch_req_state.num_tokens
        if batch_req_state.has_prefill:
            max_query_len = None
    del num_toks, max_query_len
    return uniform_tok_count


def mrv2_cases(sizes: tuple[int, ...]) -> dict[int, dict[str, Step]]:
    import numpy as np
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from vllm_graphsafe.patches.mrv2_phase_dispatch import (
        RUNNER_MODULE,
        MRV2PhaseDispatchPatch,
    )

    hooks = {
        hook.qualname: hook
        for hook in MRV2PhaseDispatchPatch().hook_points()
        if hook.module == RUNNER_MODULE
    }
    step_hook = hooks["GPUModelRunner.execute_model"]
    count_hook = hooks["get_uniform_token_count"]

    real_execute = GPUModelRunner.execute_model
    real_execute = getattr(real_execute, "__wrapped__", real_execute)
    execute_signature = inspect.signature(real_execute)
    shape_count = getattr(
        cudagraph_utils, "get_uniform_token_count", _uniform_token_count_027
    )
    counts = SimpleNamespace(get_uniform_token_count=shape_count)
    count_hook.install(counts)
    phase_count = counts.get_uniform_token_count
    shape_execute = _classification_lines(shape_count)
    phase_execute = _classification_lines(phase_count)
    for function in (shape_execute, phase_execute):
        function.__signature__ = execute_signature  # type: ignore[attr-defined]
    shape_cls = type("ShapeRuleRunnerV2", (GPUModelRunner,), {})
    phase_cls = type("PhaseRuleRunnerV2", (GPUModelRunner,), {})
    native_cls = type("NativeRunnerV2", (GPUModelRunner,), {})
    shape_cls.execute_model = shape_execute  # type: ignore[attr-defined]
    phase_cls.execute_model = phase_execute  # type: ignore[attr-defined]
    native_cls.execute_model = _native_lines  # type: ignore[attr-defined]
    step_hook.install(phase_cls)
    has_native = hasattr(GPUModelRunner, "gather_batch_req_state")

    generator = np.random.default_rng(SEED)
    cases: dict[int, dict[str, Step]] = {}
    for num_reqs in sizes:
        state = request_states(TABLE_ROWS)
        stale_state = (
            request_states(TABLE_ROWS) if num_reqs + STALE_ROWS <= TABLE_ROWS else None
        )
        req_ids = [f"cmpl-{index:08x}-0" for index in range(num_reqs)]
        for req_id in req_ids:
            prompt_len = int(generator.integers(4, 2048))
            computed = prompt_len + int(generator.integers(0, 512))
            _add_request(state, req_id, prompt_len, prompt_len)
            state.num_computed_tokens_np[state.req_id_to_index[req_id]] = computed
            if stale_state is not None:
                _add_request(stale_state, req_id, prompt_len, prompt_len)
        if stale_state is not None:
            for index in range(STALE_ROWS):
                _add_request(stale_state, f"waiting-{index}", 512, 128)
        output = scheduler_output(req_ids)
        step_cases: dict[str, Step] = {
            "mrv2.shape": _mrv2_step(_mrv2_runner(shape_cls, state), output),
            "mrv2.phase": _mrv2_step(_mrv2_runner(phase_cls, state), output),
        }
        if stale_state is not None:
            stale_runner = _mrv2_runner(phase_cls, stale_state)
            step_cases["mrv2.phase_stale"] = _mrv2_step(stale_runner, output)
        if has_native:
            native_runner = _mrv2_runner(native_cls, state)
            step_cases["mrv2.native"] = _mrv2_step(native_runner, output)
        for name, case in step_cases.items():
            if case() != DECODE_QUERY_LEN:
                raise RuntimeError(f"{name} did not classify a decode batch as decode")
        cases[num_reqs] = step_cases
    _check_mrv2_keeps_prefill_off(shape_cls, phase_cls, native_cls, has_native)
    return cases


def _mrv2_step(runner: Any, output: Any) -> Step:
    """One step's classification, as the worker calls ``execute_model``."""

    def step() -> Any:
        return runner.execute_model(output, None)

    return step


def _check_mrv2_keeps_prefill_off(
    shape_cls: type, phase_cls: type, native_cls: type, has_native: bool
) -> None:
    """One 4-token prompt among decodes: the shape says decode, the phase rules not."""
    state = request_states(64)
    req_ids = [f"req-{index}" for index in range(8)]
    for req_id in req_ids[:-1]:
        _add_request(state, req_id, 100, 100)
    _add_request(state, req_ids[-1], DECODE_QUERY_LEN, 0)
    output = scheduler_output(req_ids)
    if _mrv2_runner(shape_cls, state).execute_model(output, None) != DECODE_QUERY_LEN:
        raise RuntimeError("mrv2.shape is not the shape-only rule")
    runners = [phase_cls] + ([native_cls] if has_native else [])
    for cls in runners:
        if _mrv2_runner(cls, state).execute_model(output, None) is not None:
            raise RuntimeError(f"{cls.__name__} classified a prefill as decode")


# -- driver ---------------------------------------------------------------------


def measure_dispatch(
    sizes: tuple[int, ...], rounds: int, target_s: float
) -> dict[str, Any]:
    cases: dict[int, dict[str, Step]] = defaultdict(dict)
    skipped: dict[str, str] = {}
    for family, build in (("v1", v1_cases), ("mrv2", mrv2_cases)):
        try:
            built = build(sizes)
        except ImportError as error:
            skipped[family] = f"{type(error).__name__}: {error}"
            continue
        for num_reqs, step_cases in built.items():
            cases[num_reqs].update(step_cases)
    # One round times every case at every size, so a noisy spell of the host
    # lands on all of them rather than on one batch size.
    flat = {
        f"{name}@{num_reqs}": step
        for num_reqs in sizes
        for name, step in cases[num_reqs].items()
    }
    samples: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for key, values in interleaved_samples(flat, rounds, target_s).items():
        name, size = key.split("@")
        samples[name][size] = values
    return {
        "sizes": list(sizes),
        "rounds": rounds,
        "target_ms": target_s * 1e3,
        "table_rows": TABLE_ROWS,
        "decode_query_len": DECODE_QUERY_LEN,
        "stale_rows": STALE_ROWS,
        "seconds_per_call": samples,
        "skipped": skipped,
    }


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--context", choices=("process", "bare"), default="process")
    parser.add_argument(
        "--plugin-only", action="store_true", help="benchmark 2 only (a fresh repeat)"
    )
    parser.add_argument("--rounds", type=int, default=61)
    parser.add_argument("--target-ms", type=float, default=4.0)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"python": platform.python_version()}
    result["vllm_import_s"] = import_vllm(args.context)
    result["vllm"] = vllm_version()
    result["plugin"] = {"context": args.context, **time_register()}
    result["runner_imports"] = time_runner_imports()
    if not args.plugin_only:
        sizes = tuple(int(size) for size in args.sizes.split(","))
        result["dispatch"] = measure_dispatch(sizes, args.rounds, args.target_ms / 1e3)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
