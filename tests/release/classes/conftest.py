"""Class-level tests run the installed vLLM release's real runner code.

The plugin is applied the way vLLM applies it, through ``register()``; with
``VLLM_GRAPHSAFE_DISABLE=all`` (the negative control) the same tests run on
stock vLLM and must fail wherever the release lacks a fix.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def graphsafe_plugin() -> None:
    from vllm_graphsafe.plugin import register

    register()
