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
from collections.abc import Callable
from typing import Any

from vllm_graphsafe import counts
from vllm_graphsafe.fixes.replay_guard import (
    DRAFT_EVENT_PREFIX,
    FELL_BACK,
    FIX,
    REPLAYED,
)
from vllm_graphsafe.fixes.replay_guard.common import WARN_ONCE
from vllm_graphsafe.fixes.replay_guard.judge import REPLAY, RUNNER_STEP
from vllm_graphsafe.fixes.replay_guard.logic import GroupPrefills, describe_step
from vllm_graphsafe.hook_points import OnFailure
from vllm_graphsafe.vllm_layout import COMPILATION_CONFIG, load_name

PATCH_ID = FIX.id
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


class NotAReplaySite(LookupError):
    """The target's replay was called from a step the guard cannot read."""


def bind_guarded_replay(
    original: Any, on_failure: OnFailure, *, require_site: bool = False
) -> Any:
    """Factory of a :class:`ReplaceHook`: a manager's ``run_fullgraph``, guarded.

    With ``require_site`` (the target's), a caller that is no replay site
    fails the guard visibly (state ``failed``, one warning) instead of
    replaying unguarded in silence."""
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
        fallback: Callable[[], Any] | None = None
        try:
            if is_decode_graph(desc):
                frame = getframe(1)
                code = frame.f_code
                site = sites.get(code, _NOT_A_SITE)
                if site is _NOT_A_SITE:
                    from vllm_graphsafe.fixes.replay_guard import eager_branch

                    try:
                        site = eager_branch.site_of(code, frame.f_globals)
                    except eager_branch.NotASite:
                        site = None
                    sites[code] = site
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
                        WARN_ONCE(
                            "Model Runner V2's FULL decode CUDA graph"
                            if site.function == TARGET_SITE
                            else "a FULL draft CUDA graph of the speculator "
                            f"({site.function})",
                            functools.partial(_shape, reader, desc, metadata),
                        )
                        fallback = functools.partial(
                            site.run_eagerly,
                            dict(caller),
                            dataclasses.replace(desc, cg_mode=eager),
                        )
                    else:
                        count(prefix + REPLAYED)
                del frame
        except Exception as error:
            on_failure(error, _READING)
            return original(self, desc)
        if fallback is None:
            return original(self, desc)
        return fallback()

    return guarded_run_fullgraph


def _shape(reader: GroupPrefills, desc: Any, metadata: Any) -> str:
    return describe_step(
        getattr(desc, "num_tokens", None),
        getattr(desc, "num_reqs", None),
        reader.prefill_counts(metadata),
    )
