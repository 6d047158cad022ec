"""The emulator loads only when its variable is set, and doctor can describe it."""

from __future__ import annotations

import os

import pytest

from tests.scripts import last_answer

SWITCH = "GRAPHSAFE_EMULATE_GRAPH_HAZARD"

# One fresh interpreter (the plugin's start-up is the cost): the package's
# vLLM general plugins, found as vLLM finds them, run under each switch value
# in turn; after each, is the emulator imported, and does it wait for the V1
# runner's import.
_PROBE = """
import importlib.metadata, json, os, sys
plugins = [
    entry.load()
    for entry in importlib.metadata.entry_points(group="vllm.general_plugins")
    if entry.value.startswith("vllm_graphsafe.")
]
assert len(plugins) == 2, plugins
seen = {}
for value in ("unset", "", "0", "no", "1"):
    if value == "unset":
        os.environ.pop("GRAPHSAFE_EMULATE_GRAPH_HAZARD", None)
    else:
        os.environ["GRAPHSAFE_EMULATE_GRAPH_HAZARD"] = value
    for register in plugins:
        register()
    emulator = sys.modules.get("vllm_graphsafe.emulator")
    seen[value] = [emulator is not None, bool(emulator and emulator.installed())]
print(json.dumps(seen))
"""


def test_never_loaded_unless_switched_on() -> None:
    env = {k: v for k, v in os.environ.items() if k != SWITCH}
    env["GRAPHSAFE_DISABLE"] = "all"
    seen = last_answer(["-c", _PROBE], env, timeout=300)
    # [imported, waiting for the runner] after each value, in this order.
    assert seen == {
        "unset": [False, False],
        "": [False, False],
        "0": [False, False],
        "no": [False, False],
        "1": [True, True],
    }


def test_describe_for_doctor(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_graphsafe import emulator

    monkeypatch.delenv(SWITCH, raising=False)
    off = emulator.describe()
    assert off["requested"] is False
    assert off["variable"] == SWITCH
    assert off["summary"].startswith("off")

    monkeypatch.setenv(SWITCH, "1")
    on = emulator.describe()
    assert on["requested"] is True
    assert "test instrument" in on["summary"]
