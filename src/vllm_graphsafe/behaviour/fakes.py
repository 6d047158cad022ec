"""Fakes shared by the fixes' cases: each holds what a case sets, and a
stand-in for anything else the target's code reads."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from vllm_graphsafe.behaviour.stand_in import StandIn


class Fake:
    """A record: the attributes given, and a stand-in for any other."""

    def __init__(self, _name: str = "fake", **attributes: Any) -> None:
        self.__dict__["_fake_name"] = _name
        self.__dict__.update(attributes)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandIn(f"{self.__dict__['_fake_name']}.{name}")

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.__dict__.items() if k != "_fake_name"}
        return f"Fake({self.__dict__['_fake_name']}, {shown})"


class Row(NamedTuple):
    """One request of a step: its prompt (after preemption, every token it
    recomputes), what it computed before the step, what the step schedules
    for it (drafts included) and how many drafts."""

    prompt: int
    computed: int
    scheduled: int
    drafts: int = 0
    #: First scheduled this step (the scheduler output's new requests).
    new: bool = False


def decode_row(k: int, offset: int = 0) -> Row:
    return Row(prompt=12 + offset, computed=40 + offset, scheduled=k + 1, drafts=k)


def fresh_row(k: int) -> Row:
    return Row(prompt=k + 1, computed=0, scheduled=k + 1, new=True)


def chunk_rows(k: int) -> list[tuple[str, Row]]:
    """The prompt chunks of K+1 tokens over prior state, in words: a chunked
    prompt's tail, and what is left of a prompt after a prefix-cache hit."""
    q = k + 1
    return [
        (
            f"the {q}-token tail of a chunked {256 + q}-token prompt",
            Row(256 + q, 256, q),
        ),
        (
            f"a {16 + q}-token prompt after a 16-token prefix-cache hit",
            Row(16 + q, 16, q, new=True),
        ),
    ]


def req_id(index: int) -> str:
    return f"req-{index}"


def scheduler_output(rows: Sequence[Row], **fields: Any) -> Fake:
    """A step's ``SchedulerOutput``: what it schedules for each row (drafts
    apart too), and ``fields``."""
    scheduled = {req_id(i): row.scheduled for i, row in enumerate(rows)}
    return Fake(
        "SchedulerOutput",
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={
            req_id(i): [0] * row.drafts for i, row in enumerate(rows) if row.drafts
        },
        **fields,
    )


class FallbackGraphMode(enum.Enum):
    """vLLM's CUDA-graph runtime modes, where the code's own enum is not found."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2


def mode_name(mode: Any) -> str | None:
    """``FULL``, ``PIECEWISE`` or ``NONE`` for a graph mode of any release."""
    name = getattr(mode, "name", None)
    return name if isinstance(name, str) else None


def member(modes: Any, name: str) -> Any:
    """``modes.<name>`` of the code's own enum, else of the fallback."""
    found = getattr(modes, name, None)
    return found if mode_name(found) == name else FallbackGraphMode[name]


def descriptor(descriptor_type: Any, **fields: Any) -> Any:
    """A batch descriptor of the code's own type with as many of ``fields``
    as it takes (``num_tokens`` at least), else a record of them."""
    if callable(descriptor_type) and not isinstance(descriptor_type, StandIn):
        wanted = dict(fields)
        while wanted:
            try:
                return descriptor_type(**wanted)
            except TypeError:
                wanted.popitem()
    return Fake("BatchDescriptor", **fields)


class GraphDispatcher:
    """vLLM's ``CudagraphDispatcher`` with FULL_AND_PIECEWISE graphs captured:
    a uniform-decode batch gets the FULL decode graph (where FULL is allowed),
    any other batch the piecewise graphs. Records the mode each call got."""

    #: 1Cat-vLLM asks its dispatcher for attention-context buckets first.
    has_attention_context_buckets = False

    def __init__(self, modes: Any, descriptor_type: Any) -> None:
        self.modes = modes
        self.descriptor_type = descriptor_type
        self.calls: list[str] = []

    def dispatch(
        self,
        num_tokens: int,
        uniform_decode: bool = False,
        has_lora: bool = False,
        *args: Any,
        valid_modes: Any = None,
        invalid_modes: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        none, piecewise, full = (
            member(self.modes, "NONE"),
            member(self.modes, "PIECEWISE"),
            member(self.modes, "FULL"),
        )
        allowed = set(valid_modes) if valid_modes else {none, piecewise, full}
        allowed -= set(invalid_modes or ())
        if uniform_decode and full in allowed:
            mode = full
        elif piecewise in allowed:
            mode = piecewise
        else:
            mode = none
        self.calls.append(str(mode_name(mode)))
        return mode, descriptor(
            self.descriptor_type,
            num_tokens=num_tokens,
            uniform=bool(uniform_decode) and mode is full,
            has_lora=has_lora,
        )


class ReachedSync(Exception):
    def __init__(self, offered: Mapping[str, Any]) -> None:
        super().__init__("reached the data-parallel sync")
        self.offered = dict(offered)


def reached_sync(**offered: Any) -> Any:
    raise ReachedSync(offered)


#: The forward context a case's compiled code finds (vLLM's
#: ``get_forward_context``); None outside a case.
FORWARD_CONTEXT_SLOT: list[Any] = [None]

#: Names every judgement's compiled code sees replaced (see ``shared_code``).
OVERRIDES: dict[str, Any] = {
    # vLLM's cross-rank sync of the V1 dispatch (``vllm.v1.worker.dp_utils``).
    "coordinate_batch_across_dp": reached_sync,
    "get_forward_context": lambda: FORWARD_CONTEXT_SLOT[0],
    "is_forward_context_available": lambda: FORWARD_CONTEXT_SLOT[0] is not None,
}
