"""The replay guard in Model Runner V2, which replays its FULL graphs itself.

``execute_model`` replays the target's graph through
``ModelCudaGraphManager.run_fullgraph(batch_desc)``; a speculator's ``propose``
replays its draft graphs through ``CudaGraphManager.run_fullgraph``. Both are
replaced. Where the graph is a decode graph (the descriptor has a uniform token
count, or the max query length of a varlen decode graph) and its caller is a
replay site (:mod:`.eager_branch`: the replay sits in an ``if`` on the graph
mode whose ``else`` is vLLM's eager path), the attention metadata that ``else``
runs on is read from the caller, one ``num_prefills`` per KV-cache group: the
step's ``attn_metadata`` in ``execute_model`` and a draft prefill, the
drafter's own metadata where it builds one for its graph (a draft decode step,
DFlash's query). A group holding a prefill: the caller's ``else`` runs instead
of the replay, with the batch descriptor in mode NONE, and its result is what
the replay would have returned. A replay outside such a branch (a fused draft
decode whose FULL branch returns before any metadata exists, DFlash's query
graph behind a flag) replays as vLLM does: a speculator's graph there runs on
metadata the speculator builds for decode rows only.

The caller's locals are read from its frame: about a microsecond per replayed
decode step on a 2-core host (docs/benchmarks.md), and the one place the guard
needs them; MRV2 hands its metadata to nothing the guard could hook between
building it and replaying.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
from typing import TYPE_CHECKING, Any, NamedTuple

from vllm_graphsafe import counts
from vllm_graphsafe.fixes.replay_guard import (
    DRAFT_EVENT_PREFIX,
    FELL_BACK,
    FIX,
    REPLAYED,
)
from vllm_graphsafe.fixes.replay_guard.logic import GroupPrefills, describe_step
from vllm_graphsafe.registry import (
    HookPoint,
    OnFailure,
    ReplaceHook,
    Requirement,
    SourceReader,
)
from vllm_graphsafe.vllm_layout import (
    COMPILATION_CONFIG,
    CUDA_GRAPH,
    MRV2_CUDAGRAPH_UTILS,
    MRV2_RUNNER,
    load_name,
)

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.replay_guard.eager_branch import Site

PATCH_ID = FIX.id
MANAGER_MODULE = MRV2_CUDAGRAPH_UTILS
#: The target model's replay, called by ``execute_model``.
TARGET_REPLAY = "ModelCudaGraphManager.run_fullgraph"
#: Every manager's replay (the speculators' managers inherit it).
REPLAY = "CudaGraphManager.run_fullgraph"
RUNNER_STEP = "GPUModelRunner.execute_model"
#: The step whose replay is the target's; any other site is a draft's.
TARGET_SITE = RUNNER_STEP.rsplit(".", 1)[-1]
_READING = (
    "the batch descriptor (uniform_token_count, max_query_len) and the "
    "calling step's attn_metadata (num_prefills)"
)
_NOT_A_SITE = object()
#: The caller's local the guard reads the step's attention metadata from (the
#: same name in :mod:`.eager_branch`, imported only once a replay is guarded).
METADATA_LOCAL = "attn_metadata"


def is_decode_graph(descriptor: Any) -> bool:
    """A FULL graph captured for decode rows only: a uniform token count, or
    the query-length bound of a varlen decode graph. Mixed FULL graphs
    (neither) were captured for prefills and replay them as they are."""
    return (
        getattr(descriptor, "uniform_token_count", None) is not None
        or getattr(descriptor, "max_query_len", None) is not None
    )


def _site(code: types.CodeType, module_globals: dict[str, Any]) -> Site | None:
    from vllm_graphsafe.fixes.replay_guard.eager_branch import NotASite, site_of

    try:
        return site_of(code, module_globals)
    except NotASite:
        return None


class NotAReplaySite(LookupError):
    """The target's replay was called from a step the guard cannot read."""


def bind_guarded_target_replay(original: Any, on_failure: OnFailure) -> Any:
    """The target's ``run_fullgraph``, guarded: its caller (``execute_model``)
    must be a replay site, or the guard fails visibly (state ``failed``, one
    warning) instead of replaying unguarded in silence."""
    return bind_guarded_replay(original, on_failure, require_site=True)


def bind_guarded_replay(
    original: Any, on_failure: OnFailure, *, require_site: bool = False
) -> Any:
    """Factory of a :class:`ReplaceHook`: a manager's ``run_fullgraph``, guarded."""
    parameters = tuple(inspect.signature(original).parameters)
    if len(parameters) != 2:
        raise TypeError(f"{REPLAY} takes {parameters}, not (self, desc)")
    eager = load_name(COMPILATION_CONFIG, "CUDAGraphMode").NONE
    count = counts.STATS.counter(PATCH_ID)
    sites: dict[types.CodeType, Any] = {}
    readers: dict[types.CodeType, GroupPrefills] = {}
    getframe = sys._getframe

    @functools.wraps(original)
    def guarded_run_fullgraph(self: Any, desc: Any) -> Any:
        fallback: tuple[Site, dict[str, Any], Any] | None = None
        try:
            if is_decode_graph(desc):
                frame = getframe(1)
                code = frame.f_code
                site = sites.get(code, _NOT_A_SITE)
                if site is _NOT_A_SITE:
                    site = sites[code] = _site(code, frame.f_globals)
                if site is None and require_site:
                    raise NotAReplaySite(
                        f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}) "
                        "does not replay in an if/else on the graph mode beside "
                        f"its {METADATA_LOCAL}"
                    )
                if site is not None:
                    caller = frame.f_locals
                    reader = readers.get(code)
                    if reader is None:
                        reader = readers[code] = GroupPrefills()
                    prefix = "" if site.function == TARGET_SITE else DRAFT_EVENT_PREFIX
                    metadata = caller.get(site.metadata)
                    if reader.holds_prefill(metadata):
                        count(prefix + FELL_BACK)
                        warn(reader, desc, metadata, site)
                        eager_desc = dataclasses.replace(desc, cg_mode=eager)
                        fallback = (site, dict(caller), eager_desc)
                    else:
                        count(prefix + REPLAYED)
                del frame
        except Exception as error:
            on_failure(error, _READING)
            return original(self, desc)
        if fallback is None:
            return original(self, desc)
        site, caller, eager_desc = fallback
        return site.run_eagerly(caller, eager_desc)

    return guarded_run_fullgraph


def warn(reader: GroupPrefills, desc: Any, metadata: Any, site: Site) -> None:
    from vllm_graphsafe.fixes.replay_guard.common import WARN_ONCE

    where = (
        "Model Runner V2's FULL decode CUDA graph"
        if site.function == TARGET_SITE
        else f"a FULL draft CUDA graph of the speculator ({site.function})"
    )
    WARN_ONCE(
        where,
        lambda: describe_step(
            getattr(desc, "num_tokens", None),
            getattr(desc, "num_reqs", None),
            reader.prefill_counts(metadata),
        ),
    )


class ReplaysInBranch(NamedTuple):
    """``execute_model`` names its replay, the graph mode it tests and the
    step's ``attn_metadata`` (checked without parsing it; the guard reads the
    branch itself from the running code, and fails visibly where it cannot)."""

    module: str
    qualname: str

    def missing(self, sources: SourceReader) -> str | None:
        if not sources.defines(self.module, self.qualname):
            return f"{self.module}.{self.qualname} is missing (read by {REPLAY})"
        for word in (REPLAY.rsplit(".", 1)[-1], "cg_mode", METADATA_LOCAL):
            named = sources.mentions(self.module, self.qualname, word)
            if named is None:
                return self._parsed(sources)
            if not named:
                return (
                    f"{self.module}.{self.qualname} no longer names {word} "
                    f"(read by {REPLAY})"
                )
        return None

    def _parsed(self, sources: SourceReader) -> str | None:
        from vllm_graphsafe.fixes.replay_guard.eager_branch import replay_branch

        node = sources.function_node(self.module, self.qualname)
        if node is None:
            return f"{self.module}.{self.qualname} is missing (read by {REPLAY})"
        if replay_branch(node) is None or METADATA_LOCAL not in _assigned_names(node):
            return (
                f"{self.module}.{self.qualname} no longer replays its FULL graph "
                f"in an if/else on the graph mode beside {METADATA_LOCAL} "
                f"(read by {REPLAY})"
            )
        return None


def _assigned_names(node: Any) -> set[str]:
    import ast

    return {
        child.id
        for child in ast.walk(node)
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store)
    } | set(_parameters(node))


def _parameters(node: Any) -> list[str]:
    from vllm_graphsafe import recognition

    return recognition.parameter_names(node)


def hook_points(sources: SourceReader) -> list[HookPoint]:
    return [
        ReplaceHook(MANAGER_MODULE, TARGET_REPLAY, bind_guarded_target_replay),
        ReplaceHook(MANAGER_MODULE, REPLAY, bind_guarded_replay),
    ]


def reads(sources: SourceReader) -> list[Requirement]:
    return [ReplaysInBranch(MRV2_RUNNER, RUNNER_STEP)]


def native_reason(sources: SourceReader) -> str | None:
    """The step itself leaves the FULL graph when its metadata holds a prefill:
    it reads ``num_prefills`` (itself or through a module function) and binds
    the tested batch descriptor again before the replay's branch."""
    from vllm_graphsafe.fixes.replay_guard.common import reads_prefill_counts
    from vllm_graphsafe.fixes.replay_guard.eager_branch import replay_branch

    node = sources.function_node(MRV2_RUNNER, RUNNER_STEP)
    if node is None:
        return None
    branch = replay_branch(node)
    modules = (MRV2_RUNNER, MANAGER_MODULE, CUDA_GRAPH)
    if branch is None or not reads_prefill_counts(sources, modules, node):
        return None
    import ast

    rebinds = sum(
        isinstance(child, ast.Name)
        and isinstance(child.ctx, ast.Store)
        and child.id == branch.descriptor
        for child in ast.walk(node)
    )
    if rebinds < 2:
        return None
    return f"{RUNNER_STEP} leaves the FULL graph when its metadata holds a prefill"
