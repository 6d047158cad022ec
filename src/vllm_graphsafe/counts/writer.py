"""The thread that writes a process's record, and the last write at exit."""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

#: How often the writer thread looks for new counts. The counts pages already
#: hold every count (vLLM 0.32 SIGKILLs its engine core and workers on SIGTERM,
#: with no time to write): the record is for patch states and for readers of the
#: record alone, so a look every quarter second is enough. A look costs a few
#: microseconds; a write happens only when a count changed.
WRITE_INTERVAL_S = 0.25
#: How often it also compares the whole record (patch states change rarely).
FULL_CHECK_INTERVAL_S = 0.5


class RecordWriter:
    """Calls ``flush()`` on its own thread whenever ``total()`` has changed."""

    def __init__(self, flush: Callable[[], None], total: Callable[[], int]) -> None:
        self._flush = flush
        self._total = total
        self._thread: threading.Thread | None = None
        self._pending_announcement: tuple[logging.Logger, str] | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(
            target=self._write_loop, name="graphsafe-stats-writer", daemon=True
        )
        self._thread.start()

    def announce(self, target: logging.Logger, message: str) -> None:
        """Log ``message`` at INFO now, or once vLLM has configured its logging:
        its API server does so after loading the plugins."""
        if _can_log_info(target) or self._thread is None:
            target.info("%s", message)
        else:
            self._pending_announcement = (target, message)

    def _write_loop(self) -> None:
        written_total = -1
        next_full_check = 0.0
        while True:
            time.sleep(WRITE_INTERVAL_S)
            try:
                # Counts only grow: a changed total is a changed count.
                total = self._total()
                now = time.monotonic()
                if total == written_total and now < next_full_check:
                    continue
                written_total, next_full_check = total, now + FULL_CHECK_INTERVAL_S
                pending = self._pending_announcement
                if pending is not None and _can_log_info(pending[0]):
                    self._pending_announcement = None
                    pending[0].info("%s", pending[1])
                self._flush()
            except Exception:  # the writer must never take the process down
                continue


def _can_log_info(target: logging.Logger) -> bool:
    return target.isEnabledFor(logging.INFO) and target.hasHandlers()


def install_exit_hooks(flush: Callable[[], None]) -> None:
    """Call ``flush`` when this process ends: normal exit, a multiprocessing
    child's return, SIGTERM or SIGINT (vLLM's own handler runs after it)."""
    atexit.register(flush)
    # vLLM's engine core and workers are multiprocessing children, which end
    # with os._exit: atexit never runs there, multiprocessing's finalizers do.
    multiprocessing.util.Finalize(None, flush, exitpriority=100)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            chain_signal_handler(signum, flush)


def chain_signal_handler(signum: int, before: Callable[[], None]) -> None:
    """Run ``before`` on ``signum``, then whatever handled it until now (a
    default action is re-delivered with the default disposition)."""
    previous = signal.getsignal(signum)
    if previous is None:  # installed outside Python: leave it alone
        return

    def handler(received: int, frame: FrameType | None) -> None:
        with contextlib.suppress(Exception):
            before()
        if callable(previous):
            previous(received, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(received, signal.SIG_DFL)
            os.kill(os.getpid(), received)

    try:
        signal.signal(signum, handler)
    except (ValueError, OSError):  # not the main thread, or not allowed here
        return
