"""Is each scheduled row a decode? Decided from the scheduler's output alone,
for the worker that dispatches before the runner updates its columns (vLLM
0.20-0.31 under pipeline plus sequence parallelism: :mod:`.v1_phase_dispatch.early`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass

#: The builders' count for a row that is not a speculative decode.
NOT_A_DECODE = -1


# A dataclass, not a NamedTuple: its flags are read for every row of a step,
# and Python 3.11 reads a dataclass's attributes faster.
@dataclass(frozen=True)
class DraftCounting:
    """How ``_prepare_inputs`` counts rows' drafts. ``past_prompt``: where the
    row is past its prompt (0.22 and forks), else where it schedules exactly
    1 + its drafts (0.27 on). ``zero_draft_decodes``: a one-token row past its
    prompt counts 0 (0.32 on)."""

    past_prompt: bool = False
    zero_draft_decodes: bool = False


def decode_draft_count(
    num_scheduled: int,
    num_drafts: int | None,
    computed: int,
    prompt: int,
    counting: DraftCounting,
) -> int:
    """The builders' draft count for one row, as ``_prepare_inputs`` writes it
    (``num_drafts``: None without a ``scheduled_spec_decode_tokens`` entry)."""
    if num_drafts is not None and (
        computed >= prompt if counting.past_prompt else num_scheduled == num_drafts + 1
    ):
        return num_drafts
    if counting.zero_draft_decodes and num_scheduled == 1 and computed >= prompt:
        return 0
    return NOT_A_DECODE


def scheduled_rows_are_decodes(
    num_scheduled: Mapping[str, int],
    scheduled_drafts: Mapping[str, Sized],
    computed: Mapping[str, int],
    prompt_length: Callable[[str], int],
    num_drafts: int,
    counting: DraftCounting,
) -> bool:
    """Whether every scheduled request is a decode as the builders will see it:
    with K = ``num_drafts`` drafts, when they count exactly K for it; without,
    when it had computed a token before. ``prompt_length`` is asked only for a
    row whose count depends on it."""
    if num_drafts == 0:
        return all(computed[req_id] > 0 for req_id in num_scheduled)
    for req_id, width in num_scheduled.items():
        drafts = scheduled_drafts.get(req_id)
        reads_prompt = (counting.past_prompt and drafts is not None) or (
            counting.zero_draft_decodes and width == 1
        )
        count = decode_draft_count(
            width,
            None if drafts is None else len(drafts),
            computed[req_id],
            prompt_length(req_id) if reads_prompt else 0,
            counting,
        )
        if count != num_drafts:
            return False
    return True
