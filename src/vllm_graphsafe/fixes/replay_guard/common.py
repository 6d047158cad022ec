"""What the replay guard's V1 hook and its Model Runner V2 hooks share: the
warning logged once per process, and the questions they ask of vLLM's code."""

from __future__ import annotations

import ast
import logging
import threading
from collections.abc import Callable

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes.replay_guard import FELL_BACK, FIX
from vllm_graphsafe.sources import SourceReader

PATCH_ID = FIX.id

logger = logging.getLogger("vllm.graphsafe")


class OnceWarning:
    """Logs the first step the guard ran without the graph, once per process."""

    def __init__(self) -> None:
        self._done = False
        self._lock = threading.Lock()

    def __call__(self, where: str, shape: Callable[[], str]) -> None:
        if self._done:
            return
        with self._lock:
            if self._done:
                return
            self._done = True
        logger.warning(
            "vllm-graphsafe: a step whose attention metadata holds a prompt "
            "(prefill) row was about to replay %s; it ran without the graph "
            "instead (%s). Every such step is counted in "
            'graphsafe_dispatch_decisions_total{patch="%s",decision="%s"}; this '
            "message is logged once per process.",
            where,
            shape(),
            PATCH_ID,
            FELL_BACK,
        )


WARN_ONCE = OnceWarning()


def reads_prefill_counts(
    sources: SourceReader, modules: tuple[str, ...], node: ast.AST, depth: int = 2
) -> bool:
    """Whether ``node``, or a function of ``modules`` it calls by name (and so
    on, ``depth`` calls deep), reads the builders' ``num_prefills``."""
    if "num_prefills" in recognition.referenced_names(node):
        return True
    if depth == 0:
        return False
    for call in recognition.calls(node):
        if not isinstance(call.func, ast.Name):
            continue
        for module in modules:
            if not sources.defines(module, call.func.id):
                continue
            helper = sources.function_node(module, call.func.id)
            if helper is not None and reads_prefill_counts(
                sources, modules, helper, depth - 1
            ):
                return True
    return False


def stores_attribute(node: ast.AST, attribute: str) -> bool:
    """Whether code inside ``node`` assigns to some ``<x>.<attribute>``."""
    for child in recognition.walk(node):
        if isinstance(child, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = child.targets if isinstance(child, ast.Assign) else [child.target]
            if any(
                isinstance(target, ast.Attribute) and target.attr == attribute
                for target in targets
            ):
                return True
    return False
