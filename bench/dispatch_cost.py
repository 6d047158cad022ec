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
    Per-step cost of deciding "uniform decode?" for a uniform speculative-decode
    batch of ``num_reqs`` requests. Each rule is driven the way the runner runs
    it, on the release's own classes, with the request state built by the
    class tests' own fakes (``tests.support.vllm_fakes``); the phase rules are what
    the patches' hook factories make of vLLM's own rule.

    ``v1.shape``  ``int(num_scheduled_tokens_np.max())`` plus
                  ``_determine_batch_execution_and_padding`` cut after its
                  first statement (``_is_uniform_decode``), vLLM's shape rule.
    ``v1.phase``  the same over the patch's phase-aware rule
                  (``bind_phase_aware_shape_rule``), every scheduled row past
                  its prompt, in an input batch of ``TABLE_ROWS`` rows.
    ``v1.phase_prefill``  as ``v1.phase`` with the last scheduled row a
                  prompt chunk of 1 + K tokens (the answer flips to "not
                  decode"); the scan is one vectorised comparison of the
                  scheduled rows whatever they hold, so this is its worst case.
    ``mrv2.shape``  ``execute_model``'s classification lines: the ``max()``
                  over the scheduled dict and ``get_uniform_token_count``.
    ``mrv2.phase``  the same lines published by the patch's step hook
                  (``bind_target_step``) and counted by its count hook
                  (``bind_target_count``), over request states of
                  ``TABLE_ROWS`` rows filled by the release's ``add_request``
                  and brought up to date for the step by its
                  ``update_requests`` (as ``execute_model`` does before it
                  classifies), no row in prefill: the typical decode step.
    ``mrv2.phase_stale``  as ``mrv2.phase`` with ``STALE_ROWS`` more live
                  requests mid-prefill that are not scheduled this step (the
                  scan's worst case: each such row costs a lookup); the table
                  grows to ``num_reqs + STALE_ROWS`` rows where it must.
    ``mrv2.native``  releases that classify by phase (0.28+), where the patch
                  stays inert: the ``max()`` and ``gather_batch_req_state``,
                  as ``execute_model`` runs them.
    ``replay_*``  the replay guard beside the replay it guards, per replayed
                  decode step (:mod:`bench.replay_guard_cost`), at the largest
                  size only.

The patches count their decisions as in a served process: into the counts
page of two directories (the metrics directory and a statistics directory, on
one file system, so one page linked into both), with the record writer thread
running.

Writes JSON to ``--out``; vLLM logs to stdout, so nothing else goes there.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import platform
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make bench and tests importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import replay_guard_cost
from bench.plugin_cost import import_vllm, time_register, time_runner_imports
from bench.timing import interleaved_samples
from vllm_graphsafe import vllm_layout

SIZES = (1, 8, 64, 256, 1024)
#: Rows of the V1 input batch and the MRV2 request-state table (max_num_seqs).
TABLE_ROWS = 1024
NUM_SPECULATIVE_TOKENS = 3
DECODE_QUERY_LEN = 1 + NUM_SPECULATIVE_TOKENS
STALE_ROWS = 64
SEED = 0

Step = Callable[[], Any]


# -- shared fakes of vLLM's state -----------------------------------------------


@contextmanager
def table_rows(module: Any, constant: str, rows: int) -> Iterator[None]:
    """Build the class tests' fakes with ``rows`` table rows instead of theirs."""
    saved = getattr(module, constant)
    setattr(module, constant, rows)
    try:
        yield
    finally:
        setattr(module, constant, saved)


def unwrapped(function: Any) -> Any:
    """vLLM's own function under a hook the plugin may have installed already."""
    function = getattr(function, "__func__", function)
    return inspect.unwrap(function)


def fail_loudly(error: BaseException, reading: str) -> None:
    """The hooks' ``on_failure``: a hook that fails here fails the benchmark."""
    raise RuntimeError(f"the patch's hook failed reading {reading}") from error


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


@dataclass(frozen=True)
class V1Runners:
    """The V1 runners the cases time: both run the cut copy of the dispatch,
    one over vLLM's own shape rule, the other over what the patch's hook
    factory makes of that rule; ``decodes`` are their persistent batch's rows,
    every one past its prompt."""

    shape: Any
    phase: Any
    decodes: list[Any]
    #: A runner of the phase rule over other rows.
    phase_over: Callable[[list[Any]], Any]


def v1_runners() -> V1Runners:
    import numpy as np

    GPUModelRunner = vllm_layout.load(vllm_layout.V1_RUNNER).GPUModelRunner

    from tests.support.vllm_fakes import v1_runner
    from tests.support.vllm_fakes.v1_runner import DispatchRecord, Row
    from vllm_graphsafe.fixes.v1_phase_dispatch.hooks import (
        bind_phase_aware_shape_rule,
    )

    real = unwrapped(GPUModelRunner._determine_batch_execution_and_padding)
    signature = inspect.signature(real)
    ours = inspect.signature(_v1_classify_only)
    if set(signature.parameters) != set(ours.parameters):
        raise RuntimeError(
            "this release's _determine_batch_execution_and_padding takes "
            f"{list(signature.parameters)}; update the benchmark's cut copy"
        )

    # On the class, the rule is vLLM's static one whether or not the plugin
    # installed its own over it.
    shape_rule = GPUModelRunner._is_uniform_decode
    classify = {"_determine_batch_execution_and_padding": _v1_classify_only}
    shape_cls = type(
        "ShapeRuleRunner",
        (GPUModelRunner,),
        {**classify, "_is_uniform_decode": staticmethod(shape_rule)},
    )
    phase_cls = type(
        "PhaseRuleRunner",
        (GPUModelRunner,),
        {
            **classify,
            "_is_uniform_decode": bind_phase_aware_shape_rule(shape_rule, fail_loudly),
        },
    )

    def runner(cls: type, rows: list[Any]) -> Any:
        with table_rows(v1_runner, "MAX_ROWS", TABLE_ROWS):
            batch = v1_runner.input_batch(rows)
            drafts = v1_runner.decode_draft_buffer(rows)
        made = v1_runner.make_runner(
            DECODE_QUERY_LEN, batch, DispatchRecord(), draft_counts=drafts
        )
        made.__class__ = cls
        return made

    generator = np.random.default_rng(SEED)
    decodes = [
        Row(
            prompt=prompt,
            computed=prompt + extra,
            scheduled=DECODE_QUERY_LEN,
            drafts=DECODE_QUERY_LEN - 1,
        )
        for prompt, extra in zip(
            generator.integers(4, 2048, TABLE_ROWS).tolist(),
            generator.integers(0, 512, TABLE_ROWS).tolist(),
            strict=True,
        )
    ]
    return V1Runners(
        shape=runner(shape_cls, decodes),
        phase=runner(phase_cls, decodes),
        decodes=decodes,
        phase_over=functools.partial(runner, phase_cls),
    )


def v1_cases(sizes: tuple[int, ...]) -> dict[int, dict[str, Step]]:
    import numpy as np

    from tests.support.vllm_fakes.v1_runner import Row

    runners = v1_runners()
    decodes, shape_runner, phase_runner = runners.decodes, runners.shape, runners.phase
    cases: dict[int, dict[str, Step]] = {}
    for num_reqs in sizes:
        # The last scheduled row is a prompt chunk of 1 + K tokens.
        with_prefill = list(decodes)
        with_prefill[num_reqs - 1] = Row(
            prompt=DECODE_QUERY_LEN, computed=0, scheduled=DECODE_QUERY_LEN
        )
        scheduled = np.full(num_reqs, DECODE_QUERY_LEN, dtype=np.int32)
        cases[num_reqs] = {
            "v1.shape": _v1_step(shape_runner, scheduled),
            "v1.phase": _v1_step(phase_runner, scheduled),
            "v1.phase_prefill": _v1_step(runners.phase_over(with_prefill), scheduled),
        }
        expected = {"v1.shape": True, "v1.phase": True, "v1.phase_prefill": False}
        for name, case in cases[num_reqs].items():
            if case() is not expected[name]:
                raise RuntimeError(f"{name} did not answer {expected[name]}")
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


def mrv2_step(reqs: dict[str, Any], rows: int) -> Any:
    """The class tests' MRV2 step over a request-state table of ``rows`` rows,
    its request states updated for the step as ``execute_model`` does first.

    Their fake records reads of the phase columns through a Python-level
    ``__getattribute__`` that vLLM's own ``RequestState`` does not have: the
    table is handed back to the release's class so that no timing includes it.
    """
    RequestState = vllm_layout.load(vllm_layout.MRV2_STATES).RequestState

    from tests.support.vllm_fakes import mrv2_state

    with table_rows(mrv2_state, "MAX_REQS", rows):
        step = mrv2_state.make_step(reqs, DECODE_QUERY_LEN)
        # execute_model brings the request states up to date before its
        # classification lines (the release's own update_requests): a decoding
        # row's computed prefill is then its prefill length.
        step.run_state_update()
    step.runner.req_states.__class__ = RequestState
    return step


def mrv2_cases(sizes: tuple[int, ...]) -> dict[int, dict[str, Step]]:
    import numpy as np

    cudagraph_utils = vllm_layout.load(vllm_layout.MRV2_CUDAGRAPH_UTILS)
    GPUModelRunner = vllm_layout.load(vllm_layout.MRV2_RUNNER).GPUModelRunner

    from tests.support.vllm_fakes.mrv2_state import Req
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.hooks import (
        bind_target_count,
        bind_target_step,
    )

    has_native = hasattr(GPUModelRunner, "gather_batch_req_state")
    execute_signature = inspect.signature(GPUModelRunner.execute_model)
    shape_count = getattr(
        cudagraph_utils, "get_uniform_token_count", _uniform_token_count_027
    )
    shape_execute = _classification_lines(shape_count)
    phase_execute = _classification_lines(bind_target_count(shape_count, fail_loudly))
    for function in (shape_execute, phase_execute):
        # The hook declares the method's own parameters, read by inspect.signature.
        function.__signature__ = execute_signature  # type: ignore[attr-defined]
    shape_cls = type(
        "ShapeRuleRunnerV2", (GPUModelRunner,), {"execute_model": shape_execute}
    )
    phase_cls = type(
        "PhaseRuleRunnerV2",
        (GPUModelRunner,),
        {"execute_model": bind_target_step(phase_execute, fail_loudly)},
    )
    native_cls = type(
        "NativeRunnerV2", (GPUModelRunner,), {"execute_model": _native_lines}
    )

    def case(cls: type, step: Any) -> Step:
        runner = step.runner
        runner.__class__ = cls
        output = step.scheduler_output

        def run() -> Any:
            return runner.execute_model(output, None)

        return run

    generator = np.random.default_rng(SEED)
    cases: dict[int, dict[str, Step]] = {}
    for num_reqs in sizes:
        decodes = {}
        for index in range(num_reqs):
            prompt = int(generator.integers(4, 2048))
            decodes[f"cmpl-{index:08x}-0"] = Req(
                prefill_len=prompt,
                computed=prompt + int(generator.integers(0, 512)),
                scheduled=DECODE_QUERY_LEN,
                drafts=NUM_SPECULATIVE_TOKENS,
            )
        # Live requests mid-prefill that this step leaves out: each costs the
        # phase scan a lookup, its worst case.
        stale = {
            f"waiting-{index}": Req(prefill_len=512, computed=128, scheduled=0)
            for index in range(STALE_ROWS)
        }
        step_cases: dict[str, Step] = {
            "mrv2.shape": case(shape_cls, mrv2_step(decodes, TABLE_ROWS)),
        }
        if has_native:
            step_cases["mrv2.native"] = case(native_cls, mrv2_step(decodes, TABLE_ROWS))
        else:
            step_cases["mrv2.phase"] = case(phase_cls, mrv2_step(decodes, TABLE_ROWS))
            step_cases["mrv2.phase_stale"] = case(
                phase_cls,
                mrv2_step({**decodes, **stale}, max(TABLE_ROWS, num_reqs + STALE_ROWS)),
            )
        for name, run in step_cases.items():
            if run() != DECODE_QUERY_LEN:
                raise RuntimeError(f"{name} did not classify a decode batch as decode")
        cases[num_reqs] = step_cases
    _check_mrv2_keeps_prefill_off(shape_cls, phase_cls, native_cls, has_native)
    return cases


def _check_mrv2_keeps_prefill_off(
    shape_cls: type, phase_cls: type, native_cls: type, has_native: bool
) -> None:
    """One 4-token prompt among decodes: the shape says decode, the phase rules not."""
    from tests.support.vllm_fakes.mrv2_state import Req

    reqs = {
        f"req-{index}": Req(100, 100, DECODE_QUERY_LEN, drafts=NUM_SPECULATIVE_TOKENS)
        for index in range(7)
    }
    reqs["prompt"] = Req(DECODE_QUERY_LEN, 0, DECODE_QUERY_LEN)
    expected = {
        shape_cls: DECODE_QUERY_LEN,
        native_cls if has_native else phase_cls: None,
    }
    for cls, count in expected.items():
        step = mrv2_step(reqs, 64)
        step.runner.__class__ = cls
        if step.runner.execute_model(step.scheduler_output, None) != count:
            raise RuntimeError(f"{cls.__name__} did not count {count} for a prefill")


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
    replay_reads: dict[str, Any] = {}
    for family, replay_cases in (
        ("replay_v1", replay_guard_cost.v1_cases),
        ("replay_mrv2", replay_guard_cost.mrv2_cases),
    ):
        # The replay guard's cost does not depend on the batch size: timed at one.
        try:
            cases[sizes[-1]].update(replay_cases(unwrapped, fail_loudly))
        except (ImportError, AttributeError) as error:
            skipped[family] = f"{type(error).__name__}: {error}"
    if not all(family in skipped for family in ("replay_v1", "replay_mrv2")):
        replay_reads = replay_guard_cost.reads_per_replay(fail_loudly)
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
        "replay_reads": replay_reads,
    }


@contextmanager
def counting_as_a_server_does() -> Iterator[dict[str, int]]:
    """The patches count into counts pages, as in a served process: the metrics
    directory every server has and a ``GRAPHSAFE_STATS_DIR`` (both under the
    temporary directory, one file system: the page is linked into both), with
    the record writer running. Yields how many directories and pages."""
    import tempfile

    from vllm_graphsafe import counts

    with (
        tempfile.TemporaryDirectory(prefix="graphsafe-bench-metrics-") as metrics,
        tempfile.TemporaryDirectory(prefix="graphsafe-bench-stats-") as stats_dir,
    ):
        counts.STATS.configure(metrics, stats_dir)
        try:
            yield {
                "counts_directories": len(counts.STATS.directories),
                "counts_pages": counts.STATS.distinct_pages,
            }
        finally:
            # The record writer thread runs on: it must not write into the
            # directories while they are being removed.
            counts.STATS.stop_writing(metrics, stats_dir)


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
        with counting_as_a_server_does() as pages:
            dispatch = measure_dispatch(sizes, args.rounds, args.target_ms / 1e3)
        result["dispatch"] = {**dispatch, **pages}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
