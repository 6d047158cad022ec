"""Just enough Model Runner V2 state to run a release's real dispatch code on CPU.

MRV2 cannot start without a GPU driver, so the runner and speculators are built
with ``object.__new__`` and given only the attributes their code reads up to
the CUDA-graph dispatch. The request states are filled through the release's
own ``RequestState.add_request`` / ``remove_request`` and brought up to date
by its own ``GPUModelRunner.update_requests``, as ``execute_model`` does at
the top of every step. ``dispatch_cg_and_sync_dp`` (or the DP sync inside it)
is replaced by a recorder that captures what it receives and stops the step.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from vllm_graphsafe import vllm_layout

RUNNER_MODULE = vllm_layout.MRV2_RUNNER
DP_MODULE = vllm_layout.MRV2_DP_UTILS
MAX_REQS = 64
MAX_TOKENS = 4096
HIDDEN = 8
#: The request-state columns a phase scan reads.
PHASE_FIELDS = frozenset({"prefill_len", "num_computed_prefill_tokens"})


class ReachedDispatch(Exception):
    """Raised by the recorders: the step got as far as the test needed."""


@dataclass
class Req:
    """One request: its prefill, what it computed before this step, what it runs."""

    prefill_len: int
    computed: int
    scheduled: int
    drafts: int = 0
    #: First scheduled this step (``scheduled_new_reqs``); otherwise cached.
    new: bool = False
    #: The runner's count before this step's state update (default: ``computed``).
    previous: int | None = None

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prefill_len


# -- request states ------------------------------------------------------------


class _HostColumn:
    """A UVA-backed column on CPU: the runner reads and writes its ``.np``."""

    def __init__(self, size: int) -> None:
        self.np = np.zeros(size, dtype=np.int32)

    def copy_to_uva(self, n: int | None = None) -> None:
        return None


class _StagedWrites:
    """A GPU column whose staged writes nothing here reads back."""

    #: Handed to GPU kernels, which are left out here.
    gpu = None

    def stage_write_elem(self, *_: Any) -> None:
        return None

    def stage_write(self, *_: Any) -> None:
        return None

    def apply_write(self) -> None:
        return None


def _recording_state_class() -> type:
    RequestState: Any = importlib.import_module(vllm_layout.MRV2_STATES).RequestState

    class RecordingRequestState(RequestState):  # type: ignore[misc]
        """Records reads of the phase columns once ``reads`` is a list."""

        def __getattribute__(self, name: str) -> Any:
            own = object.__getattribute__(self, "__dict__")
            reads = own.get("reads")
            if reads is not None and name in PHASE_FIELDS:
                reads.append(name)
            if name in own.get("hidden", ()):
                raise AttributeError(f"RequestState has no attribute {name!r}")
            return object.__getattribute__(self, name)

    return RecordingRequestState


def request_state(num_speculative_steps: int) -> Any:
    import torch

    state: Any = object.__new__(_recording_state_class())
    state.__dict__.update(
        max_num_reqs=MAX_REQS,
        max_model_len=MAX_TOKENS,
        num_speculative_steps=num_speculative_steps,
        req_id_to_index={},
        index_to_req_id={},
        free_indices=list(range(MAX_REQS)),
        prompt_len=_HostColumn(MAX_REQS),
        prefill_len=_HostColumn(MAX_REQS),
        total_len=_StagedWrites(),
        all_token_ids=_StagedWrites(),
        num_computed_prefill_tokens=np.zeros(MAX_REQS, dtype=np.int32),
        num_computed_tokens=_StagedWrites(),
        num_computed_tokens_np=np.zeros(MAX_REQS, dtype=np.int32),
        max_seq_len=np.zeros(MAX_REQS, dtype=np.int32),
        draft_tokens=torch.zeros(MAX_REQS, max(num_speculative_steps, 1)),
        last_sampled_tokens=torch.zeros(MAX_REQS, 1, dtype=torch.int64),
        reads=None,
        hidden=frozenset(),
    )
    return state


def _add(state: Any, req_id: str, prefill_len: int, computed: int) -> None:
    """The release's own ``add_request`` (0.22 takes no ``max_tokens``)."""
    extra = (
        {"max_tokens": 64}
        if "max_tokens" in inspect.signature(state.add_request).parameters
        else {}
    )
    state.add_request(req_id, prefill_len, list(range(prefill_len)), computed, **extra)


def leave_gaps(state: Any) -> None:
    """Occupy rows, then free every other one, still mid-prefill: the next
    requests land on non-contiguous rows, beside stale prefill counts."""
    for index in range(8):
        _add(state, f"filler-{index}", 100, 100 if index % 2 else 10)
    for index in range(0, 8, 2):
        state.remove_request(f"filler-{index}")


# -- one step ------------------------------------------------------------------


@dataclass
class Step:
    runner: Any
    scheduler_output: Any
    reqs: dict[str, Req]
    decode_query_len: int

    def run_state_update(self) -> None:
        """What ``execute_model`` does first: add new requests, update the rest."""
        self.runner.add_requests(self.scheduler_output)
        self.runner.update_requests(self.scheduler_output)

    def rows(self) -> dict[str, int]:
        return dict(self.runner.req_states.req_id_to_index)


def scheduler_output(reqs: dict[str, Req]) -> SimpleNamespace:
    scheduled = {rid: r for rid, r in reqs.items() if r.scheduled > 0}
    cached = [rid for rid, r in scheduled.items() if not r.new]
    return SimpleNamespace(
        num_scheduled_tokens={rid: r.scheduled for rid, r in scheduled.items()},
        total_num_scheduled_tokens=sum(r.scheduled for r in scheduled.values()),
        scheduled_spec_decode_tokens={
            rid: [-1] * r.drafts for rid, r in scheduled.items() if r.drafts
        },
        scheduled_new_reqs=[
            SimpleNamespace(
                req_id=rid, prefill_len=r.prefill_len, num_computed_tokens=r.computed
            )
            for rid, r in scheduled.items()
            if r.new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=cached,
            num_computed_tokens=[reqs[rid].computed for rid in cached],
            new_block_ids=[None] * len(cached),
        ),
        new_block_ids_to_zero=None,
        # 0.30 reads it (replacing tables on resumption); SchedulerOutput's default.
        block_table_updates=None,
        kv_cache_block_copies=None,
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        aux_output_connector_metadata=None,
        has_structured_output_requests=False,
        encoder_input_updates={},
        skip_drafts=False,
    )


def dummy_scheduler_output(num_reqs: int, width: int) -> SimpleNamespace:
    """A capture/profile batch, as ``_dummy_run`` describes it to ``execute_model``."""
    return SimpleNamespace(
        num_scheduled_tokens={f"dummy-{i}": width for i in range(num_reqs)},
        total_num_scheduled_tokens=num_reqs * width,
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        skip_drafts=False,
    )


@dataclass
class GraphManagerRecord:
    dispatched: list[Any] = field(default_factory=list)


class RecordingGraphManager:
    """Stands in for the CUDA-graph manager: records the count it is asked for."""

    def __init__(self, record: GraphManagerRecord) -> None:
        self.record = record

    def dispatch(
        self, num_reqs: int, num_tokens: int, uniform_token_count: Any, **_: Any
    ) -> Any:
        CUDAGraphMode = importlib.import_module(
            vllm_layout.COMPILATION_CONFIG
        ).CUDAGraphMode
        BatchExecutionDescriptor = importlib.import_module(
            vllm_layout.MRV2_CUDAGRAPH_UTILS
        ).BatchExecutionDescriptor

        self.record.dispatched.append(uniform_token_count)
        return BatchExecutionDescriptor(
            cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs
        )


def make_step(
    reqs: dict[str, Req],
    decode_query_len: int,
    *,
    gaps: bool = False,
    dp_size: int = 1,
    dp_rank: int = 0,
    graph_record: GraphManagerRecord | None = None,
) -> Step:
    GPUModelRunner = getattr(
        importlib.import_module(vllm_layout.MRV2_RUNNER), vllm_layout.MRV2_RUNNER_CLASS
    )

    state = request_state(decode_query_len - 1)
    if gaps:
        leave_gaps(state)
    # A runner that takes the counts from the scheduler in update_requests
    # (0.22+) may start the step behind them; one that does not (0.20) starts
    # where its previous step's postprocess advanced them: at ``computed``.
    synced = "num_computed_tokens" in inspect.getsource(GPUModelRunner.update_requests)
    for rid, req in reqs.items():
        if not req.new:
            previous = req.previous if synced and req.previous is not None else None
            _add(
                state,
                rid,
                req.prefill_len,
                req.computed if previous is None else previous,
            )

    def add_requests(output: Any) -> None:
        for new in output.scheduled_new_reqs:
            _add(state, new.req_id, new.prefill_len, new.num_computed_tokens)

    def nothing(*_: Any) -> None:
        return None

    runner = object.__new__(GPUModelRunner)
    # Releases read the DP layout either as attributes (0.27) or as properties
    # over parallel_config (0.32): set both.
    runner.__dict__.update(
        req_states=state,
        decode_query_len=decode_query_len,
        num_speculative_steps=decode_query_len - 1,
        lora_config=None,
        is_encoder_decoder=False,
        cudagraph_manager=RecordingGraphManager(graph_record or GraphManagerRecord()),
        dp_size=dp_size,
        dp_rank=dp_rank,
        parallel_config=SimpleNamespace(
            data_parallel_size=dp_size, data_parallel_rank=dp_rank
        ),
        use_pp=False,
        # postprocess (0.20) skips the sampler's bin counts off the last rank.
        is_last_pp_rank=False,
        adaptive_verification=None,
        pcp_manager=None,
        ubatch_runner=None,
        aux_output_connector=None,
        encoder_cache=None,
        kv_block_zeroer=None,
        block_tables=SimpleNamespace(
            apply_staged_writes=nothing, append_block_ids=nothing
        ),
        # 0.34 tells it the scheduler's drafts at the top of every step.
        draft_tokens_handler=SimpleNamespace(begin_step=nothing, discard=nothing),
        update_pp_decode_requests=nothing,
        finish_requests=nothing,
        free_states=nothing,
        add_requests=add_requests,
    )
    return Step(runner, scheduler_output(reqs), reqs, decode_query_len)


# -- recorders -----------------------------------------------------------------


class DispatchRecorder:
    """Replaces ``dispatch_cg_and_sync_dp``: records each call's arguments by name.

    The call numbered ``stop_at`` raises :class:`ReachedDispatch`; earlier ones
    return an eager descriptor so the caller carries on.
    """

    def __init__(self, original: Any, stop_at: int = 1) -> None:
        self.signature = inspect.signature(original)
        self.stop_at = stop_at
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CUDAGraphMode = importlib.import_module(
            vllm_layout.COMPILATION_CONFIG
        ).CUDAGraphMode
        BatchExecutionDescriptor = importlib.import_module(
            vllm_layout.MRV2_CUDAGRAPH_UTILS
        ).BatchExecutionDescriptor

        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        self.calls.append(dict(bound.arguments))
        if len(self.calls) >= self.stop_at:
            raise ReachedDispatch
        return (
            BatchExecutionDescriptor(
                cg_mode=CUDAGraphMode.NONE,
                num_tokens=bound.arguments["num_tokens"],
                num_reqs=bound.arguments["num_reqs"],
            ),
            None,
        )

    @property
    def counts(self) -> list[Any]:
        return [call["uniform_token_count"] for call in self.calls]


# -- input batches and speculators ---------------------------------------------


def _batch_order(step: Step) -> list[str]:
    model_runner: Any = importlib.import_module(vllm_layout.MRV2_RUNNER)

    output = step.scheduler_output
    sort = getattr(model_runner, "sort_batch_req_ids", None)
    if sort is None:
        return list(output.num_scheduled_tokens)
    order: list[str]
    if len(inspect.signature(sort).parameters) == 2:
        order = sort(output.num_scheduled_tokens, step.decode_query_len)
    else:
        order = sort(
            output.num_scheduled_tokens,
            output.scheduled_spec_decode_tokens,
            step.decode_query_len,
        )
    return order


def batch_phase_fields(step: Step) -> dict[str, Any]:
    """The input batch's per-row state, as the release's ``prepare_inputs`` builds it.

    A release that gathers the batch state before dispatch (0.28+) is asked
    directly; otherwise the rows are gathered as 0.24-0.27's ``prepare_inputs``
    does (pre-step counts, ``is_prefilling = computed prefill < prefill_len``).
    """
    runner = step.runner
    gather = getattr(runner, "gather_batch_req_state", None)
    if gather is not None:
        batch_state, _ = gather(step.scheduler_output, False)
        return dict(batch_state._asdict())
    states = runner.req_states
    req_ids = _batch_order(step)
    idx_mapping_np = np.array(
        [states.req_id_to_index[rid] for rid in req_ids], dtype=np.int32
    )
    prefill_len_np = states.prefill_len.np[idx_mapping_np]
    computed_np = states.num_computed_prefill_tokens[idx_mapping_np]
    return {
        "req_ids": req_ids,
        "idx_mapping_np": idx_mapping_np,
        "num_scheduled_tokens": np.array(
            [step.scheduler_output.num_scheduled_tokens[r] for r in req_ids],
            dtype=np.int32,
        ),
        "num_tokens": step.scheduler_output.total_num_scheduled_tokens,
        "prefill_len_np": prefill_len_np,
        "num_computed_prefill_tokens_np": computed_np,
        "is_prefilling_np": computed_np < prefill_len_np,
    }


#: Rows past ``num_reqs`` in the phase columns of a test input batch: stale rows
#: still in prefill, so a reader that ignores ``num_reqs`` misreads decodes.
PADDED_ROWS = 5


_PADDING = {
    "prefill_len_np": 300,
    "num_computed_prefill_tokens_np": 0,
    "is_prefilling_np": True,
}


def _padded(values: Any, fill: Any) -> np.ndarray:
    column = np.asarray(values)
    return np.concatenate([column, np.full(PADDED_ROWS, fill, dtype=column.dtype)])


def batch_has_phase_column() -> bool:
    """Whether the release's input batch carries ``is_prefilling_np`` (0.22+)."""
    InputBatch = importlib.import_module(vllm_layout.MRV2_INPUT_BATCH).InputBatch

    return "is_prefilling_np" in {f.name for f in dataclasses.fields(InputBatch)}


def _postprocess(step: Step, batch: Any) -> None:
    """The release's own ``postprocess`` (0.20), as ``sample_tokens`` runs it
    before ``propose``: it advances ``num_computed_prefill_tokens`` by the
    scheduled tokens, clamped to ``prefill_len``. Only its GPU kernel
    (``post_update``) is left out."""
    import torch

    model_runner: Any = importlib.import_module(vllm_layout.MRV2_RUNNER)

    kernel = model_runner.post_update
    model_runner.post_update = lambda *_, **__: None
    try:
        sampled = torch.zeros(batch.num_reqs, 1, dtype=torch.int64)
        ones = torch.ones(batch.num_reqs, dtype=torch.int32)
        step.runner.postprocess(batch, sampled, ones, torch.zeros_like(ones))
    finally:
        model_runner.post_update = kernel


def input_batch(step: Step, **overrides: Any) -> Any:
    """The target's input batch for ``step``, as ``propose`` receives it.

    The per-row phase columns run ``PADDED_ROWS`` rows past ``num_reqs``, as a
    padded batch's buffers do, with those rows in prefill.

    A release whose batch has no phase column (0.20) is taken through its real
    order: after the state update, ``prepare_inputs`` asks the request states
    ``any_prefills(idx_mapping_np)`` and stores that array in the batch; the
    forward runs; ``postprocess`` advances the request states; then ``propose``.
    """
    return _input_batch(step, True, overrides)


def unpadded_input_batch(step: Step) -> Any:
    """:func:`input_batch` with its phase columns ``num_reqs`` rows long, as
    Model Runner V2's attention metadata reads them."""
    return _input_batch(step, False, {})


def _input_batch(step: Step, padded: bool, overrides: dict[str, Any]) -> Any:
    import torch

    InputBatch = importlib.import_module(vllm_layout.MRV2_INPUT_BATCH).InputBatch

    step.run_state_update()
    phase = batch_phase_fields(step)
    pre_step = not batch_has_phase_column()
    if pre_step:
        # What prepare_inputs asks before the forward (model_runner, 0.20).
        step.runner.req_states.any_prefills(phase["idx_mapping_np"])
    req_ids = phase["req_ids"]
    num_reqs = len(req_ids)
    scheduled = np.asarray(phase["num_scheduled_tokens"], dtype=np.int32)
    computed = np.array([step.reqs[rid].computed for rid in req_ids], dtype=np.int32)
    drafts = np.array([step.reqs[rid].drafts for rid in req_ids], dtype=np.int32)
    query_start_loc_np = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(scheduled, out=query_start_loc_np[1:])
    seq_lens = torch.from_numpy(computed + scheduled)
    num_tokens = int(scheduled.sum())
    values: dict[str, Any] = {
        "num_reqs": num_reqs,
        "num_reqs_after_padding": num_reqs,
        "idx_mapping": torch.from_numpy(phase["idx_mapping_np"].astype(np.int32)),
        "num_tokens": num_tokens,
        "num_tokens_after_padding": num_tokens,
        "num_draft_tokens": int(drafts.sum()),
        "num_draft_tokens_per_req": drafts if drafts.any() else None,
        "query_start_loc": torch.from_numpy(query_start_loc_np),
        "query_start_loc_np": query_start_loc_np,
        "seq_lens": seq_lens,
        "seq_lens_cpu_upper_bound": seq_lens.clone(),
        "num_computed_tokens_np": computed,
        "has_structured_output_reqs": False,
        **phase,
        **{
            name: _padded(phase[name], fill)
            for name, fill in _PADDING.items()
            if padded and name in phase
        },
        "num_scheduled_tokens": scheduled,
        **overrides,
    }
    names = {f.name for f in dataclasses.fields(InputBatch)}
    batch = InputBatch(**{name: values.get(name) for name in names})
    if pre_step:
        _postprocess(step, batch)
    return batch


def dummy_input_batch(num_reqs: int, width: int) -> Any:
    """The release's own capture/profile batch (``InputBatch.make_dummy``)."""
    import torch

    input_batch_module = importlib.import_module(vllm_layout.MRV2_INPUT_BATCH)
    InputBatch = input_batch_module.InputBatch
    InputBuffers = input_batch_module.InputBuffers

    buffers = InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu"))
    return InputBatch.make_dummy(num_reqs, num_reqs * width, buffers)
