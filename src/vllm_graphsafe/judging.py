"""A fix's judge: from vLLM's source to its :class:`Verdict`.

Each fix's ``judge`` module declares one :class:`FixJudge`; :func:`judge` is a
pure function of the source, and the verdict it returns is all the hooks are
given.
"""

from __future__ import annotations

import enum
import importlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from vllm_graphsafe import recognition
from vllm_graphsafe.behaviour.judgement import Evidence, by_reading, settled
from vllm_graphsafe.hook_points import unhooked
from vllm_graphsafe.settings import DISABLE_ENV
from vllm_graphsafe.sources import SourceReader

if TYPE_CHECKING:
    from vllm_graphsafe.fix import Fix


class PatchState(str, enum.Enum):
    APPLIED = "applied"
    NATIVE = "native"
    NOT_APPLICABLE = "not applicable"
    DISABLED = "disabled"
    FAILED = "failed"


class Point(NamedTuple):
    """Where a hook binds: ``qualname`` of ``module``, called from ``caller``
    (a qualname of the same module) where the hook needs that caller; ``role``
    names the hook the fix installs there."""

    module: str
    qualname: str
    role: str
    caller: str | None = None

    @property
    def symbol(self) -> str:
        return f"{self.module}.{self.qualname}"


class Verdict(NamedTuple):
    """What vLLM's source decides about one fix, whatever the settings."""

    anchor_exists: bool
    #: Why this vLLM has the fix (None: it does not).
    native: str | None = None
    #: Why a hook point or something a hook reads is missing (None: all there).
    missing: str | None = None
    #: How ``native`` (or its absence) was decided; None without the anchor.
    evidence: Evidence | None = None
    #: Where the hooks bind, in this vLLM's layout.
    points: tuple[Point, ...] = ()
    #: What the hooks need to know of the layout when they bind (JSON values).
    layout: Mapping[str, Any] = {}
    #: Why the fix does not apply where the anchor is absent.
    absent: str = ""

    @property
    def hook_modules(self) -> tuple[str, ...]:
        return tuple(sorted({point.module for point in self.points}))

    def settle(self, disabled: bool = False) -> tuple[PatchState, str]:
        """The fix's state on this vLLM, and why."""
        if not self.anchor_exists:
            return PatchState.NOT_APPLICABLE, self.absent
        if self.native is not None:
            # A fix vLLM has natively stays native when disabled.
            return PatchState.NATIVE, self.native
        if disabled:
            return PatchState.DISABLED, f"disabled by {DISABLE_ENV}"
        if self.missing is not None:
            return PatchState.FAILED, self.missing
        return PatchState.APPLIED, f"hooks {', '.join(self.hook_modules)} when imported"

    def to_json(self) -> dict[str, Any]:
        return {
            **self._asdict(),
            "evidence": None if self.evidence is None else self.evidence.to_json(),
            "points": [list(point) for point in self.points],
            "layout": dict(self.layout),
        }

    @classmethod
    def from_json(cls, data: Any) -> Verdict | None:
        if not isinstance(data, dict) or set(data) != set(cls._fields):
            return None
        written = data["evidence"]
        evidence = None if written is None else Evidence.from_json(written)
        points = data["points"]
        texts = (data["native"], data["missing"])
        if (
            (evidence is None and written is not None)
            or not isinstance(points, list)
            or not all(_is_point(p) for p in points)
            or not all(text is None or isinstance(text, str) for text in texts)
            or not isinstance(data["anchor_exists"], bool)
            or not isinstance(data["layout"], dict)
            or not isinstance(data["absent"], str)
        ):
            return None
        return cls(
            **{**data, "evidence": evidence, "points": tuple(Point(*p) for p in points)}
        )


def _is_point(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 4
        and all(isinstance(part, str) for part in value[:3])
        and (value[3] is None or isinstance(value[3], str))
    )


class SetsAttribute(NamedTuple):
    """A hook reads ``<attribute>`` of instances of ``owner`` in ``module``."""

    module: str
    owner: str
    attribute: str
    reader: str

    def missing(self, sources: SourceReader) -> str | None:
        if not sources.has_class(self.module, self.owner):
            return f"{self.module}.{self.owner} is missing (read by {self.reader})"
        if not sources.sets_attribute(self.module, self.owner, self.attribute):
            return (
                f"{self.module}.{self.owner} no longer sets {self.attribute} "
                f"(read by {self.reader})"
            )
        return None


class TakesParameters(NamedTuple):
    """A hook reads these parameters of ``qualname`` in ``module``."""

    module: str
    qualname: str
    parameters: tuple[str, ...]
    reader: str

    def missing(self, sources: SourceReader) -> str | None:
        node = sources.function_node(self.module, self.qualname)
        if node is None:
            return f"{self.module}.{self.qualname} is missing (read by {self.reader})"
        lacking = [
            p for p in self.parameters if p not in recognition.parameter_names(node)
        ]
        if lacking:
            return (
                f"{self.module}.{self.qualname} no longer takes "
                f"{', '.join(lacking)} (read by {self.reader})"
            )
        return None


class Requirement(Protocol):
    """What a hook reads, checked in source before anything binds: one
    sentence naming what is missing, or None."""

    def missing(self, sources: SourceReader) -> str | None: ...


Layout = Mapping[str, Any]


class FixJudge(NamedTuple):
    """What a fix reads of vLLM's source, and how it decides (where the code
    it fixes, its :attr:`~vllm_graphsafe.fix.Fix.anchor`, exists)."""

    #: What a native verdict says the code does (before its evidence).
    native_summary: str
    #: The fix's cases run on code compiled from the source; None: cannot tell.
    behaviour: Callable[[SourceReader], Evidence | None]
    #: The fallback, reading the code: why this vLLM has the fix (None: not).
    native_reason: Callable[[SourceReader], str | None]
    #: Where the hooks bind, given the layout.
    points: Callable[[Layout], list[Point]]
    #: What the hooks need to know of this vLLM's layout (JSON values).
    layout: Callable[[SourceReader], dict[str, Any]] = lambda sources: {}
    #: What the hooks read of vLLM's objects, given the layout.
    reads: Callable[[Layout], list[Requirement]] = lambda layout: []
    #: The cases run on the imported vLLM's own (unhooked) classes, if any.
    live: Callable[[], Evidence | None] | None = None
    #: Run to confirm a native verdict where the anchor is imported (None: live).
    confirm: Callable[[], Evidence | None] | None = None
    #: The modules :attr:`live` needs imported (None: the anchor alone).
    live_modules: Callable[[Verdict | None], list[str]] | None = None

    def judge(self, sources: SourceReader, absent: str) -> Verdict:
        """The verdict where the fix's anchor exists."""
        evidence = self.native_evidence(sources)
        layout = self.layout(sources)
        points = tuple(self.points(layout))
        return Verdict(
            anchor_exists=True,
            native=f"{self.native_summary} ({evidence.text()})"
            if evidence.native
            else None,
            missing=self._missing(sources, points, layout),
            evidence=evidence,
            points=points,
            layout=layout,
            absent=absent,
        )

    def native_evidence(self, sources: SourceReader) -> Evidence:
        """How native this code is: by its behaviour on the fix's cases where
        they run, else by reading it (the evidence says why)."""
        could_not_run = "the fix declares no cases to run"
        try:
            evidence = self.behaviour(sources)
        except Exception as error:  # the harness itself met code it cannot run
            evidence = None
            could_not_run = f"{type(error).__name__}: {error}"
        if evidence is not None:
            if settled(evidence):
                return evidence
            could_not_run = evidence.could_not_run or could_not_run
        return by_reading(self.native_reason(sources), could_not_run)

    def _missing(
        self, sources: SourceReader, points: tuple[Point, ...], layout: Layout
    ) -> str | None:
        for point in points:
            if sources.text(point.module) is None:
                return f"hook point {point.symbol} is missing: no module {point.module}"
            if not sources.defines(point.module, point.qualname):
                return f"hook point {point.symbol} is missing"
            leaf = point.qualname.rsplit(".", 1)[-1]
            if point.caller is not None and not sources.calls(
                point.module, point.caller, leaf
            ):
                return (
                    f"hook point {point.symbol} is no longer called from "
                    f"{point.module}.{point.caller}"
                )
        for requirement in self.reads(layout):
            missing = requirement.missing(sources)
            if missing is not None:
                return missing
        return None


def imported_class(module: str, name: str) -> type | None:
    """``module.name`` unhooked, where ``module`` is imported."""
    found = getattr(sys.modules.get(module), name, None)
    return unhooked(found) if isinstance(found, type) else None


def fix_judge(fix: Fix) -> FixJudge:
    return cast(FixJudge, importlib.import_module(f"{fix.package}.judge").JUDGE)


def judge(
    fix: Fix, sources: SourceReader, parts: Callable[[], FixJudge] | None = None
) -> Verdict:
    """The fix judged on ``sources``: not applicable where the code it fixes
    is absent (its judge, ``parts()``, is not even imported)."""
    if not sources.exists(fix.anchor):
        return Verdict(anchor_exists=False, absent=fix.absent)
    found = fix_judge(fix) if parts is None else parts()
    return found.judge(sources, fix.absent)
