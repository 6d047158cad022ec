"""The replay guard's reading of a step's attention metadata, and MRV2's eager
path found in a function's own source: no vLLM, no torch."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_graphsafe.fixes.replay_guard.eager_branch import NotASite, site_of
from vllm_graphsafe.fixes.replay_guard.logic import (
    GroupPrefills,
    counting_layers,
    describe_step,
)


class Counted:
    """A builder's metadata that counts its rows; reads of the count are tallied."""

    reads = 0

    def __init__(self, prefills: int) -> None:
        self._prefills = prefills

    @property
    def num_prefills(self) -> int:
        Counted.reads += 1
        return self._prefills


def step(*groups: int, layers_per_group: int = 3) -> dict[str, Any]:
    """One metadata object per group, shared by its layers; a full-attention
    layer whose builder counts nothing."""
    per_layer: dict[str, Any] = {}
    for index, prefills in enumerate(groups):
        metadata = Counted(prefills)
        for layer in range(layers_per_group):
            per_layer[f"g{index}.l{layer}"] = metadata
    per_layer["attention"] = SimpleNamespace(max_query_len=4)
    return per_layer


def test_a_prefill_in_any_group_is_found() -> None:
    reader = GroupPrefills()
    assert not reader.holds_prefill(step(0, 0))
    assert reader.holds_prefill(step(0, 2))
    assert reader.holds_prefill(step(1, 0))
    assert not reader.holds_prefill(None)


def test_one_read_per_group_on_a_learned_step() -> None:
    """After the first step, a decode step costs one count read per group,
    whatever the number of layers."""
    reader = GroupPrefills()
    reader.holds_prefill(step(0, 0, 0, layers_per_group=20))
    Counted.reads = 0
    assert not reader.holds_prefill(step(0, 0, 0, layers_per_group=20))
    assert Counted.reads == 3


def test_microbatches_are_each_read() -> None:
    reader = GroupPrefills()
    assert reader.holds_prefill([step(0, 0), step(0, 1)])
    assert not reader.holds_prefill([step(0, 0), step(0, 0)])


def test_other_layers_of_the_same_count_are_learned_again() -> None:
    reader = GroupPrefills()
    reader.holds_prefill({"a": Counted(0), "b": Counted(0)})
    assert reader.holds_prefill({"c": Counted(0), "d": Counted(1)})


def test_counts_that_are_not_host_integers_are_never_read() -> None:
    """A count that is not an ``int`` (a device tensor, say) would need a sync."""
    device_count = SimpleNamespace(num_prefills=SimpleNamespace())
    assert counting_layers({"x": device_count, "y": Counted(0)}) == ("y",)


def test_the_warning_names_each_group_by_its_first_layer() -> None:
    reader = GroupPrefills()
    counts = reader.prefill_counts(step(0, 2, 1))
    assert counts == {"g1.l0": 2, "g2.l0": 1}
    assert describe_step(8, 2, counts) == (
        "num_tokens=8, num_reqs=2, prefill rows per KV-cache group, named by its "
        "first layer: g1.l0: 2, g2.l0: 1"
    )


# -- MRV2: the eager path of a replay site -------------------------------------

SITE = """
import contextlib

FULL, NONE = "FULL", "NONE"
CALLS = []


@contextlib.contextmanager
def set_forward_context(attn_metadata, mode):
    CALLS.append(("context", mode, attn_metadata))
    yield


def execute_model(self, batch_desc, attn_metadata, model_inputs):
    prepared = model_inputs * 2
    if batch_desc.cg_mode == CUDAGraphMode.FULL:
        self.connector.pre_forward(batch_desc)
        model_output = self.manager.run_fullgraph(batch_desc)
    else:
        with set_forward_context(attn_metadata, batch_desc.cg_mode):
            self.connector.pre_forward(batch_desc)
            model_output = self.model(prepared)
    return model_output
"""


def load_site(
    tmp_path: Path, source: str = SITE, name: str = "execute_model"
) -> tuple[dict[str, Any], Any]:
    path = tmp_path / "site.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    namespace: dict[str, Any] = {"CUDAGraphMode": SimpleNamespace(FULL="FULL")}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace, namespace[name]


def test_the_else_of_the_replay_runs_on_the_callers_locals(tmp_path: Path) -> None:
    namespace, function = load_site(tmp_path)
    site = site_of(function.__code__, namespace)
    assert (site.descriptor, site.output) == ("batch_desc", "model_output")
    assert set(site.inputs) == {"attn_metadata", "batch_desc", "prepared", "self"}
    pre_forward: list[Any] = []
    runner = SimpleNamespace(
        model=lambda inputs: ("ran", inputs),
        connector=SimpleNamespace(pre_forward=pre_forward.append),
    )
    caller = {
        "self": runner,
        "attn_metadata": {"l": 1},
        "prepared": 6,
        "batch_desc": SimpleNamespace(cg_mode="FULL"),
        "model_inputs": 3,
    }
    output = site.run_eagerly(caller, SimpleNamespace(cg_mode="NONE"))
    assert output == ("ran", 6)
    assert namespace["CALLS"] == [("context", "NONE", {"l": 1})]
    # The FULL branch called pre_forward before its replay: not again.
    assert pre_forward == []


def test_the_eager_path_keeps_vllms_file_and_lines(tmp_path: Path) -> None:
    namespace, function = load_site(tmp_path)
    site = site_of(function.__code__, namespace)
    assert site.eager.__code__.co_filename == str(tmp_path / "site.py")
    assert site.eager.__code__.co_firstlineno > function.__code__.co_firstlineno


def test_the_metadata_read_is_the_one_the_else_runs_on(tmp_path: Path) -> None:
    """A speculator handed the target step's ``attn_metadata`` that builds its
    own for its graph (DFlash's query): its own is the one to read."""
    source = (
        "def propose(self, attn_metadata, batch_desc):\n"
        "    draft_attn_metadata = self.build(attn_metadata)\n"
        "    if batch_desc.cg_mode == CUDAGraphMode.FULL:\n"
        "        self.manager.run_fullgraph(batch_desc)\n"
        "    else:\n"
        "        self.generate(draft_attn_metadata, batch_desc.cg_mode)\n"
    )
    namespace, function = load_site(tmp_path, source, "propose")
    site = site_of(function.__code__, namespace)
    assert site.metadata == "draft_attn_metadata"
    assert "attn_metadata" not in site.inputs


@pytest.mark.parametrize(
    "source",
    [
        # No replay at all.
        "def execute_model(self, attn_metadata):\n    return self.model()\n",
        # A replay with no eager else.
        (
            "def execute_model(self, batch_desc, attn_metadata):\n"
            "    if batch_desc.cg_mode == CUDAGraphMode.FULL:\n"
            "        return self.manager.run_fullgraph(batch_desc)\n"
        ),
        # No attention metadata to read.
        (
            "def execute_model(self, batch_desc):\n"
            "    if batch_desc.cg_mode == CUDAGraphMode.FULL:\n"
            "        self.manager.run_fullgraph(batch_desc)\n"
            "    else:\n"
            "        self.model()\n"
        ),
        # An eager path over two metadata: which one the graph stands for is
        # not known.
        (
            "def execute_model(self, attn_metadata, draft_attn_metadata, batch_desc):\n"
            "    if batch_desc.cg_mode == CUDAGraphMode.FULL:\n"
            "        self.manager.run_fullgraph(batch_desc)\n"
            "    else:\n"
            "        self.generate(attn_metadata, draft_attn_metadata)\n"
        ),
    ],
)
def test_functions_without_such_a_replay_are_not_sites(
    source: str, tmp_path: Path
) -> None:
    namespace, function = load_site(tmp_path, source)
    with pytest.raises(NotASite):
        site_of(function.__code__, namespace)
