"""The emulator's physical mode (docs/emulator.md, "Physical mode").

Nothing replaces sampled ids: a hazardous step's gated delta-net metadata is
built as the captured FULL decode graph's replay assumes it (every row a
decode, and the state slots the last pure decode step staged), so vLLM's own
kernels corrupt the recurrent state.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

#: ``physical`` switches the physical mode on (the main switch must be on too).
MODE_ENV = "GRAPHSAFE_EMULATE_GRAPH_HAZARD_MODE"
PHYSICAL = "physical"
IDS = "ids"
#: The slot vLLM's builders fill unused rows with (``NULL_BLOCK_ID``).
NULL_SLOT = 0


def _value(environ: Mapping[str, str] | None) -> str:
    env = os.environ if environ is None else environ
    return (env.get(MODE_ENV) or "").strip().lower()


def mode(environ: Mapping[str, str] | None = None) -> str:
    """``physical`` or ``ids`` (the default: sampled ids replaced)."""
    return PHYSICAL if _value(environ) == PHYSICAL else IDS


def mode_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """One sentence when ``MODE_ENV`` holds a value this emulator does not know."""
    value = _value(environ)
    if value in ("", PHYSICAL, IDS):
        return None
    return (
        f"{MODE_ENV}={value!r} is not a mode of the graph-hazard emulator "
        f"({IDS!r} or {PHYSICAL!r}); it runs in mode {IDS!r}."
    )


class StagedBuffers:
    """A builder's persistent FULL-graph buffers: the last pure decode step's
    state slots and accepted counts (vLLM's CPU build, having no graphs,
    stages nothing, so the emulator keeps its own copy)."""

    def __init__(self) -> None:
        self.slots: Any = None  # (rows, K+1) or (rows,) int tensor
        self.accepted: Any = None  # (rows,) int tensor, speculative only

    def record(self, metadata: Any) -> None:
        """Stage ``metadata`` when it is a pure decode batch, as vLLM would."""
        if metadata.num_prefills:
            return
        if metadata.num_spec_decodes and not metadata.num_decodes:
            rows = metadata.num_spec_decodes
            self.slots = _staged(self.slots, metadata.spec_state_indices_tensor[:rows])
            self.accepted = _staged(
                self.accepted, metadata.num_accepted_tokens[:rows], fill=1
            )
        elif metadata.num_decodes and not metadata.num_spec_decodes:
            rows = metadata.num_decodes
            self.slots = _staged(
                self.slots, metadata.non_spec_state_indices_tensor[:rows]
            )

    def replayed(self, metadata: Any) -> Any:
        """``metadata`` with the slots (and accepted counts) the replay reads."""
        if self.slots is None:
            return metadata  # no decode staged yet: the capture's own slots
        if metadata.num_spec_decodes:
            rows = metadata.num_spec_decodes
            return dataclasses.replace(
                metadata,
                spec_state_indices_tensor=_rows(self.slots, rows, NULL_SLOT),
                num_accepted_tokens=_rows(self.accepted, rows, 1),
            )
        rows = metadata.num_decodes
        return dataclasses.replace(
            metadata, non_spec_state_indices_tensor=_rows(self.slots, rows, NULL_SLOT)
        )


def decode_draft_counts(query_start_loc_cpu: Any) -> Any:
    """Each row a speculative decode with ``query_len - 1`` drafts (the capture's)."""
    import torch

    return (query_start_loc_cpu[1:] - query_start_loc_cpu[:-1] - 1).to(torch.int32)


def _staged(buffer: Any, values: Any, fill: int = NULL_SLOT) -> Any:
    """``buffer`` with its first rows overwritten by ``values`` (grown if needed)."""
    values = values.detach().to("cpu").clone()
    if buffer is None or buffer.shape[1:] != values.shape[1:]:
        return values
    if buffer.shape[0] < values.shape[0]:
        buffer = _rows(buffer, values.shape[0], fill)
    buffer[: values.shape[0]] = values
    return buffer


def _rows(buffer: Any, rows: int, fill: int) -> Any:
    """The first ``rows`` rows of ``buffer``, padded with ``fill``."""
    import torch

    if buffer is None:
        return None
    out = torch.full((rows, *buffer.shape[1:]), fill, dtype=buffer.dtype)
    count = min(rows, buffer.shape[0])
    out[:count] = buffer[:count]
    return out
