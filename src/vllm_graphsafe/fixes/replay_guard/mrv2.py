"""The replay guard in Model Runner V2, which replays its FULL graphs itself.

A decode graph's replay from a replay site (:mod:`.eager_branch`) over metadata
with a prefill runs the caller's eager ``else`` instead. Other replays (a fused
draft decode, DFlash's query graph) run on decode-only metadata. The caller's
locals are read from its frame (about 1 µs per replay, docs/benchmarks.md):
MRV2 hands its metadata to nothing hookable before replaying.
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
from vllm_graphsafe.fixes.replay_guard.logic import GroupPrefills
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


class NotAReplaySite(LookupError):
    pass


def bind_guarded_replay(
    original: Any, on_failure: OnFailure, *, require_site: bool = False
) -> Any:
    """Factory of a :class:`ReplaceHook`. With ``require_site`` (the target's),
    a caller that is no replay site fails the guard visibly instead of
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
            # A decode graph: a uniform token count, or a varlen decode graph's
            # query-length bound (mixed FULL graphs replay as they are).
            if (
                getattr(desc, "uniform_token_count", None) is not None
                or getattr(desc, "max_query_len", None) is not None
            ):
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
                            reader,
                            desc,
                            metadata,
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
