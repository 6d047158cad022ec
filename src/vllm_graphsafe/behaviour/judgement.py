"""Judging a fix native by what the code does on the bug's cases.

A fix declares its cases, each a fake step and the outcome it must get.
:func:`judge_cases` runs the target's own code on each: every case right is
``native``, a case wrong is ``needed``, and a case that cannot run (code that
needs CUDA, say) leaves the behaviour unknown: the caller reads the code.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

Step = TypeVar("Step")

#: How the verdict was reached.
BEHAVIOUR = "behaviour"
READING = "reading"


class CannotRun(Exception):
    """The target's code could not be run on a case (the reason is the message)."""


class Expect(str, enum.Enum):
    #: The hazard: a step holding a prefill row must not replay the FULL decode graph.
    KEPT_OFF = "kept off the FULL decode graph"
    #: A genuine decode batch keeps the FULL decode graph.
    KEPT_ON = "keeps the FULL decode graph"
    #: The fix's own result must hold (e.g. consistent staged metadata).
    HOLDS = "holds"


class Case(NamedTuple, Generic[Step]):
    """One fake step, what it must get, and how to say it."""

    #: E.g. "a fresh 5-token prompt (K=4)".
    name: str
    expect: Expect
    step: Step


class Outcome(NamedTuple):
    """What the target's code did with one case: ``right``, and in words."""

    right: bool
    #: E.g. "got FULL uniform decode", "ran without the FULL graph".
    said: str


class Evidence(NamedTuple):
    """How a verdict was reached, for people and for ``--json``."""

    how: str
    #: Cases that got the outcome they must (behaviour only).
    passed: int = 0
    total: int = 0
    #: The first case that got the wrong outcome, in words.
    failed: str | None = None
    #: Why the code could not be run (reading only; or some cases, behaviour).
    could_not_run: str | None = None
    #: What reading the code found (reading only).
    reading: str | None = None
    #: Reading only: whether it found the fix.
    found: bool = False
    #: How the cases ran, where that needs saying (e.g. compiled from source).
    note: str | None = None

    @property
    def native(self) -> bool:
        if self.how == BEHAVIOUR:
            return self.failed is None and self.passed == self.total > 0
        return self.found

    def text(self) -> str:
        """E.g. ``behaviour: 14/14 cases`` or ``reading: ...; could not run: ...``."""
        if self.how == BEHAVIOUR:
            said = f"{self.passed}/{self.total} cases"
            if self.note:
                said += f", {self.note}"
            if self.failed is not None:
                return f"behaviour: {self.failed}; {said}"
        else:
            said = self.reading or "no fix found in the code"
        if self.could_not_run:
            said += f"; could not run: {self.could_not_run}"
        return f"{self.how}: {said}"

    def finding(self) -> str:
        """``native (behaviour: 37/37 cases)``, ``needed (reading: ...)``."""
        return f"{'native' if self.native else 'needed'} ({self.text()})"

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "text": self.text()}

    @classmethod
    def from_json(cls, data: Any) -> Evidence | None:
        if not isinstance(data, Mapping) or data.get("how") not in (BEHAVIOUR, READING):
            return None
        values: list[Any] = [data.get(name) for name in cls._fields]
        found = cls(*values)
        texts = (found.failed, found.could_not_run, found.reading, found.note)
        if (
            isinstance(found.passed, int)
            and isinstance(found.total, int)
            and isinstance(found.found, bool)
            and all(text is None or isinstance(text, str) for text in texts)
        ):
            return found
        return None


def judge_cases(
    cases: Iterable[Case[Step]], run: Callable[[Case[Step]], Outcome]
) -> Evidence:
    """Run every case; ``CannotRun`` (or any exception) from ``run`` marks it
    unknown. A wrong outcome decides ``needed`` even where others could not run;
    otherwise a case that could not run leaves the behaviour unknown
    (``could_not_run`` set, ``how`` still behaviour: the caller reads instead)."""
    cases = list(cases)
    passed = 0
    failures: list[Case[Step]] = []
    said: dict[str, str] = {}
    could_not_run: str | None = None
    for case in cases:
        try:
            outcome = run(case)
        except Exception as error:  # CannotRun, or the target's own code failed
            why = str(error)
            if not isinstance(error, CannotRun):
                why = f"{type(error).__name__}: {why}"
            could_not_run = could_not_run or f"{case.name}: {why}"
            continue
        if outcome.right:
            passed += 1
        else:
            failures.append(case)
            said[case.name] = outcome.said
    return Evidence(
        BEHAVIOUR,
        passed=passed,
        total=len(cases),
        failed=_first_failure(cases, failures, said),
        could_not_run=could_not_run,
    )


def _first_failure(
    cases: list[Case[Any]], failures: list[Case[Any]], said: Mapping[str, str]
) -> str | None:
    if not failures:
        return None
    kept_on = [case for case in cases if case.expect is Expect.KEPT_ON]
    if kept_on and all(case in failures for case in kept_on):
        return (
            "every genuine decode batch lost the FULL decode graph "
            f"(e.g. {kept_on[0].name} {said[kept_on[0].name]}): sending every "
            "batch off the graph is not the fix"
        )
    first = failures[0]
    return f"{first.name} {said[first.name]}"


def graph_outcome(case: Case[Any], full: bool, said: str) -> Outcome:
    """Right where a case to keep off the FULL decode graph did not get it
    (``full``), and any other case did."""
    return Outcome(full != (case.expect is Expect.KEPT_OFF), said)


def settled(evidence: Evidence) -> bool:
    """Whether the behaviour decided the verdict (no fallback to reading)."""
    return evidence.how == BEHAVIOUR and (
        evidence.failed is not None or evidence.could_not_run is None
    )


def by_reading(reason: str | None, could_not_run: str | None) -> Evidence:
    """The fallback where the cases cannot run: ``reason`` is what reading
    found (None: no fix). The verdict stays ``needed`` either way: reading
    recognises a fix by its spelling, and a look-alike spelled like one (a
    reversed comparison, the first row only) would read as native, the most
    harmful answer there is. The evidence says what was read."""
    return Evidence(
        READING,
        could_not_run=could_not_run,
        reading=(
            f"{reason}, but its behaviour is unconfirmed"
            if reason is not None
            else "no fix found in the code"
        ),
    )
