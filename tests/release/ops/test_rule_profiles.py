"""The profiles that explain the per-step rules' costs run on the installed release.

``bench/v1_rule_profile.py`` and ``bench/mrv2_worst_case_profile.py`` are what
``docs/benchmarks.md`` points to for each per-step miss: a maintainer runs them
by hand, so here they run with few calls, and each part they time must be a
time (every step they time answers as the benchmark expects, or they stop).
"""

from __future__ import annotations

import math

import pytest

from bench import mrv2_worst_case_profile, v1_rule_profile
from bench.dispatch_cost import counting_as_a_server_does, v1_runners


def test_the_v1_profile_times_the_rule_and_each_of_its_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(v1_rule_profile, "CALLS", 20)
    with counting_as_a_server_does():
        parts = v1_rule_profile.profile(v1_runners(), 256)
    differences = {"added by the phase rule", "K = 0: the rule's own cost"}
    assert set(parts) == {
        "shape rule step",
        "phase rule step",
        "  vLLM's shape rule alone",
        "  count of the decision",
        "  read of the rows' counts",
        "  the same, view and bytes made each step",
        "  read of the rows' computed counts",
        "  the same, its view sliced each step",
        *differences,
    }
    for name, micros in parts.items():
        if name not in differences:
            assert 0 < micros < 1000, name
    assert math.isclose(
        parts["added by the phase rule"],
        parts["phase rule step"] - parts["shape rule step"],
    )


def test_the_mrv2_worst_case_profile_times_each_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mrv2_worst_case_profile, "CALLS", 20)
    parts = mrv2_worst_case_profile.profile(256)
    assert len(parts) == 9
    assert all(0 < micros < 10_000 for micros in parts.values())
