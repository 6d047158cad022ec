"""Model Runner V2: a uniform batch is decode only when no scheduled request is
in prefill, for the target step and for Eagle/MTP draft prefill. The phase rows
it reads are shared with the V1 fix (``fixes.phase_rows``).
"""

from __future__ import annotations

from vllm_graphsafe.fix import Fix
from vllm_graphsafe.fixes.phase_events import PHASE_RULE_EVENTS
from vllm_graphsafe.vllm_layout import MRV2_RUNNER

#: Draft-prefill decisions are counted under these events (prefix + event).
DRAFT_EVENT_PREFIX = "draft_"

FIX = Fix(
    id="mrv2-phase-dispatch",
    title="Model Runner V2: phase-aware target and draft-prefill dispatch",
    what=(
        "On a real step with a uniform shape, the uniform token count that "
        "`execute_model` hands to `dispatch_cg_and_sync_dp` (which picks "
        "the CUDA graph and agrees it across DP ranks) is withdrawn while "
        "a scheduled request is still in prefill, read from the request "
        "states the step has just updated. Eagle/MTP draft prefill gets "
        "the same rule from the target batch's pre-step phase; draft "
        "decode steps, fixed-width speculators (DFlash), dummy and capture "
        "runs and genuine decode keep their count."
    ),
    why=(
        "With K speculative tokens a prompt chunk of exactly K+1 tokens "
        "has the shape of a uniform speculative-decode batch; replaying "
        "the FULL decode graph over prefill metadata corrupts stateful "
        "hybrid (GDN/Mamba) models, and a decode sharing the batch too."
    ),
    binds_to=(
        "`get_uniform_token_count` where `execute_model` and the "
        "speculators call it (and those callers, to know the step); "
        "where the input batch has no `is_prefilling_np` (0.20), also "
        "`RequestState.any_prefills`, to remember its pre-step answer"
    ),
    upstream=(
        "vllm-project/vllm#51865",
        "vllm-project/vllm#50532",
        "vllm-project/vllm#49918",
    ),
    delete_when=(
        "the oldest supported vLLM has vllm-project/vllm#51865 "
        "(released in 0.28): MRV2 classifies by request phase"
    ),
    anchor=MRV2_RUNNER,
    absent=("this vLLM has no Model Runner V2, the code this fixes"),
    commit_subject=("[Bugfix][MRV2] Dispatch uniform decode graphs by request phase"),
    package=__name__,
    events=(
        *PHASE_RULE_EVENTS,
        *(DRAFT_EVENT_PREFIX + event for event in PHASE_RULE_EVENTS),
    ),
)
