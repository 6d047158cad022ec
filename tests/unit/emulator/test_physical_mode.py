"""Which mode the graph-hazard emulator runs in, from its environment."""

from __future__ import annotations

import pytest

from vllm_graphsafe.emulator import physical


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (None, "ids"),
        ("", "ids"),
        ("ids", "ids"),
        ("physical", "physical"),
        (" Physical ", "physical"),
        ("phys", "ids"),
    ],
)
def test_mode_from_the_environment(value: str | None, mode: str) -> None:
    env = {} if value is None else {physical.MODE_ENV: value}
    assert physical.mode(env) == mode


def test_an_unknown_mode_gets_one_sentence() -> None:
    problem = physical.mode_problem({physical.MODE_ENV: "phys"})
    assert problem is not None
    assert "'phys'" in problem and "'physical'" in problem
    assert physical.mode_problem({physical.MODE_ENV: "physical"}) is None
    assert physical.mode_problem({}) is None
