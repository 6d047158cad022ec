"""Just enough V1 ``GPUModelRunner`` state to run its real dispatch decision."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from vllm_graphsafe import vllm_layout

MAX_ROWS = 64


@dataclass
class Row:
    """One persistent-batch row: its prompt, what it computed, what it schedules.

    ``drafts``: the draft tokens the scheduler listed for it this step (its
    ``scheduled_spec_decode_tokens`` entry), None without an entry.
    """

    prompt: int
    computed: int
    scheduled: int
    drafts: int | None = None

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prompt

    @property
    def decode_draft_count(self) -> int:
        """The value vLLM 0.32's ``_prepare_inputs`` writes to the runner's
        ``num_decode_draft_tokens`` for this row under speculation."""
        if self.drafts is not None and self.scheduled == self.drafts + 1:
            return self.drafts
        if self.scheduled == 1 and self.computed >= self.prompt:
            return 0
        return -1


@dataclass
class DispatchRecord:
    uniform_decode: list[bool] = field(default_factory=list)
    dp_uniform_decode: list[bool] = field(default_factory=list)


class UntouchableBatch:
    """An input batch that fails the test if anything reads request state."""

    lora_id_to_lora_request: dict[str, Any] = {}  # noqa: RUF012

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"non-uniform batch read input_batch.{name}")


def input_batch(rows: list[Row], stale_rows: Sequence[Row] = ()) -> SimpleNamespace:
    """Rows in order, then ``stale_rows`` left behind past ``num_reqs``."""
    computed = np.zeros(MAX_ROWS, dtype=np.int32)
    prompt = np.zeros(MAX_ROWS, dtype=np.int32)
    for index, row in enumerate([*rows, *stale_rows]):
        computed[index] = row.computed
        prompt[index] = row.prompt
    return SimpleNamespace(
        num_computed_tokens_cpu=computed,
        num_prompt_tokens=prompt,
        spec_token_ids=scheduled_drafts([*rows, *stale_rows]),
        num_reqs=len(rows),
        lora_id_to_lora_request={},
    )


def batch_only(rows: list[Row], lists_drafts: bool) -> SimpleNamespace:
    """An input batch as upstream's tests give a runner built with
    ``object.__new__``: computed and prompt lengths, with ``lists_drafts``
    each row's drafts this step (``spec_token_ids``), and what the dispatch
    reads that is not about the phase."""
    full = input_batch(rows)
    batch = SimpleNamespace(
        num_computed_tokens_cpu=full.num_computed_tokens_cpu,
        num_prompt_tokens=full.num_prompt_tokens,
        lora_id_to_lora_request={},
    )
    if lists_drafts:
        batch.spec_token_ids = full.spec_token_ids
    return batch


def scheduled_drafts(rows: Sequence[Row]) -> list[list[int]]:
    """The input batch's ``spec_token_ids``: each row's drafts this step."""
    lists: list[list[int]] = [[] for _ in range(MAX_ROWS)]
    for index, row in enumerate(rows):
        lists[index] = [0] * (row.drafts or 0)
    return lists


def decode_draft_buffer(
    rows: list[Row], stale_rows: Sequence[Row] = ()
) -> SimpleNamespace:
    """The runner's ``num_decode_draft_tokens`` host view as ``_prepare_inputs``
    leaves it: one count per row, -1 past the batch (stale rows included)."""
    counts = np.full(MAX_ROWS, -1, dtype=np.int32)
    counts[: len(rows)] = [row.decode_draft_count for row in rows]
    return SimpleNamespace(np=counts)


def write_step(
    runner: Any, rows: list[Row], *, counts_drafts_without_drafts: bool = True
) -> None:
    """Rewrite the runner's columns in place for a new step over ``rows``.

    ``counts_drafts_without_drafts=False``: as vLLM 0.20-0.31's
    ``_prepare_inputs``, which rewrites the draft counts only on a step that
    scheduled drafts (the column keeps the last such step's counts otherwise).
    """
    batch = runner.input_batch
    for index, row in enumerate(rows):
        batch.num_computed_tokens_cpu[index] = row.computed
        batch.num_prompt_tokens[index] = row.prompt
    batch.spec_token_ids[:] = scheduled_drafts(rows)
    if counts_drafts_without_drafts or any(row.drafts for row in rows):
        runner.num_decode_draft_tokens.np[:] = decode_draft_buffer(rows).np


def make_runner(
    decode_query_len: int,
    batch: Any,
    record: DispatchRecord,
    dp_size: int = 1,
    draft_counts: Any = None,
    *,
    builders_counts: bool = True,
) -> Any:
    """``draft_counts``: the runner's ``num_decode_draft_tokens`` over the
    same rows (:func:`decode_draft_buffer`); None where nothing reads it.
    ``builders_counts=False``: the runner has no ``num_decode_draft_tokens``
    at all, as the runners upstream's tests build hold only an input batch
    and a dispatcher (:func:`batch_only`)."""
    CUDAGraphMode = importlib.import_module(vllm_layout.CONFIG).CUDAGraphMode
    BatchDescriptor = importlib.import_module(
        vllm_layout.FORWARD_CONTEXT
    ).BatchDescriptor
    GPUModelRunner = getattr(
        importlib.import_module(vllm_layout.V1_RUNNER), vllm_layout.V1_RUNNER_CLASS
    )

    class RecordingDispatcher:
        # A dispatcher with no fork-specific graph families (1Cat-vLLM's runner
        # asks it for attention-context buckets before it dispatches).
        has_attention_context_buckets = False

        def dispatch(self, num_tokens: int, uniform_decode: bool, **_: Any) -> Any:
            record.uniform_decode.append(bool(uniform_decode))
            mode = CUDAGraphMode.FULL if uniform_decode else CUDAGraphMode.PIECEWISE
            return mode, BatchDescriptor(num_tokens=num_tokens)

    runner = object.__new__(GPUModelRunner)
    parallel = SimpleNamespace(
        data_parallel_size=dp_size,
        data_parallel_rank=0,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
    )
    compilation = SimpleNamespace(pass_config=SimpleNamespace(enable_sp=False))
    if builders_counts:
        runner.__dict__["num_decode_draft_tokens"] = draft_counts
    runner.__dict__.update(
        uniform_decode_query_len=decode_query_len,
        input_batch=batch,
        cudagraph_dispatcher=RecordingDispatcher(),
        model_config=SimpleNamespace(is_encoder_decoder=False),
        parallel_config=parallel,
        compilation_config=compilation,
        vllm_config=SimpleNamespace(
            parallel_config=parallel,
            compilation_config=compilation,
            observability_config=SimpleNamespace(cudagraph_metrics=False),
        ),
    )
    return runner


def runner_over(
    rows: list[Row],
    decode_query_len: int,
    record: DispatchRecord,
    dp_size: int = 1,
    stale_rows: Sequence[Row] = (),
) -> Any:
    """A runner whose batch and draft counts both describe ``rows``."""
    return make_runner(
        decode_query_len,
        input_batch(rows, stale_rows),
        record,
        dp_size,
        decode_draft_buffer(rows, stale_rows),
    )


def run_dispatch(
    runner: Any, scheduled: list[int], force_uniform_decode: bool | None = None
) -> None:
    kwargs: dict[str, Any] = {}
    if force_uniform_decode is not None:
        kwargs["force_uniform_decode"] = force_uniform_decode
    runner._determine_batch_execution_and_padding(
        num_tokens=sum(scheduled),
        num_reqs=len(scheduled),
        num_scheduled_tokens_np=np.array(scheduled, dtype=np.int32),
        max_num_scheduled_tokens=max(scheduled),
        use_cascade_attn=False,
        **kwargs,
    )
