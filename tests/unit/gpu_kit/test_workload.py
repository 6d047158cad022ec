"""The GPU kit's request plan: the dangerous prompts leave exactly K+1 tokens."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.gpu_kit.kit_modules import load

workload = load("workload")

BLOCK = 272


def requests(k: int) -> dict[str, Any]:
    return {r.label: r for g in workload.plan(k, BLOCK) for r in g.requests}


@pytest.mark.parametrize("k", [0, 3])
def test_each_boundary_request_leaves_k_plus_1_tokens_after_whole_blocks(
    k: int,
) -> None:
    boundary = [r for r in requests(k).values() if r.boundary]

    assert len(boundary) == 8
    for request in boundary:
        # vLLM cuts a hybrid prompt at block boundaries; what a cache hit skips
        # is whole blocks too: the last scheduled chunk is what is left.
        assert (len(request.prompt) - request.cached) % BLOCK == k + 1, request.label
        assert len(request.prompt) in (k + 1, BLOCK + k + 1)


@pytest.mark.parametrize("k", [0, 3])
def test_the_controls_leave_one_token_more_or_fewer(k: int) -> None:
    by_label = requests(k)
    tails = {
        label: len(r.prompt) % BLOCK
        for label, r in by_label.items()
        if "longer" in label or "shorter" in label
    }
    expected = {
        "fresh_one_longer/0": k + 2,
        "block_tail_one_longer/0": k + 2,
        "prefix_tail/one_longer": k + 2,
    }
    if k:
        expected["fresh_one_shorter/0"] = k
    assert tails == expected


def test_a_prefix_tail_shares_its_first_block_with_the_prompt_before_it() -> None:
    (group,) = [g for g in workload.plan(3, BLOCK) if g.label == "prefix_tail"]
    prefix, tail, control = group.requests

    assert group.one_by_one
    assert tail.prompt[:BLOCK] == control.prompt[:BLOCK] == prefix.prompt[:BLOCK]
    assert tail.prompt[BLOCK:] != prefix.prompt[BLOCK : BLOCK + 4]
    # The prefix itself ends in K+3 tokens after its block: no boundary of its own.
    assert len(prefix.prompt) == BLOCK + 6 and not prefix.boundary


def test_inserts_arrive_while_the_long_decodes_run() -> None:
    (group,) = [g for g in workload.plan(3, BLOCK) if g.label == "decode_with_inserts"]
    kinds = {r.label.split("/")[1].rstrip("0123456789") for r in group.requests}
    decodes = [r for r in group.requests if "/decode" in r.label]
    inserts = [r for r in group.requests if "/insert" in r.label]

    assert kinds == {"decode", "insert"}
    assert [r.arrive_after for r in inserts] == list(workload.INSERT_STEPS)
    # K=3 decodes take at least a quarter of their tokens' steps: still running.
    assert all(r.max_tokens // 4 > max(workload.INSERT_STEPS) for r in decodes)
    # They sample only their prompt's five ids, so that ngram keeps finding drafts.
    assert all(len(r.allowed) == 5 == len(set(r.prompt)) for r in decodes)
    assert all(set(r.allowed) == set(r.prompt) for r in decodes)
    assert not any(r.allowed for r in inserts)


def test_the_plan_is_the_same_every_time_and_labels_are_unique() -> None:
    first, second = workload.plan(3, BLOCK), workload.plan(3, BLOCK)
    labels = [r.label for g in first for r in g.requests]

    assert first == second
    assert len(labels) == len(set(labels))
    assert workload.plan(0, BLOCK) != first
