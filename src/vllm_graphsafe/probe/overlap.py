"""How the inserted prompts met the long decode, measured from its stream.

The decode is asked for as many tokens as the model's context allows and is read
until every inserted prompt has been answered and a few more tokens have come
(``DecodeWatch``); then the probe closes the stream. An inserted prompt counts as
overlapping the decode when the decode had streamed before it was sent and
streamed on after its answer came back (``InsertSpan``): its prompt was then
scheduled while the decode still ran, whatever the server's speed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

#: Tokens read after the last inserted prompt is answered, so that the decode
#: steps just after it are compared too.
DECODE_TAIL_TOKENS = 16


@dataclass(frozen=True)
class InsertSpan:
    """One inserted prompt: the decode's streamed tokens when it was sent and
    when its answer came back."""

    length: int
    sent_at: int
    answered_at: int


class DecodeWatch:
    """The long decode's progress, shared by the thread reading its stream and
    the thread inserting prompts; it says when the stream may be closed."""

    def __init__(self) -> None:
        #: Set at the first streamed token, or when the stream ends without one.
        self.started = threading.Event()
        self._lock = threading.Lock()
        self._received = 0
        self._stop_at: int | None = None

    def streamed(self, total: int) -> None:
        """The reader has ``total`` tokens of the decode so far."""
        with self._lock:
            self._received = total
        if total:
            self.started.set()

    def tokens(self) -> int:
        with self._lock:
            return self._received

    def inserts_answered(self, min_tokens: int) -> None:
        """Every inserted prompt is answered: stop after a few more tokens, and
        after ``min_tokens`` at least."""
        with self._lock:
            self._stop_at = max(min_tokens, self._received + DECODE_TAIL_TOKENS)

    def abandon(self) -> None:
        """Stop at the next token: the inserting thread gave up."""
        with self._lock:
            self._stop_at = 0

    def may_stop(self) -> bool:
        with self._lock:
            return self._stop_at is not None and self._received >= self._stop_at
