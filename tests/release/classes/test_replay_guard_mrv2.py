"""The replay guard in Model Runner V2: the release's own ``execute_model`` and
speculators' ``propose`` run to their FULL-graph replay on CPU
(:mod:`tests.support.vllm_fakes.mrv2_replay`).

The step's attention metadata is the release's ``GDNAttentionMetadata`` with
the counts its builder sets. A step holding a prefill must take vLLM's own
eager path (the ``else`` of its replay: the forward context in mode NONE, the
model called once, what the step keeps its output) instead of the replay,
and be counted; a decode step replays. With the plugin disabled (the negative
control) every such step replays and the ``regression`` tests fail.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tests.support.vllm_fakes import mrv2_replay as fakes
from vllm_graphsafe import counts, vllm_layout
from vllm_graphsafe.fixes.replay_guard import DRAFT_EVENT_PREFIX, FELL_BACK, REPLAYED
from vllm_graphsafe.sources import SourceReader

PATCH_ID = "replay-guard"
regression = pytest.mark.regression(PATCH_ID)


def gdn(*, prefills: int) -> dict[str, Any]:
    """Two linear-attention layers sharing their group's metadata, whose
    builder ran ``prefills`` of the two rows as prefills."""
    metadata_class = vllm_layout.load_name(
        vllm_layout.GDN_ATTENTION_BACKEND, "GDNAttentionMetadata"
    )
    spec_decodes = fakes.NUM_REQS - prefills
    metadata = metadata_class(
        num_prefills=prefills,
        num_prefill_tokens=fakes.WIDTH * prefills,
        num_decodes=0,
        num_decode_tokens=0,
        num_spec_decodes=spec_decodes,
        num_spec_decode_tokens=fakes.WIDTH * spec_decodes,
        num_actual_tokens=fakes.NUM_TOKENS,
    )
    return {
        "model.layers.0.linear_attn": metadata,
        "model.layers.1.linear_attn": metadata,
    }


@pytest.fixture(autouse=True)
def fresh_counts() -> Any:
    counts.STATS.reset()
    yield
    counts.STATS.reset()


def decided() -> dict[str, int]:
    return counts.STATS.snapshot().get(PATCH_ID, {})


def decode_graph() -> Any:
    return fakes.descriptor(uniform_token_count=fakes.WIDTH)


# -- the target model ----------------------------------------------------------


def test_a_decode_step_replays_the_target_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = fakes.make_runner(monkeypatch, decode_graph(), gdn(prefills=0))
    hidden = fakes.run_target_step(runner)
    assert record.replays == 1
    assert record.model_calls == []
    # The graph's output buffer, as vLLM's replay returns it.
    assert float(hidden[0, 0]) == 1.0


@regression
def test_a_step_holding_a_prefill_takes_the_eager_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, record = fakes.make_runner(monkeypatch, decode_graph(), gdn(prefills=1))
    hidden = fakes.run_target_step(runner)
    assert record.replays == 0
    eager = fakes.modes().NONE
    assert record.model_calls == [eager]
    (context,) = record.contexts
    assert context["cudagraph_runtime_mode"] == eager
    # Same padded token count as the graph would have run.
    assert context["num_tokens"] == fakes.NUM_TOKENS
    # The model's output is what the step keeps, in place of the graph's.
    assert float(hidden[0, 0]) == 2.0
    assert runner.kv_connector.pre_forward.call_count == 1


@regression
def test_target_fallbacks_and_replays_are_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for prefills in (1, 0, 2):
        runner, _ = fakes.make_runner(
            monkeypatch, decode_graph(), gdn(prefills=prefills)
        )
        fakes.run_target_step(runner)
    assert decided() == {FELL_BACK: 2, REPLAYED: 1}


@pytest.mark.skipif(
    not fakes.has_descriptor_field("max_query_len"),
    reason="this release's MRV2 has no varlen decode graphs (max_query_len, 0.32+)",
)
@regression
def test_a_varlen_decode_graph_is_guarded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    varlen = fakes.descriptor(max_query_len=fakes.WIDTH)
    runner, record = fakes.make_runner(monkeypatch, varlen, gdn(prefills=1))
    fakes.run_target_step(runner)
    assert (record.replays, len(record.model_calls)) == (0, 1)


def test_a_mixed_full_graph_replays_over_prefills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A FULL graph captured for mixed batches (no uniform count, no decode
    bound) runs prefills by design."""
    runner, record = fakes.make_runner(monkeypatch, fakes.descriptor(), gdn(prefills=1))
    fakes.run_target_step(runner)
    assert (record.replays, record.model_calls) == (1, [])
    assert decided() == {}


# -- the speculators' draft step -------------------------------------------------

SPECULATORS = fakes.speculator_module_names()


@regression
@pytest.mark.parametrize(("module", "name"), SPECULATORS)
def test_a_draft_step_over_a_prefill_takes_the_eager_path(
    module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    speculator, record = fakes.make_speculator(
        module, name, monkeypatch, decode_graph(), gdn(prefills=1)
    )
    fakes.propose(speculator, gdn(prefills=1))
    assert record.replays == 0
    (eager,) = record.draft_prefills
    assert eager["cudagraph_runtime_mode"] == fakes.modes().NONE


@regression
@pytest.mark.parametrize(("module", "name"), SPECULATORS)
def test_draft_fallbacks_are_counted_apart(
    module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for prefills in (1, 0):
        speculator, _ = fakes.make_speculator(
            module, name, monkeypatch, decode_graph(), gdn(prefills=prefills)
        )
        fakes.propose(speculator, gdn(prefills=prefills))
    assert decided() == {
        DRAFT_EVENT_PREFIX + FELL_BACK: 1,
        DRAFT_EVENT_PREFIX + REPLAYED: 1,
    }


@pytest.mark.parametrize(("module", "name"), SPECULATORS)
def test_a_draft_decode_step_replays(
    module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    speculator, record = fakes.make_speculator(
        module, name, monkeypatch, decode_graph(), gdn(prefills=0)
    )
    fakes.propose(speculator, gdn(prefills=0))
    assert (record.replays, record.draft_prefills) == (1, [])


# -- graphs over the drafter's own rows: draft decode, DFlash's query -------------
# A speculator builds the metadata of these graphs itself, for one-token draft
# rows (DFlash: a fixed-width query per request): decode rows by construction.
# A prompt in the target's step is not theirs: they replay, never fall back.

DRAFT_STEPS = 3
DRAFT_DECODES = [
    pytest.param(module, name, fused, id=f"{name}-{'fused' if fused else 'per-step'}")
    for module, name in SPECULATORS
    for fused in fakes.draft_decode_loops(module, name)
]


def drafter_rows() -> dict[str, Any]:
    """The release's GDN metadata as its builder counts a drafter's own rows."""
    return gdn(prefills=0)


def fell_back() -> dict[str, int]:
    return {
        event: count for event, count in decided().items() if event.endswith(FELL_BACK)
    }


@pytest.mark.parametrize(("module", "name", "fused"), DRAFT_DECODES)
def test_draft_decode_graphs_replay_after_a_step_that_held_a_prompt(
    module: str, name: str, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's draft prefill runs eagerly (it holds the prompt); each draft
    decode step replays its graph (the fused loop: once for all)."""
    eager = fakes.descriptor(cg_mode=fakes.modes().NONE)
    speculator, record = fakes.make_speculator(
        module,
        name,
        monkeypatch,
        eager,
        drafter_rows(),
        steps=DRAFT_STEPS,
        decode_desc=fakes.descriptor(uniform_token_count=1),
        fused=fused,
    )
    fakes.propose(speculator, gdn(prefills=1))
    assert len(record.draft_prefills) == 1
    assert record.draft_replays == (1 if fused else DRAFT_STEPS - 1)
    assert record.draft_decodes == []
    # The per-step loop replays where the guard reads the drafter's metadata;
    # the fused one replays before any metadata exists, and is not read.
    replays = {} if fused else {DRAFT_EVENT_PREFIX + REPLAYED: DRAFT_STEPS - 1}
    assert decided() == replays


DFLASH = (vllm_layout.MRV2_DFLASH_SPECULATOR, "DFlashSpeculator")


@pytest.mark.skipif(
    not SourceReader().exists(DFLASH[0]),
    reason="this release has no DFlash speculator (added in 0.24)",
)
@pytest.mark.parametrize("updates_in_graph", [False, True], ids=["built", "in-graph"])
def test_the_dflash_query_graph_replays_over_a_step_that_held_a_prompt(
    updates_in_graph: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DFlash dispatches its query graph whatever the target's step held; the
    graph runs on the query metadata it builds (or, where its backends update
    it in the graph, builds none)."""
    query = fakes.descriptor(uniform_token_count=fakes.WIDTH)
    speculator, record = fakes.make_speculator(
        *DFLASH, monkeypatch, query, drafter_rows(), fused=updates_in_graph
    )
    fakes.propose(speculator, gdn(prefills=1))
    assert (record.replays, record.draft_decodes) == (1, [])
    assert fell_back() == {}


# -- what the guard reads of the release's code -----------------------------------


def test_the_steps_eager_path_is_found_in_the_release() -> None:
    """``execute_model`` replays in an if/else whose else is vLLM's eager path,
    assigning the replay's result to ``model_output``."""
    from vllm_graphsafe.fixes.replay_guard.eager_branch import site_of

    runner_class = vllm_layout.load_name(
        vllm_layout.MRV2_RUNNER, vllm_layout.MRV2_RUNNER_CLASS
    )
    step = inspect.unwrap(runner_class.execute_model)
    site = site_of(step.__code__, step.__globals__)
    assert (site.descriptor, site.output) == ("batch_desc", "model_output")
    assert {"attn_metadata", "model_inputs", "self"} <= set(site.inputs)


def test_the_release_reads_as_needing_the_guard() -> None:
    from vllm_graphsafe.fixes.replay_guard import judge
    from vllm_graphsafe.sources import SourceReader

    sources = SourceReader()
    assert judge.mrv2_native_reason(sources) is None
    assert (
        judge.ReplaysInBranch(vllm_layout.MRV2_RUNNER, judge.RUNNER_STEP).missing(
            sources
        )
        is None
    )


def test_a_target_replay_the_guard_cannot_read_fails_visibly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Drift: the target's replay called from a step without the if/else the
    guard runs instead. vLLM's replay answers, and the patch turns itself off
    with its reason (never a silent unguarded replay)."""
    from vllm_graphsafe.judging import PatchState
    from vllm_graphsafe.plugin import registry

    patch = registry().get(PATCH_ID)
    if patch.state is not PatchState.APPLIED:
        pytest.skip(f"{PATCH_ID} is {patch.state} here (plugin switched off)")
    record = fakes.ReplayRecord()
    manager = fakes.target_manager(decode_graph(), record)
    try:
        hidden = manager.run_fullgraph(decode_graph())
        assert record.replays == 1
        assert float(hidden[0, 0]) == 1.0
        state: Any = patch.state
        assert state is PatchState.FAILED
        assert "does not replay in an if/else" in patch.reason
    finally:
        patch._failed_at_run_time = False
        registry().apply_all()
    assert patch.state is PatchState.APPLIED
