"""The graph-hazard emulator's own vLLM general plugin (``graphsafe_emulator``).

vLLM loads it in every process, as it loads the fixes' plugin; it loads the
emulator (:mod:`vllm_graphsafe.emulator`, a test instrument) only where
``GRAPHSAFE_EMULATE_GRAPH_HAZARD`` is on, and does nothing else.
"""

from __future__ import annotations

from vllm_graphsafe.settings import emulate_graph_hazard


def register() -> None:
    if emulate_graph_hazard():
        from vllm_graphsafe import emulator

        emulator.install()
