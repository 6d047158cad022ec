"""A guard at graph replay: a step whose attention metadata holds a prefill never
replays a FULL decode CUDA graph.

The dispatch fixes keep a short prompt off the decode graph where the runner
picks the graph. This guard is the second line: it sits where the graph is
about to replay, reads how the attention metadata builders classified the
step's rows (each KV-cache group's ``num_prefills``), and where a group holds a
prefill it runs the step without the graph (eagerly, with the same padded token
count, so that parallel collectives keep their shapes), counts it and warns
once. It never raises. It is independent of the dispatch fixes: its own switch,
on by default, applied also where vLLM classifies the dispatch by phase itself.

The per-group reading is ``logic``; the runtime hooks are ``hooks`` (V1's
``CUDAGraphWrapper``) and ``mrv2`` (Model Runner V2's replay).
"""

from __future__ import annotations

from vllm_graphsafe.fix import Fix
from vllm_graphsafe.vllm_layout import CUDA_GRAPH

#: A FULL decode graph replayed over a step whose metadata holds no prefill.
REPLAYED = "decode_graph_replay"
#: A step whose metadata holds a prefill, run without the FULL decode graph.
FELL_BACK = "decode_graph_fallback"
#: Model Runner V2's draft (speculator) replays are counted under this prefix.
DRAFT_EVENT_PREFIX = "draft_"

FIX = Fix(
    id="replay-guard",
    title="Replay guard: no FULL decode graph over a step holding a prefill",
    what=(
        "Where a FULL CUDA graph captured for uniform decode is about to "
        "replay (V1: the FULL `CUDAGraphWrapper`; Model Runner V2: the "
        "runner's and the speculators' decode-graph replays), the step's own "
        "attention metadata "
        "is read: one `num_prefills` per KV-cache group, as the metadata "
        "builders classified the rows, with no GPU synchronisation. If a "
        "group holds a prefill row the step runs without the graph "
        "(eagerly, same padded token count), is counted, and a warning "
        "with the step's shape is logged once per process. Independent of "
        "the dispatch fixes; genuine decode replays as before."
    ),
    why=(
        "Any way into the decode graph the dispatch fixes do not cover (a "
        "fork's own dispatch, a data-parallel peer's agreement, a native "
        "fix with a gap) replays it over prefill metadata: hybrid "
        "(GDN/Mamba) models silently corrupt their recurrent state. An "
        "assert there would stop the server; the guard serves the step "
        "right."
    ),
    binds_to=(
        "`CUDAGraphWrapper.__call__` (every FULL wrapper: the V1 runner's "
        "model, its DBO wrapper's); Model Runner V2: "
        "`ModelCudaGraphManager.run_fullgraph` and "
        "`CudaGraphManager.run_fullgraph`, where `execute_model`, a "
        "speculator's `propose` or its draft decode loop replay in an if/else "
        "whose else is their eager path (the guard reads the metadata that "
        "else runs on, the drafter's own where it builds one, and runs that "
        "else)"
    ),
    upstream=("vllm-project/vllm#55123",),
    delete_when=(
        "vLLM's FULL-graph replay itself runs a step whose attention "
        "metadata holds a prefill without the decode graph"
    ),
    anchor=CUDA_GRAPH,
    absent=("this vLLM has no CUDA-graph wrapper, where this guard sits"),
    commit_subject=(
        "[Bugfix] Never replay a FULL decode CUDA graph over prefill metadata"
    ),
    package=__name__,
    events=(
        REPLAYED,
        FELL_BACK,
        DRAFT_EVENT_PREFIX + REPLAYED,
        DRAFT_EVENT_PREFIX + FELL_BACK,
    ),
)
