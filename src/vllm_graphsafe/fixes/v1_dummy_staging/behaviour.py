"""Is the V1 dummy metadata consistent? Run ``_dummy_run`` up to the metadata.

The cases are vllm-project/vllm#54604's: profiling lengths 1, 4 and 4096 over
four scheduled tokens, padded batches, a ragged uniform-decode capture. The
buffers are torch tensors, as vLLM's are: without torch the cases cannot run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from vllm_graphsafe.behaviour.compiled import compiled_runner
from vllm_graphsafe.behaviour.fakes import Fake, descriptor, member
from vllm_graphsafe.behaviour.judgement import (
    CannotRun,
    Case,
    Evidence,
    Expect,
    Outcome,
    judge_cases,
)
from vllm_graphsafe.behaviour.live import live_runner
from vllm_graphsafe.judging import imported_class
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.vllm_layout import V1_RUNNER, V1_RUNNER_CLASS

DUMMY_RUN = "_dummy_run"
BUILD_METADATA = "_build_attention_metadata"
MAX_TOKENS = 64
STALE_POSITION = 777
STALE_COMPUTED = 555


class DummyRun(NamedTuple):
    num_tokens: int
    max_num_seqs: int
    decode_query_len: int = 1
    pad_reqs_to: int | None = None
    pad_tokens_to: int | None = None
    #: ``_dummy_run``'s keyword arguments.
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def num_reqs(self) -> int:
        """The requests vLLM's dummy run makes of ``num_tokens``."""
        if dict(self.options).get("uniform_decode"):
            q = self.decode_query_len
            return min(-(-self.num_tokens // q), self.max_num_seqs)
        return min(self.num_tokens, self.max_num_seqs)


def cases() -> list[Case[DummyRun]]:
    attention = ("force_attention", True)
    runs = {
        f"a dummy run of 4 tokens profiling length {length}": DummyRun(
            4, 1, options=(attention, ("profile_seq_lens", length))
        )
        for length in (1, 4, 4096)
    }
    for tokens in (3, 8):
        runs[f"a padded dummy run of {tokens} tokens"] = DummyRun(
            tokens,
            4,
            pad_reqs_to=min(tokens, 4) + 2,
            pad_tokens_to=tokens + 5,
            options=(attention, ("profile_seq_lens", 64)),
        )
    uniform = (("uniform_decode", True), ("profile_seq_lens", 300))
    runs["a uniform-decode capture of 11 tokens (K=3)"] = DummyRun(
        11, 8, decode_query_len=4, options=uniform
    )
    return [Case(name, Expect.HOLDS, run) for name, run in runs.items()]


class StopDummyRun(Exception):
    def __init__(self, snapshot: dict[str, np.ndarray | int]) -> None:
        super().__init__("reached the attention metadata")
        self.snapshot = snapshot


class HostDeviceBuffer:
    """vLLM's ``CpuGpuBuffer`` on a CPU: ``cpu``/``np`` and a ``gpu`` copy."""

    def __init__(self, torch: Any, size: int) -> None:
        self.cpu = torch.zeros(size, dtype=torch.int64)
        self.gpu = torch.zeros(size, dtype=torch.int64)
        self.np = self.cpu.numpy()

    def copy_to_gpu(self, n: int | None = None) -> Any:
        self.gpu[:n].copy_(self.cpu[:n])
        return self.gpu[:n]


def runner_state(run: DummyRun, modes: Any, descriptor_type: Any) -> dict[str, Any]:
    try:
        import torch
    except ImportError as error:
        raise CannotRun(
            "torch is not installed here (vLLM's buffers are tensors)"
        ) from error
    rows = run.max_num_seqs + 4
    computed = np.full(rows, STALE_COMPUTED, dtype=np.int32)
    seq_lens = torch.zeros(rows, dtype=torch.int32)
    positions = torch.full((MAX_TOKENS,), STALE_POSITION, dtype=torch.int64)
    optimistic = torch.randint(1, 50, (rows,), dtype=torch.int32)
    query_start_loc = HostDeviceBuffer(torch, rows + 1)
    batch = Fake(
        "InputBatch",
        num_computed_tokens_cpu=computed,
        block_table=Fake("MultiGroupBlockTable", block_tables=[]),
    )

    def determine(*args: Any, **kwargs: Any) -> Any:
        num_reqs = kwargs.get("num_reqs", args[1] if len(args) > 1 else 1)
        num_tokens = kwargs.get("num_tokens", args[0] if args else run.num_tokens)
        made = descriptor(
            descriptor_type,
            num_tokens=run.pad_tokens_to or num_tokens,
            num_reqs=run.pad_reqs_to or num_reqs,
        )
        return member(modes, "FULL"), made, False, None, None

    def build(*args: Any, **kwargs: Any) -> Any:
        raise StopDummyRun(
            {
                "seq_lens_cpu": optimistic.numpy().copy(),
                "seq_lens_device": seq_lens.numpy().copy(),
                "positions": positions.numpy().copy(),
                "num_computed": np.array(batch.num_computed_tokens_cpu),
                "query_start_loc": query_start_loc.np.copy(),
            }
        )

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise CannotRun("the dummy run went on without building attention metadata")

    parallel = Fake("ParallelConfig", cp_kv_cache_interleave_size=4, num_ubatches=2)
    return dict(
        vllm_config=Fake(
            "VllmConfig",
            model_config=Fake("ModelConfig", multimodal_config=None),
            parallel_config=parallel,
        ),
        parallel_config=parallel,
        scheduler_config=Fake("SchedulerConfig", max_num_seqs=run.max_num_seqs),
        uniform_decode_query_len=run.decode_query_len,
        max_num_tokens=MAX_TOKENS,
        speculative_config=None,
        lora_config=None,
        dcp_world_size=1,
        pcp_world_size=1,
        prepare_inputs_event=None,
        arange_np=np.arange(MAX_TOKENS * 2, dtype=np.int64),
        optimistic_seq_lens_cpu=optimistic,
        seq_lens=seq_lens,
        positions=positions,
        query_pos=HostDeviceBuffer(torch, MAX_TOKENS),
        query_start_loc=query_start_loc,
        input_batch=batch,
        _determine_batch_execution_and_padding=determine,
        _get_slot_mappings=lambda *a, **k: (None, None),
        synchronize_input_prep=lambda *a, **k: contextlib.nullcontext(),
        _sm70_async_staged_input_prep_active=False,
        maybe_dummy_run_with_lora=stop,
        **{BUILD_METADATA: build},
    )


def _arrays_agree(snapshot: dict[str, Any], run: DummyRun) -> str | None:
    """The first invariant the staged buffers break, in words (None: all hold):
    each request's ``seq_len == computed + scheduled`` and ``computed >= 0``;
    each token's ``position == computed[its request] + its query position``;
    the CPU and device sequence lengths agree; padded request rows hold zero
    lengths, padded tokens position zero."""
    num_reqs = run.num_reqs
    padded_reqs = (run.pad_reqs_to or num_reqs) - num_reqs
    padded_tokens = (run.pad_tokens_to or run.num_tokens) - run.num_tokens
    start = snapshot["query_start_loc"]
    scheduled = np.diff(start[: num_reqs + 1]).astype(np.int64)
    seq_lens = snapshot["seq_lens_cpu"][:num_reqs].astype(np.int64)
    computed = snapshot["num_computed"][:num_reqs].astype(np.int64)
    if (computed < 0).any():
        return f"staged a negative computed length ({computed.tolist()})"
    if not (seq_lens == computed + scheduled).all():
        return (
            f"staged seq_len {seq_lens.tolist()}, not computed {computed.tolist()} "
            f"+ scheduled {scheduled.tolist()}"
        )
    owner = np.repeat(np.arange(num_reqs), scheduled)
    query_pos: Any = (
        np.concatenate([np.arange(n) for n in scheduled]) if num_reqs else []
    )
    total = int(scheduled.sum())
    expected = computed[owner] + query_pos
    if not (snapshot["positions"][:total] == expected).all():
        return (
            f"staged positions {snapshot['positions'][:total].tolist()}, not "
            f"computed + query position {expected.tolist()}"
        )
    if (snapshot["positions"][total : total + padded_tokens] != 0).any():
        return "left stale positions in padded tokens"
    if not (snapshot["seq_lens_cpu"] == snapshot["seq_lens_device"]).all():
        return "staged CPU and device sequence lengths that differ"
    padded = slice(num_reqs, num_reqs + padded_reqs)
    if (snapshot["num_computed"][padded] != 0).any() or (
        snapshot["seq_lens_cpu"][padded] != 0
    ).any():
        return "left stale lengths in padded request rows"
    return None


class Target(NamedTuple):
    make: Callable[[dict[str, Any]], Any]
    modes: Any
    descriptor_type: Any

    def run(self, case: Case[DummyRun]) -> Outcome:
        runner = self.make(runner_state(case.step, self.modes, self.descriptor_type))
        dummy_run = getattr(runner, DUMMY_RUN)
        try:
            dummy_run(case.step.num_tokens, **dict(case.step.options))
        except StopDummyRun as stopped:
            broken = _arrays_agree(stopped.snapshot, case.step)
            return Outcome(broken is None, broken or "staged consistent metadata")
        raise CannotRun("the dummy run ended before it built attention metadata")


def judge_source(sources: SourceReader) -> Evidence:
    target = Target(*compiled_runner(sources, V1_RUNNER, V1_RUNNER_CLASS))
    return judge_cases(cases(), target.run)


def judge_live() -> Evidence | None:
    runner_class = imported_class(V1_RUNNER, V1_RUNNER_CLASS)
    if runner_class is None:
        return None
    return judge_cases(cases(), Target(*live_runner(runner_class, {})).run)
