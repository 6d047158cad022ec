"""The replay guard's warning, logged once per process (V1 and MRV2 hooks)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.fixes.replay_guard import FELL_BACK, FIX
from vllm_graphsafe.fixes.replay_guard.logic import GroupPrefills, describe_step

logger = logging.getLogger(vllm_layout.LOGGER)


class OnceWarning:
    def __init__(self) -> None:
        self._done = False
        self._lock = threading.Lock()

    def __call__(
        self, where: str, reader: GroupPrefills, descriptor: Any, metadata: Any
    ) -> None:
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
            describe_step(
                getattr(descriptor, "num_tokens", None),
                getattr(descriptor, "num_reqs", None),
                reader.prefill_counts(metadata),
            ),
            FIX.id,
            FELL_BACK,
        )


WARN_ONCE = OnceWarning()
