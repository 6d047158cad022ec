"""V1 runner: a batch is uniform decode only when every request is past its prompt.

This folder: the facts (here), the runtime hooks (``hooks``), the backport
planner (``backport``) and the tests it writes (``written_tests``); the phase
rows it reads are shared with Model Runner V2's fix (``fixes.phase_rows``).
"""

from __future__ import annotations

from vllm_graphsafe.fixes.fix import Fix
from vllm_graphsafe.fixes.phase_events import PHASE_RULE_EVENTS

FIX = Fix(
    id="v1-phase-dispatch",
    title="V1 runner: phase-aware uniform-decode dispatch",
    what=(
        "On a real step whose shape is uniform decode, vLLM's shape rule "
        "answers False while a scheduled request has not computed its "
        "whole prompt, before the runner dispatches the CUDA graph and "
        "syncs it across DP ranks. Capture, warm-up and dummy runs keep "
        "their own classification; other shapes skip the scan."
    ),
    why=(
        "With K speculative tokens a prompt chunk of K+1 tokens has the "
        "shape of a uniform speculative-decode batch; replaying the FULL "
        "decode graph over it skips the recurrent-state writes of "
        "GDN/Mamba layers: garbage output."
    ),
    binds_to=(
        "`GPUModelRunner._is_uniform_decode` (the shape rule "
        "`_determine_batch_execution_and_padding` consults on every step, "
        "before it dispatches and syncs DP), on real steps"
    ),
    upstream=(
        "vllm-project/vllm#49918",
        "vllm-project/vllm#53051",
        "vllm-project/vllm#47123",
        "vllm-project/vllm#53059",
    ),
    delete_when="the V1 runner's uniform-decode test reads request state",
    commit_subject=(
        "[Bugfix][V1] Keep prompt chunks off the uniform decode CUDA graph"
    ),
    package=__name__,
    events=PHASE_RULE_EVENTS,
    dispatch_runner="v1",
    # The plugin makes ``_is_uniform_decode`` phase-aware *on a runner
    # instance*, while the source fix keeps vLLM's static shape rule (upstream's
    # tests call it on the class) and checks the phase in the dispatch.
    plugin_form_only=(
        "tests/release/classes/test_v1_phase_dispatch.py::"
        "test_the_rule_on_a_runner_takes_keywords_or_positions",
    ),
)
