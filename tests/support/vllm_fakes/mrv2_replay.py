"""Model Runner V2 steps that reach their FULL-graph replay, on CPU.

The release's own ``GPUModelRunner.execute_model`` (and a speculator's
``propose``) runs from the top to its replay and on to its end: the runner is
an instance of a subclass that answers any attribute its code reads and this
module does not set with a ``MagicMock``, the dispatch returns the test's FULL
batch descriptor, ``model_state.prepare_attn`` returns the test's attention
metadata, and the graph manager is the release's own class with a recorder for
its captured graph. The model records each call and the forward context's mode
in it; ``set_forward_context`` records what it is given. Whatever vLLM does
between the dispatch and the replay (and after) is its own code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np

from vllm_graphsafe import vllm_layout

NUM_TOKENS, NUM_REQS, WIDTH = 8, 2, 4
HIDDEN = 4
#: Length of the speculators' ``arange_np`` (row offsets of uniform queries).
MAX_ARANGE = 64


@dataclass
class ReplayRecord:
    #: Replays of the captured graph.
    replays: int = 0
    #: The forward context's mode in each model call.
    model_calls: list[Any] = field(default_factory=list)
    #: What each ``set_forward_context`` was given (its keyword arguments).
    contexts: list[dict[str, Any]] = field(default_factory=list)
    #: The eager draft prefill's arguments by name, per call.
    draft_prefills: list[dict[str, Any]] = field(default_factory=list)
    #: Replays of a speculator's draft decode graph.
    draft_replays: int = 0
    #: The eager draft decode steps' arguments by name, per call.
    draft_decodes: list[dict[str, Any]] = field(default_factory=list)


class Graph:
    def __init__(self, record: ReplayRecord, counter: str = "replays") -> None:
        self.record = record
        self.counter = counter

    def replay(self) -> None:
        setattr(self.record, self.counter, getattr(self.record, self.counter) + 1)


def modes() -> Any:
    return vllm_layout.load_name(vllm_layout.COMPILATION_CONFIG, "CUDAGraphMode")


def descriptor(**fields: Any) -> Any:
    """The release's ``BatchExecutionDescriptor`` of a FULL graph; fields it
    lacks are left out (``max_query_len`` before 0.32)."""
    cls = vllm_layout.load_name(
        vllm_layout.MRV2_CUDAGRAPH_UTILS, "BatchExecutionDescriptor"
    )
    names = {f.name for f in dataclasses.fields(cls)}
    values = {
        "cg_mode": modes().FULL,
        "num_tokens": NUM_TOKENS,
        "num_reqs": NUM_REQS,
        **fields,
    }
    return cls(**{name: value for name, value in values.items() if name in names})


def has_descriptor_field(name: str) -> bool:
    cls = vllm_layout.load_name(
        vllm_layout.MRV2_CUDAGRAPH_UTILS, "BatchExecutionDescriptor"
    )
    return name in {f.name for f in dataclasses.fields(cls)}


def _permissive(cls: type) -> type:
    """``cls`` answering any attribute its instance lacks with a ``MagicMock``."""

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=name)
        object.__setattr__(self, name, value)
        return value

    return type(cls.__name__, (cls,), {"__getattr__": __getattr__})


@contextlib.contextmanager
def _recording_context(
    record: ReplayRecord, attn_metadata: Any, **kwargs: Any
) -> Iterator[None]:
    forward_context = vllm_layout.load(vllm_layout.FORWARD_CONTEXT)
    record.contexts.append(dict(kwargs))
    required: dict[str, Any] = {
        f.name: {}
        for f in dataclasses.fields(forward_context.ForwardContext)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    context = forward_context.ForwardContext(
        **{
            **required,
            "attn_metadata": attn_metadata,
            "cudagraph_runtime_mode": kwargs.get("cudagraph_runtime_mode"),
        }
    )
    with forward_context.override_forward_context(context):
        yield


def _recording_model(record: ReplayRecord) -> Any:
    import torch

    def model(**_inputs: Any) -> Any:
        forward_context = vllm_layout.load(vllm_layout.FORWARD_CONTEXT)
        record.model_calls.append(
            forward_context.get_forward_context().cudagraph_runtime_mode
        )
        return torch.full((NUM_TOKENS, HIDDEN), 2.0)

    return model


def target_manager(desc: Any, record: ReplayRecord) -> Any:
    """The release's ``ModelCudaGraphManager`` with ``desc`` captured."""
    import torch

    cls = vllm_layout.load_name(
        vllm_layout.MRV2_CUDAGRAPH_UTILS, "ModelCudaGraphManager"
    )
    manager = object.__new__(cls)
    manager.__dict__.update(
        graphs={desc: Graph(record)},
        is_last_pp_rank=True,
        use_aux_hidden_state_outputs=False,
        hidden_states=torch.full((2 * NUM_TOKENS, HIDDEN), 1.0),
        aux_hidden_states=[],
        intermediate_tensors=None,
    )
    return manager


_STEP_METHODS = (
    "update_pp_decode_requests",
    "finish_requests",
    "free_states",
    "add_requests",
    "update_requests",
)


def make_runner(
    monkeypatch: Any, desc: Any, attn_metadata: Any
) -> tuple[Any, ReplayRecord]:
    """A runner whose ``execute_model`` dispatches ``desc`` over ``attn_metadata``."""
    from types import SimpleNamespace

    module = vllm_layout.load(vllm_layout.MRV2_RUNNER)
    record = ReplayRecord()
    runner_class = _permissive(getattr(module, vllm_layout.MRV2_RUNNER_CLASS))
    runner: Any = object.__new__(runner_class)
    input_batch = mock.MagicMock(name="input_batch")
    input_batch.num_tokens_after_padding = NUM_TOKENS
    input_batch.num_tokens = NUM_TOKENS
    input_batch.num_reqs = NUM_REQS
    runner.__dict__.update(
        encoder_cache=None,
        is_encoder_decoder=False,
        lora_config=None,
        pcp_manager=None,
        aux_output_connector=None,
        ubatch_runner=None,
        dcp_size=1,
        is_first_pp_rank=True,
        is_last_pp_rank=True,
        uses_inputs_embeds=False,
        supports_mm_inputs=False,
        use_aux_hidden_state_outputs=False,
        decode_query_len=WIDTH,
        cudagraph_manager=target_manager(desc, record),
        model=_recording_model(record),
        prepare_inputs=lambda *args, **kwargs: input_batch,
        prepare_attn=lambda batch: (mock.MagicMock(), mock.MagicMock()),
        # The batch state the dispatch is told (the dispatch itself is the
        # test's): 0.34 reads decode_graph_eligible, 0.32-0.33 has_prefill.
        gather_batch_req_state=lambda *args: (
            SimpleNamespace(
                num_tokens=NUM_TOKENS, has_prefill=False, decode_graph_eligible=True
            ),
            WIDTH,
        ),
        # The dispatch's uniform count, where a tree's own step asks a method
        # (upstream's phase rule backported): the dispatch is the test's.
        _get_uniform_decode_token_count=lambda *args: WIDTH,
    )
    runner.observability_config.cudagraph_metrics = False
    runner.model_state.prepare_attn = lambda *args, **kwargs: attn_metadata
    runner.model_state.prepare_inputs = lambda *args, **kwargs: {}
    for name in _STEP_METHODS:
        runner.__dict__[name] = lambda *args, **kwargs: None
    monkeypatch.setattr(module, "dispatch_cg_and_sync_dp", lambda *a, **k: (desc, None))
    monkeypatch.setattr(module, "build_slot_mappings_by_layer", lambda *a, **k: {})
    monkeypatch.setattr(
        module,
        "set_forward_context",
        lambda metadata, config, **kwargs: _recording_context(
            record, metadata, **kwargs
        ),
    )
    return runner, record


def scheduler_output() -> Any:
    output = mock.MagicMock(name="scheduler_output")
    output.total_num_scheduled_tokens = NUM_TOKENS
    output.num_scheduled_tokens = {f"req-{i}": WIDTH for i in range(NUM_REQS)}
    output.scheduled_encoder_inputs = {}
    output.finished_req_ids = set()
    return output


def run_target_step(runner: Any) -> Any:
    """The release's ``execute_model`` on one step; the hidden states it kept."""
    runner.execute_model(scheduler_output())
    return runner.execute_model_state.hidden_states


# -- a speculator's draft steps -----------------------------------------------------


def speculator_module_names() -> list[tuple[str, str]]:
    """The release's speculators (module, class) whose own ``propose`` replays
    a FULL draft-prefill graph (0.34: the target-dependent and the standalone
    drafters, multi-module MTP)."""
    from vllm_graphsafe.sources import SourceReader

    sources = SourceReader()
    return [
        (module, name)
        for module, name in vllm_layout.MRV2_SPECULATORS
        if "run_fullgraph(" in (sources.function(module, f"{name}.propose") or "")
    ]


def draft_decode_loops(module_name: str, class_name: str) -> list[bool]:
    """How the speculator replays its draft decode graph: ``False`` once per
    draft step (``_multi_step_decode``), ``True`` once for all of them (the
    fused loop, 0.32+, where the drafter's backends update their metadata in
    the graph); empty where it has no FULL draft decode."""
    cls = getattr(importlib.import_module(module_name), class_name)
    loops = []
    for fused, names in ((False, _DECODE_LOOPS), (True, _FUSED_DECODE_LOOPS)):
        method = next((getattr(cls, n) for n in names if hasattr(cls, n)), None)
        if method is not None and "run_fullgraph(" in inspect.getsource(method):
            loops.append(fused)
    return loops


#: The speculators' eager draft-prefill paths (the ``else`` of their replay).
EAGER_DRAFT_METHODS = ("_prefill", "prefill", "_generate_drafts")
#: Their draft decode loops, per step and fused, by release.
_DECODE_LOOPS = ("_multi_step_decode", "multi_step_decode")
_FUSED_DECODE_LOOPS = ("_run_fused_multi_step_decode", "_fused_multi_step_decode")
#: Eager draft-decode and DFlash query steps (those that replay no graph).
EAGER_DRAFT_DECODE_METHODS = (
    "_decode",
    "_generate_draft",
    "generate_draft",
    "_generate_fused_drafts",
    "_fused_multi_step_decode",
)
#: GPU work on the way to a replay, left out (its results are not read here).
_DRAFT_PREPARATION = (
    "_prepare_decode_inputs",
    "_prepare_graph_replay",
    "_store_hidden_states",
    "prepare_context_anchor",
    "_precompute_context_kv",
)
#: Module-level kernels the speculators launch before their replay.
_DRAFT_KERNELS = (
    "pad_trailing_draft_slots",
    "build_slot_mappings_by_layer",
    "prepare_dflash_inputs",
)


def _graph_manager(cls: type, graphs: dict[Any, Graph]) -> Any:
    """The release's graph manager of speculator graphs (its
    ``SpeculatorCudaGraphManager`` where it has one) holding ``graphs``."""
    manager_class = vllm_layout.load_name(
        vllm_layout.MRV2_CUDAGRAPH_UTILS, "CudaGraphManager"
    )
    for base in cls.__mro__:
        found = getattr(
            importlib.import_module(base.__module__), "SpeculatorCudaGraphManager", None
        )
        if found is not None:
            manager_class = found
            break
    manager = object.__new__(manager_class)
    manager.__dict__["graphs"] = graphs
    return manager


def _recorder(method: Any, calls: list[dict[str, Any]]) -> Any:
    """Stands for ``method``: records each call's arguments by name."""
    signature = inspect.signature(method)

    def record(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(None, *args, **kwargs)
        calls.append(dict(list(bound.arguments.items())[1:]))

    return record


def make_speculator(
    module_name: str,
    class_name: str,
    monkeypatch: Any,
    desc: Any,
    attn_metadata: Any,
    *,
    steps: int = 1,
    decode_desc: Any = None,
    fused: bool = False,
) -> tuple[Any, ReplayRecord]:
    """A speculator whose ``propose`` dispatches its draft prefill (DFlash: its
    query) to ``desc``, and its draft decode steps to ``decode_desc``, with
    ``steps`` speculative tokens; whatever metadata it builds for its own
    graphs is ``attn_metadata``. ``fused``: its attention backends update the
    draft decode metadata inside the graph (the fused decode loop)."""
    from tests.support.vllm_fakes import mrv2_speculators

    speculator, _ = mrv2_speculators.make_speculator(
        module_name, class_name, steps, monkeypatch, stop_at=10**9
    )
    cls = type(speculator)
    speculator.__class__ = _permissive(cls)
    record = ReplayRecord()
    dispatch = inspect.signature(
        vllm_layout.load_name(vllm_layout.MRV2_DP_UTILS, "dispatch_cg_and_sync_dp")
    )

    def dispatched(*args: Any, **kwargs: Any) -> Any:
        count = dispatch.bind(*args, **kwargs).arguments.get("uniform_token_count")
        return (decode_desc if decode_desc is not None and count == 1 else desc), None

    for module in mrv2_speculators.lineage_modules(cls):
        monkeypatch.setattr(module, "dispatch_cg_and_sync_dp", dispatched)
        for name in _DRAFT_KERNELS:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda *args, **kwargs: {})
    manager = _graph_manager(cls, {desc: Graph(record)})
    own = speculator.__dict__
    own.update(
        prefill_cudagraph_manager=manager,
        cudagraph_manager=manager,
        query_cudagraph_manager=manager,
        decode_cudagraph_manager=None,
        supports_decode_metadata_update=fused,
        # The draft prefill runs on the target's metadata (0.34's default).
        can_reuse_target_attn_metadata=True,
        num_query_per_req=WIDTH,
        draft_kv_cache_group_id=0,
        draft_kv_cache_group_ids=[],
        arange_np=np.arange(MAX_ARANGE, dtype=np.int32),
    )
    for name in (
        "_build_attn_metadata",
        "_build_draft_attn_metadata",
        "_build_uniform_attn_metadata",
    ):
        own[name] = lambda *args, **kwargs: attn_metadata
    if decode_desc is not None:
        own["decode_cudagraph_manager"] = _graph_manager(
            cls, {decode_desc: Graph(record, "draft_replays")}
        )
    for name in (*_DECODE_LOOPS, *_FUSED_DECODE_LOOPS):
        own.pop(name, None)  # the release's own loops run
    for name in EAGER_DRAFT_METHODS:
        if hasattr(cls, name):
            own[name] = _recorder(getattr(cls, name), record.draft_prefills)
    for name in EAGER_DRAFT_DECODE_METHODS:
        method = getattr(cls, name, None)
        if method is not None and "run_fullgraph(" not in inspect.getsource(method):
            own[name] = _recorder(method, record.draft_decodes)
    for name in _DRAFT_PREPARATION:
        own[name] = lambda *args, **kwargs: None
    return speculator, record


def propose(speculator: Any, attn_metadata: Any) -> None:
    """The release's ``propose`` on a target batch of ``NUM_REQS`` rows whose
    step ran on ``attn_metadata``."""
    import torch

    from tests.support.vllm_fakes import mrv2_state

    batch = mrv2_state.dummy_input_batch(NUM_REQS, WIDTH)
    hidden = mrv2_state.HIDDEN
    speculator.propose(
        batch,
        attn_metadata,
        {},
        torch.zeros(batch.num_tokens_after_padding, hidden),
        None,
        torch.ones(NUM_REQS, dtype=torch.int32),
        torch.zeros(NUM_REQS, dtype=torch.int32),
        torch.zeros(mrv2_state.MAX_REQS, 1, dtype=torch.int64),
        torch.zeros(1, mrv2_state.MAX_REQS, dtype=torch.int32),
        torch.ones(mrv2_state.MAX_REQS),
        torch.zeros(mrv2_state.MAX_REQS, dtype=torch.int64),
    )
