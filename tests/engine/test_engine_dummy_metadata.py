"""A real engine's dummy runs leave consistent metadata, and generation unchanged.

With the plugin disabled the same dummy runs stage lengths that disagree with
their positions and computed lengths (the bug, on the real engine).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.engine.serving import run_engine_script

SCRIPT = Path(__file__).with_name("dummy_metadata.py")


def inconsistencies(build: dict[str, Any]) -> list[str]:
    """Every way a staged dummy batch breaks the invariants of a real batch."""
    problems = []
    offsets = build["query_start_loc"]
    scheduled = [b - a for a, b in itertools.pairwise(offsets)]
    if build["seq_lens_cpu"] != build["seq_lens_device"]:
        problems.append("CPU and device seq_lens differ")
    for req, count in enumerate(scheduled):
        seq_len, computed = build["seq_lens_cpu"][req], build["num_computed"][req]
        if count == 0:
            if computed != 0:
                problems.append(f"padded row {req} has computed length {computed}")
            continue
        if computed < 0 or seq_len != computed + count:
            problems.append(f"row {req}: seq_len {seq_len} != {computed} + {count}")
        tokens = build["positions"][offsets[req] : offsets[req] + count]
        if tokens != list(range(computed, computed + count)):
            problems.append(f"row {req}: positions {tokens[:4]}... not from {computed}")
    return problems


@pytest.fixture(scope="module")
def runs(tiny_model: Path) -> dict[str, Any]:
    return {
        "on": run_engine_script(SCRIPT, tiny_model, plugin=True),
        "off": run_engine_script(SCRIPT, tiny_model, plugin=False),
    }


def test_every_dummy_build_is_consistent(runs: dict[str, Any]) -> None:
    builds = [b for s in runs["on"]["snapshots"] for b in s["builds"]]
    assert len(builds) >= len(runs["on"]["snapshots"])
    assert [problem for b in builds for problem in inconsistencies(b)] == []


def test_long_profile_length_puts_each_query_at_its_tail(runs: dict[str, Any]) -> None:
    (build,) = runs["on"]["snapshots"][0]["builds"]
    offsets = build["query_start_loc"]
    active = [r for r in range(len(offsets) - 1) if offsets[r + 1] > offsets[r]]
    assert active
    for row in active:
        assert build["seq_lens_cpu"][row] == 4096
        assert build["positions"][offsets[row + 1] - 1] == 4095


def test_generation_is_unchanged_by_the_dummy_runs(runs: dict[str, Any]) -> None:
    assert runs["on"]["after"] == runs["on"]["before"]


def test_without_the_plugin_dummy_metadata_is_inconsistent(
    runs: dict[str, Any],
) -> None:
    builds = [b for s in runs["off"]["snapshots"] for b in s["builds"]]
    assert any(inconsistencies(b) for b in builds)
