"""The release's MRV2 speculators, built up to their CUDA-graph dispatch.

A speculator is made with ``object.__new__`` and given only the attributes its
``propose`` reads on the way to ``dispatch_cg_and_sync_dp``, which a
:class:`~tests.support.vllm_fakes.mrv2_state.DispatchRecorder` replaces.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from tests.support.vllm_fakes.mrv2_state import (
    HIDDEN,
    MAX_REQS,
    MAX_TOKENS,
    DispatchRecorder,
    ReachedDispatch,
)
from vllm_graphsafe import vllm_layout

#: Speculators whose ``propose`` may classify the draft prefill by shape:
#: (module, class). Those a release lacks are not collected.
SPECULATORS = (
    (vllm_layout.MRV2_EAGLE_SPECULATOR, "EagleSpeculator"),
    (vllm_layout.MRV2_AUTOREGRESSIVE_SPECULATOR, "AutoRegressiveSpeculator"),
    (vllm_layout.MRV2_TARGET_DEPENDENT_AR_SPECULATOR, "TargetDependentARSpeculator"),
    (vllm_layout.MRV2_MULTI_MODULE_MTP_SPECULATOR, "MultiModuleMTPSpeculator"),
)


#: A draft-prefill count: ``get_uniform_token_count(`` (0.20 calls it inline as
#: an argument of the dispatch, 0.22-0.27 assign it) or upstream's phase-aware
#: ``get_uniform_decode_token_count(`` (0.28+).
_DRAFT_PREFILL_COUNT = re.compile(r"\bget_uniform_(?:decode_)?token_count\(")


def speculator_classes() -> Iterator[tuple[str, str]]:
    """The release's speculators whose ``propose`` computes a draft-prefill count."""
    from vllm_graphsafe.sources import SourceReader

    sources = SourceReader()
    for module, name in SPECULATORS:
        body = sources.function(module, f"{name}.propose")
        if body and _DRAFT_PREFILL_COUNT.search(body):
            yield module, name


_DISPATCH = "dispatch_cg_and_sync_dp"
_SELF_CALL = re.compile(r"\bself\.(\w+)\(")


def dispatches_in_propose(module: str, name: str) -> int:
    """The dispatches one ``propose`` makes: its own, and those of the methods
    it calls (0.34 moved the draft decode's into the base class's
    ``_run_multi_step_decode``)."""
    cls = getattr(importlib.import_module(module), name)
    body = inspect.getsource(cls.propose)
    called = {
        getattr(cls, method, None) for method in set(_SELF_CALL.findall(body))
    } - {None, cls.propose}
    return body.count(f"{_DISPATCH}(") + sum(
        inspect.getsource(method).count(f"{_DISPATCH}(")
        for method in called
        if inspect.isfunction(method)
    )


def lineage_modules(cls: type) -> list[Any]:
    """The modules of ``cls`` and its bases that call vLLM's dispatch: where
    a recorder has to stand in for it."""
    modules = {importlib.import_module(base.__module__) for base in cls.__mro__}
    return [module for module in modules if hasattr(module, _DISPATCH)]


def _no_op(*_: Any, **__: Any) -> None:
    return None


#: Speculator methods that touch GPU buffers or models on the way to dispatch.
_STUBBED_METHODS = (
    "_copy_request_inputs",
    "_prepare_inputs",
    "_prepare_eplb_forward",
    "_prefill",
    "prefill",
    "on_prefill_begin",
    "on_prefill_end",
    "_generate_drafts",
    "_multi_step_decode",
    "multi_step_decode",
)
#: Module-level Triton launchers on the way to dispatch.
_STUBBED_FUNCTIONS = (
    "prepare_prefill_inputs",
    "prepare_decode_inputs",
    "prepare_eagle_inputs",
    "prepare_eagle_decode",
)


def make_speculator(
    module_name: str,
    class_name: str,
    num_speculative_steps: int,
    monkeypatch: Any,
    *,
    dp_size: int = 1,
    dp_rank: int = 0,
    stop_at: int = 1,
) -> tuple[Any, DispatchRecorder]:
    """A speculator of the release with its dispatch replaced by a recorder."""
    import torch

    InputBuffers = importlib.import_module(vllm_layout.MRV2_INPUT_BATCH).InputBuffers

    module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    recorder = DispatchRecorder(module.dispatch_cg_and_sync_dp, stop_at=stop_at)
    for owner in lineage_modules(cls):
        monkeypatch.setattr(owner, _DISPATCH, recorder)
        for name in _STUBBED_FUNCTIONS:
            if hasattr(owner, name):
                monkeypatch.setattr(owner, name, _no_op)

    if getattr(cls, "__abstractmethods__", None):
        # Base classes (e.g. AutoRegressiveSpeculator) leave model loading to
        # their subclasses; propose is the base class's own.
        cls = type(cls.__name__, (cls,), dict.fromkeys(cls.__abstractmethods__, _no_op))
    speculator = object.__new__(cls)
    speculator.__dict__.update(
        num_speculative_steps=num_speculative_steps,
        max_model_len=MAX_TOKENS,
        max_num_reqs=MAX_REQS,
        max_num_tokens=MAX_TOKENS,
        method="eagle",
        dp_size=dp_size,
        dp_rank=dp_rank,
        hidden_states=torch.zeros(MAX_TOKENS, HIDDEN),
        input_buffers=InputBuffers(MAX_REQS, MAX_TOKENS, torch.device("cpu")),
        draft_tokens=torch.zeros(MAX_REQS, num_speculative_steps, dtype=torch.int64),
        sample_src_positions=torch.zeros(MAX_REQS, dtype=torch.int64),
        last_token_indices=torch.zeros(MAX_REQS, dtype=torch.int64),
        current_draft_step=torch.tensor(0, dtype=torch.int64),
        idx_mapping=torch.zeros(MAX_REQS, dtype=torch.int32),
        temperature=torch.zeros(MAX_REQS),
        seeds=torch.zeros(MAX_REQS, dtype=torch.int64),
        prefill_cudagraph_manager=None,
        decode_cudagraph_manager=None,
        cudagraph_manager=None,
        pcp_manager=None,
        supports_mm_inputs=False,
        # 0.33 reads max_model_len through a property over vllm_config; 0.34
        # hands the dispatch its parallel config.
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=MAX_TOKENS),
            parallel_config=SimpleNamespace(
                data_parallel_size=dp_size, data_parallel_rank=dp_rank
            ),
        ),
    )
    for name in _STUBBED_METHODS:
        if hasattr(cls, name):
            speculator.__dict__[name] = _no_op
    return speculator, recorder


def propose(speculator: Any, batch: Any, *, dummy_run: bool = False) -> None:
    """Call the release's ``propose`` as the runner does, up to the recorder's stop."""
    import torch

    num_reqs = batch.num_reqs
    positional: tuple[Any, ...] = (
        batch,
        {},  # attn_metadata
        {},  # slot_mappings
        torch.zeros(batch.num_tokens_after_padding, HIDDEN),  # last_hidden_states
        None,  # aux_hidden_states
        torch.ones(num_reqs, dtype=torch.int32),  # num_sampled
        torch.zeros(num_reqs, dtype=torch.int32),  # num_rejected
        torch.zeros(MAX_REQS, 1, dtype=torch.int64),  # last_sampled
        torch.zeros(1, MAX_REQS, dtype=torch.int32),  # next_prefill_tokens
        torch.ones(MAX_REQS),  # temperature
        torch.zeros(MAX_REQS, dtype=torch.int64),  # seeds
    )
    kwargs = {"dummy_run": True} if dummy_run else {}
    try:
        speculator.propose(*positional, **kwargs)
    except ReachedDispatch:
        return
    raise AssertionError("propose returned before its dispatch was recorded")


class Tripwire:
    """A phase column that fails the test when anything reads it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _touched(self, *_: Any, **__: Any) -> Any:
        raise AssertionError(f"the draft-prefill scan read {self._name}")

    __getitem__ = __array__ = __iter__ = __len__ = __bool__ = _touched
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __invert__ = _touched
    __and__ = __or__ = __rand__ = __ror__ = _touched
    __hash__ = None  # type: ignore[assignment]  # unhashable, as __eq__ is taken

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the draft-prefill scan read {self._name}.{name}")
