"""What the replay guard's V1 hook and its Model Runner V2 hooks share: the
warning logged once per process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from vllm_graphsafe.fixes.replay_guard import FELL_BACK, FIX

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
            FIX.id,
            FELL_BACK,
        )


WARN_ONCE = OnceWarning()
