"""Is each scheduled row a decode? Decided from the scheduler's output alone.

The V1 rule (:mod:`vllm_graphsafe.fixes.phase_rows`) reads the runner's
columns, which ``_prepare_inputs`` fills for the attention metadata builders
just before the runner dispatches. On vLLM 0.20-0.31 with pipeline and
sequence parallelism the worker dispatches once more, *before* the runner
updates its request state, when those columns still describe the previous
step. This module answers the same question for the step about to run, from
what the scheduler sends: each request's scheduled token count, its draft
tokens, and its computed count before the step (new requests carry theirs,
cached requests get theirs in ``scheduled_cached_reqs``).

``_prepare_inputs`` counts a row's drafts in one of two ways, depending on
the release (:class:`DraftCounting`). On releases that fill the column only on
steps that schedule drafts, a step without drafts leaves it as it was, but the
builders then get no counts at all and treat every row of more than one token
as a prefill, which is what :func:`decode_draft_count` gives such rows.
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
    """How a release's ``_prepare_inputs`` counts each row's decode drafts.

    ``past_prompt``: a row with drafts counts them where it had computed its
    whole prompt (vLLM 0.22 and its forks); otherwise where it schedules
    exactly one token plus its drafts (0.27 on). ``zero_draft_decodes``: a
    one-token row past its prompt without drafts counts 0 (0.32 on).
    """

    past_prompt: bool = False
    zero_draft_decodes: bool = False


def decode_draft_count(
    num_scheduled: int,
    num_drafts: int | None,
    computed: int,
    prompt: int,
    counting: DraftCounting,
) -> int:
    """The builders' draft count for one row, as ``_prepare_inputs`` writes it.

    ``num_drafts``: the length of the row's ``scheduled_spec_decode_tokens``
    entry, None without one; ``computed``: its computed count before the step.
    """
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
    """Whether every scheduled request is a decode as the builders will see it.

    ``num_scheduled``: tokens per request id (the scheduler's
    ``num_scheduled_tokens``); ``scheduled_drafts``: its
    ``scheduled_spec_decode_tokens``; ``computed``: each scheduled request's
    computed count before the step; ``prompt_length(req_id)``: its prompt
    length, asked only for a row whose count depends on it; ``num_drafts``: K, the
    speculative tokens per decode (0 without speculation).

    With K drafts a row is a decode when the builders count exactly K for it;
    without speculation when it had computed a token before (one new token
    over prior state, the last token of a chunked prompt included).
    """
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
