"""The graph-hazard emulator's own vLLM general plugin (``graphsafe_emulator``):
installs the emulator (a test instrument) where ``GRAPHSAFE_EMULATE_GRAPH_HAZARD``
is on, and does nothing else."""

from __future__ import annotations

from vllm_graphsafe.settings import emulate_graph_hazard


def register() -> None:
    if emulate_graph_hazard():
        from vllm_graphsafe import emulator

        emulator.install()
