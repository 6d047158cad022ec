"""A tqdm progress bar over the probe's requests, or nothing.

tqdm is imported only when a bar is shown.
"""

from __future__ import annotations

from typing import TextIO


class Progress:
    """Counts finished requests on a tqdm bar; silent when disabled."""

    def __init__(self, total: int, stream: TextIO, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=max(total, 1),
                desc="probe",
                unit="request",
                file=stream,
                leave=False,
                dynamic_ncols=True,
            )

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def set_total(self, total: int) -> None:
        if self._bar is not None:
            self._bar.total = max(total, 1)
            self._bar.refresh()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
