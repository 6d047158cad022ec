"""V1 runner: a batch is uniform decode only when every row is a decode.

"A decode" as the runner's attention metadata builders see the row: with K
speculative tokens, a row that schedules exactly 1 + its drafts; without, one
token over prior state. This folder: the facts (here), the runtime hooks
(``hooks``, and ``early`` for workers that classify a step before the runner
updates its state), the backport planner (``backport``) and the tests it
writes (``written_tests``); the row rules live in ``fixes.phase_rows`` and
``fixes.scheduled_rows``.
"""

from __future__ import annotations

from typing import Any

from vllm_graphsafe.fixes.fix import ExtraControl, Fix
from vllm_graphsafe.fixes.phase_events import PHASE_RULE_EVENTS
from vllm_graphsafe.vllm_layout import V1_RUNNER


def prompt_length_rule(runner: Any, num_reqs: int, decode_query_len: int) -> bool:
    """The earlier rule, every row had computed its whole prompt (the control)."""
    batch = runner.input_batch
    past_prompt = (
        batch.num_computed_tokens_cpu[:num_reqs] >= batch.num_prompt_tokens[:num_reqs]
    )
    return bool(past_prompt.all())


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
    delete_when="the V1 runner's uniform-decode test reads each row's phase",
    anchor=V1_RUNNER,
    absent=(
        "this vLLM has no V1 model runner, the code this fixes: vLLM 0.34 "
        "removed it, and Model Runner V2 runs every model"
    ),
    commit_subject=(
        "[Bugfix][V1] Keep prompt chunks off the uniform decode CUDA graph"
    ),
    package=__name__,
    events=PHASE_RULE_EVENTS,
    dispatch_runner="v1",
    extra_controls=(
        ExtraControl(
            option="--prompt-length-rule",
            removes="row rule replaced by the prompt-length predicate",
            module=f"{__name__}.hooks",
            attribute="rows_are_decodes",
            replacement=prompt_length_rule,
            tests=(
                "tests/release/classes/test_v1_phase_dispatch.py",
                "-k",
                "builders_classify",
            ),
            caught="a re-prefill or padded row classified by prompt length",
        ),
    ),
    # The plugin makes ``_is_uniform_decode`` phase-aware *on a runner
    # instance*, while the source fix keeps vLLM's static shape rule (upstream's
    # tests call it on the class) and checks the phase in the dispatch.
    plugin_form_only=(
        "tests/release/classes/test_v1_phase_dispatch.py::"
        "test_the_rule_on_a_runner_takes_keywords_or_positions",
    ),
)
