"""Runs the release's real ``GPUModelRunner._dummy_run`` up to attention metadata.

Everything ``_dummy_run`` stages before it builds attention metadata is real
vLLM code; the runner around it is just enough state, and the metadata build
is replaced by a recorder that snapshots the staged buffers and stops the run.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from vllm_graphsafe import vllm_layout

MAX_TOKENS = 64
STALE_POSITION = 777
STALE_COMPUTED = 555


class StopDummyRun(Exception):
    """Raised by the recorders once the interesting part has run."""


@dataclass
class Snapshot:
    seq_lens_cpu: np.ndarray
    seq_lens_device: np.ndarray
    positions: np.ndarray
    num_computed: np.ndarray
    query_start_loc: np.ndarray
    num_reqs_padded: int
    num_tokens: int


@dataclass
class DummyRunRecord:
    snapshots: list[Snapshot] = field(default_factory=list)
    slot_mapping_calls: list[tuple[np.ndarray, np.ndarray]] = field(
        default_factory=list
    )


class FakeBlockTable:
    max_num_blocks_per_req = 8
    blocks_per_kv_block = 1

    def add_row(self, block_ids: list[int], row: int) -> None:
        return None

    def commit_block_table(self, num_reqs: int) -> None:
        return None


class FakeMultiGroupBlockTable:
    def __init__(self, record: DummyRunRecord) -> None:
        self.block_tables = [FakeBlockTable()]
        self._record = record

    def commit_block_table(self, num_reqs: int) -> None:
        return None

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: Any, positions: Any
    ) -> None:
        self._record.slot_mapping_calls.append(
            (query_start_loc.cpu().numpy().copy(), positions.cpu().numpy().copy())
        )


def replace_original(
    monkeypatch: Any, owner: type, name: str, replacement: Any
) -> None:
    """Swap the original method, beneath any hook the plugin put around it."""
    from vllm_graphsafe.hook_points import is_hooked

    current = owner.__dict__[name]
    if is_hooked(current):
        monkeypatch.setattr(current, "__wrapped__", replacement)
    else:
        monkeypatch.setattr(owner, name, replacement)


def make_dummy_runner(
    monkeypatch: Any,
    *,
    max_num_seqs: int,
    decode_query_len: int = 1,
    pad_reqs_to: int | None = None,
    pad_tokens_to: int | None = None,
    dcp_world_size: int = 1,
    real_computed: np.ndarray | None = None,
) -> tuple[Any, DummyRunRecord]:
    import torch

    v1_utils = importlib.import_module(vllm_layout.V1_UTILS)
    CpuGpuBuffer = v1_utils.CpuGpuBuffer
    CUDAGraphMode = importlib.import_module(vllm_layout.CONFIG).CUDAGraphMode
    BatchDescriptor = importlib.import_module(
        vllm_layout.FORWARD_CONTEXT
    ).BatchDescriptor
    GPUModelRunner = getattr(
        importlib.import_module(vllm_layout.V1_RUNNER), vllm_layout.V1_RUNNER_CLASS
    )

    # CUDA builds pin host buffers before each copy; there is no driver here.
    monkeypatch.setattr(v1_utils, "PIN_MEMORY", False, raising=False)
    record = DummyRunRecord()
    runner = object.__new__(GPUModelRunner)
    rows = max_num_seqs + 4
    computed = np.full(rows, STALE_COMPUTED, dtype=np.int32)
    if real_computed is not None:
        computed[: len(real_computed)] = real_computed

    def buffer(size: int) -> Any:
        return CpuGpuBuffer(
            size, dtype=torch.int64, device=torch.device("cpu"), pin_memory=False
        )

    def determine(**kwargs: Any) -> Any:
        num_reqs = kwargs["num_reqs"]
        descriptor = BatchDescriptor(
            num_tokens=pad_tokens_to or kwargs["num_tokens"],
            num_reqs=pad_reqs_to or num_reqs,
        )
        return CUDAGraphMode.FULL, descriptor, False, None, None

    def build_attention_metadata(_runner: Any, **kwargs: Any) -> Any:
        record.snapshots.append(
            Snapshot(
                seq_lens_cpu=runner.optimistic_seq_lens_cpu.numpy().copy(),
                seq_lens_device=runner.seq_lens.cpu().numpy().copy(),
                positions=runner.positions.cpu().numpy().copy(),
                num_computed=np.array(
                    getattr(runner.input_batch, "num_computed_tokens_cpu", [])
                ),
                query_start_loc=runner.query_start_loc.np.copy(),
                num_reqs_padded=kwargs["num_reqs"],
                num_tokens=kwargs["num_tokens"],
            )
        )
        raise StopDummyRun

    def stop(*_args: Any, **_kwargs: Any) -> Any:
        raise StopDummyRun

    query_start_loc = buffer(rows + 1)
    parallel = SimpleNamespace(cp_kv_cache_interleave_size=4, num_ubatches=2)
    runner.__dict__.update(
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(multimodal_config=None),
            parallel_config=parallel,
        ),
        parallel_config=parallel,
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        uniform_decode_query_len=decode_query_len,
        max_num_tokens=MAX_TOKENS,
        speculative_config=None,
        lora_config=None,
        dcp_world_size=dcp_world_size,
        prepare_inputs_event=None,
        arange_np=np.arange(MAX_TOKENS * 2, dtype=np.int64),
        optimistic_seq_lens_cpu=torch.randint(1, 50, (rows,), dtype=torch.int32),
        seq_lens=torch.zeros(rows, dtype=torch.int32),
        positions=torch.full((MAX_TOKENS,), STALE_POSITION, dtype=torch.int64),
        query_pos=buffer(MAX_TOKENS),
        query_start_loc=query_start_loc,
        input_batch=SimpleNamespace(
            num_computed_tokens_cpu=computed,
            block_table=FakeMultiGroupBlockTable(record),
        ),
        _determine_batch_execution_and_padding=determine,
        _get_slot_mappings=lambda **_: (None, None),
        # Input-preparation sync is unrelated to the staged metadata, and forks
        # read their own state in it (1Cat-vLLM's asynchronous-scheduling trace).
        synchronize_input_prep=lambda *_args, **_kwargs: contextlib.nullcontext(),
        # 1Cat-vLLM copies buffers through a staged path when it overlaps input
        # preparation; a dummy run takes its plain copy.
        _sm70_async_staged_input_prep_active=False,
        maybe_dummy_run_with_lora=stop,
    )
    replace_original(
        monkeypatch,
        GPUModelRunner,
        "_build_attention_metadata",
        build_attention_metadata,
    )
    if dcp_world_size > 1:
        runner.kv_cache_config = SimpleNamespace(num_blocks=32)
    return runner, record


def run_dummy(runner: Any, num_tokens: int, **kwargs: Any) -> None:
    try:
        runner._dummy_run(num_tokens, **kwargs)
    except StopDummyRun:
        return
    raise AssertionError("the dummy run went past the recorders")
