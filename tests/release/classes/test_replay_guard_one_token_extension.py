"""The replay guard respects upstream's one-token prompt extension (0.31+).

Model Runner V2 runs one new prompt token over prior state, padded with K
placeholder drafts under speculation, as a decode (``prefill_runs_as_decode_np``
in ``gather_batch_req_state``), and the release's hybrid builders count such a
row as a decode: Mamba's ``padded_prompt_tail_rows``, gated delta-net's
resumed one-token chunk. The step's metadata here is the release's own
(:mod:`tests.support.vllm_fakes.hybrid_metadata`: its gather, its model
state, its GDN or Mamba2 builder); the guard sits at the FULL decode graph's
replay in the release's ``execute_model`` and in each speculator's draft
prefill (:mod:`tests.support.vllm_fakes.mrv2_replay`). A step whose metadata
counts the extension as a decode replays, and a replay is counted; a step whose
metadata holds a real prompt row of the decode width (a K+1-token chunk, or a
first one-token prompt without speculation) runs vLLM's eager path instead.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.vllm_fakes import hybrid_metadata
from tests.support.vllm_fakes import mrv2_replay as fakes
from tests.support.vllm_fakes.mrv2_state import Req
from vllm_graphsafe import counts
from vllm_graphsafe.fixes.replay_guard import DRAFT_EVENT_PREFIX, REPLAYED

if not hybrid_metadata.has_one_token_extension():
    pytest.skip(
        "this release's Model Runner V2 runs no one-token prompt extension as a "
        "decode (its input batch has no prefill_runs_as_decode_np, added in 0.31), "
        "and its builders lack the matching rule",
        allow_module_level=True,
    )

PATCH_ID = "replay-guard"
regression = pytest.mark.regression(PATCH_ID)
BUILDERS = sorted(hybrid_metadata.BUILDERS)
#: Where the step's decode graph replays, with the speculative tokens checked
#: there: the target's step, and each speculator's draft prefill (K = 1: its
#: prefill runs on the step's metadata, the K+1 width is the target's).
CASES = [
    *(pytest.param("target", k, id=f"target-k{k}") for k in (0, 1, 3)),
    *(
        pytest.param(name, 1, id=f"{name}-k1")
        for _, name in fakes.speculator_module_names()
    ),
]


def decodes(k: int) -> dict[str, Req]:
    return {
        f"decode-{i}": Req(20 + i, 30 + i, k + 1, drafts=k, previous=29 + i)
        for i in range(2)
    }


def one_token_extension(k: int) -> dict[str, Req]:
    """Its prompt's last token over 40 computed ones, with K placeholder drafts."""
    return {**decodes(k), "extension": Req(41, 40, k + 1, drafts=k, previous=40)}


def prompt_chunk(k: int) -> dict[str, Req]:
    """A real prompt row of the decode width: K+1 prompt tokens over 40 computed
    ones, or (K = 0) a first prompt of one token."""
    chunk = Req(100, 40, k + 1, previous=40) if k else Req(1, 0, 1, new=True)
    return {**decodes(k), "chunk": chunk}


@pytest.fixture(autouse=True)
def fresh_counts() -> Any:
    counts.STATS.reset()
    yield
    counts.STATS.reset()


def prefill_rows(metadata: dict[str, Any]) -> int:
    return int(metadata[hybrid_metadata.LAYERS[0]].num_prefills)


def replay_step(
    site: str, k: int, metadata: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[fakes.ReplayRecord, str]:
    """The step's FULL decode graph dispatched at ``site`` over ``metadata``;
    the record and the prefix of the guard's counts there."""
    graph = fakes.descriptor(uniform_token_count=k + 1)
    if site == "target":
        runner, record = fakes.make_runner(monkeypatch, graph, metadata)
        fakes.run_target_step(runner)
        return record, ""
    (module,) = [m for m, name in fakes.speculator_module_names() if name == site]
    speculator, record = fakes.make_speculator(
        module, site, monkeypatch, graph, metadata
    )
    fakes.propose(speculator, metadata)
    return record, DRAFT_EVENT_PREFIX


def replayed(record: fakes.ReplayRecord) -> bool:
    eager = record.model_calls or record.draft_prefills
    return record.replays == 1 and not eager


@pytest.mark.parametrize(("site", "k"), CASES)
@pytest.mark.parametrize("builder", BUILDERS)
def test_a_one_token_prompt_extension_replays_the_decode_graph(
    builder: str, k: int, site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metadata = hybrid_metadata.step_metadata(
        one_token_extension(k), k, builder, monkeypatch
    )
    assert prefill_rows(metadata) == 0, "the release's builder counts a prefill"

    record, prefix = replay_step(site, k, metadata, monkeypatch)

    assert replayed(record)
    assert counts.STATS.snapshot().get(PATCH_ID, {}) == {prefix + REPLAYED: 1}


@regression
@pytest.mark.parametrize(("site", "k"), CASES)
@pytest.mark.parametrize("builder", BUILDERS)
def test_a_prompt_row_of_the_decode_width_leaves_the_graph(
    builder: str, k: int, site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metadata = hybrid_metadata.step_metadata(prompt_chunk(k), k, builder, monkeypatch)
    assert prefill_rows(metadata) == 1, "the release's builder counts no prefill"

    record, _ = replay_step(site, k, metadata, monkeypatch)

    # vLLM's eager path ran instead of the graph (what the plugin counts is
    # the counting tests' concern: a source edit of the fix counts nothing).
    assert record.replays == 0
    assert len(record.model_calls) + len(record.draft_prefills) == 1
