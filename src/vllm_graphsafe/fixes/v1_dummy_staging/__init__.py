"""V1 runner: FULL dummy runs stage lengths, computed counts and positions that
agree (the staging arithmetic: ``logic``)."""

from __future__ import annotations

from vllm_graphsafe.fix import V1_RUNNER_ABSENT, V1_RUNNER_DELETE_WHEN, Fix
from vllm_graphsafe.vllm_layout import V1_RUNNER

#: Dummy runs whose metadata the staging made consistent.
STAGED_DUMMY = "staged_dummy"


FIX = Fix(
    id="v1-dummy-staging",
    title="V1 runner: consistent FULL dummy length and position metadata",
    what=(
        "In `_dummy_run`, where it builds attention metadata: a requested "
        "seq_len shorter than the query is raised to it on both mirrors; "
        "computed lengths become seq_len - scheduled and positions "
        "computed[req] + query_pos; padded rows and tokens are cleared; the "
        "DCP helper consumes the staged positions. The input batch's CPU "
        "computed counts are restored when the dummy run ends."
    ),
    why=(
        "A long dummy seq_len beside stale positions makes kernels that "
        "count from positions (MiniMax-M3's sparse indexer) disagree with "
        "kernels that count from seq_lens; -1 sentinels land inside the "
        "consumed range."
    ),
    binds_to=(
        "`_dummy_run` and `prepare_dcp_dummy_context_metadata` (0.27+) or "
        "`_build_attention_metadata` (0.22)"
    ),
    upstream=("vllm-project/vllm#54604",),
    delete_when=V1_RUNNER_DELETE_WHEN,
    anchor=V1_RUNNER,
    absent=V1_RUNNER_ABSENT,
    commit_subject=(
        "[Bugfix][V1] Stage consistent FULL dummy length and position metadata"
    ),
    package=__name__,
    events=(STAGED_DUMMY,),
)
