"""V1 runner: a batch is uniform decode only when every row is a decode.

"A decode" as the runner's attention metadata builders see the row: with K
speculative tokens, a row that schedules exactly 1 + its drafts; without, one
token over prior state. ``early`` hooks the workers that classify a step before
the runner updates its state; the row rules live in ``fixes.phase_rows`` and
``fixes.scheduled_rows``.
"""

from __future__ import annotations

from vllm_graphsafe.fix import V1_RUNNER_ABSENT, V1_RUNNER_DELETE_WHEN, Fix
from vllm_graphsafe.fixes.phase_events import PHASE_RULE_EVENTS
from vllm_graphsafe.vllm_layout import V1_RUNNER

FIX = Fix(
    id="v1-phase-dispatch",
    title="V1 runner: phase-aware uniform-decode dispatch",
    what=(
        "On a real step whose shape is uniform decode, vLLM's shape rule "
        "answers False unless every scheduled row is a decode as the "
        "attention metadata builders see it (with K speculative tokens: "
        "the row schedules exactly 1 + its drafts; without: one token over "
        "prior state), before the runner dispatches the CUDA graph and "
        "syncs it across DP ranks. Capture, warm-up and dummy runs keep "
        "their own classification; other shapes skip the scan. Cost: a "
        "reclassified step of 32-511 tokens also runs without DBO "
        "microbatching on every DP rank."
    ),
    why=(
        "With K speculative tokens a prompt chunk of K+1 tokens, or K+1 "
        "output tokens re-computed after preemption, has the shape of a "
        "uniform speculative-decode batch; replaying the FULL decode graph "
        "over it skips the recurrent-state writes of GDN/Mamba layers: "
        "garbage output. A row padded with placeholder drafts is a decode "
        "and keeps the graph."
    ),
    binds_to=(
        "`GPUModelRunner._is_uniform_decode` (the shape rule "
        "`_determine_batch_execution_and_padding` consults on every step, "
        "before it dispatches and syncs DP), on real steps; on 0.20-0.31 also "
        "`Worker.execute_model`, which under pipeline + sequence parallel "
        "classifies the step before the runner updates its state: there both "
        "calls decide from the step's scheduler output"
    ),
    upstream=(
        "vllm-project/vllm#49918",
        "vllm-project/vllm#53051",
        "vllm-project/vllm#47123",
        "vllm-project/vllm#53059",
    ),
    delete_when=V1_RUNNER_DELETE_WHEN,
    anchor=V1_RUNNER,
    absent=V1_RUNNER_ABSENT,
    commit_subject=(
        "[Bugfix][V1] Keep prompt chunks off the uniform decode CUDA graph"
    ),
    package=__name__,
    events=PHASE_RULE_EVENTS,
)
