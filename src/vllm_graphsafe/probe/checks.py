"""The probe's checks (docs/operations.md describes each): small pure functions of
the answers it collected. A check that could not run (``SKIP``) says why in its
detail; a probe holding one never passes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import zip_longest
from typing import Any

from vllm_graphsafe.probe.settings import REPETITION_THRESHOLD

PASS = "pass"
FAIL = "fail"
SKIP = "skip"

CHECK_NAMES = (
    "vocab",
    "repetition",
    "cold_warm",
    "controls",
    "concurrent",
    "ongoing_decode",
)


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None


@dataclass(frozen=True)
class Sample:
    """One answer, with its prompt's length and kind and the phase that asked."""

    length: int
    phase: str
    output: Completion
    prompt: str = "padded instruction"


@dataclass(frozen=True)
class CheckResult:
    name: str
    lengths: tuple[int, ...]
    status: str
    detail: str

    @property
    def length_label(self) -> str:
        return "+".join(str(length) for length in self.lengths) or "-"


def out_of_vocab_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    return [token_id for token_id in token_ids if not 0 <= token_id < vocab_size]


def trailing_run(items: Sequence[Any]) -> tuple[Any, int]:
    """The last item and how many times it repeats at the end."""
    if not items:
        return None, 0
    last = items[-1]
    others = (index for index, item in enumerate(reversed(items)) if item != last)
    return last, next(others, len(items))


def degenerate_repetition(output: Completion) -> str | None:
    """Describe a run of one token or one character at the end, if long enough."""
    token, token_count = trailing_run(output.token_ids)
    if token_count >= REPETITION_THRESHOLD:
        return f"token {token} repeated {token_count} times"
    char, char_count = trailing_run(output.text)
    if char_count >= REPETITION_THRESHOLD:
        return f"{char!r} repeated {char_count} times"
    return None


def anomalies(outputs: Iterable[Completion], vocab_size: int | None) -> set[str]:
    """The kinds of garbage the answers show."""
    kinds: set[str] = set()
    for output in outputs:
        if vocab_size is not None and out_of_vocab_ids(output.token_ids, vocab_size):
            kinds.add("out-of-vocabulary ids")
        if degenerate_repetition(output) is not None:
            kinds.add("degenerate repetition")
    return kinds


def same_output(left: Completion, right: Completion) -> bool:
    return left.token_ids == right.token_ids and left.text == right.text


def describe_difference(left: Completion, right: Completion) -> str:
    """Where the token ids first differ; the shorter side reads "end"."""
    pairs = zip_longest(left.token_ids, right.token_ids, fillvalue="end")
    for index, (a, b) in enumerate(pairs):
        if a != b:
            return f"token {index}: {a} vs {b}"
    return "same ids but different text"


def check_vocab(
    lengths: tuple[int, ...],
    samples: Sequence[Sample],
    vocab_size: int | None,
    subject: str = "",
) -> CheckResult:
    """``subject`` prefixes the detail of a check that ran."""
    result = partial(CheckResult, "vocab", lengths)
    if vocab_size is None:
        return result(
            SKIP,
            "the server did not state the model's vocabulary size; pass --vocab-size",
        )
    bad_phases: dict[str, None] = {}
    bad_ids: set[int] = set()
    for sample in samples:
        found = out_of_vocab_ids(sample.output.token_ids, vocab_size)
        if found:
            bad_phases[sample.phase] = None
            bad_ids.update(found)
    if bad_ids:
        examples = ", ".join(str(i) for i in sorted(bad_ids)[:5])
        return result(
            FAIL,
            f"{subject}ids {examples} >= vocab size {vocab_size} "
            f"in {', '.join(bad_phases)}",
        )
    return result(PASS, f"{subject}{len(samples)} answers, all ids < {vocab_size}")


def check_repetition(
    length: int,
    boundary_outputs: Sequence[Completion],
    control_outputs: Mapping[int, Sequence[Completion]],
) -> CheckResult:
    result = partial(CheckResult, "repetition", (length,))
    found = [p for o in boundary_outputs if (p := degenerate_repetition(o))]
    if not found:
        return result(PASS, f"no run of {REPETITION_THRESHOLD}+ at the end")
    in_controls = [
        p
        for outputs in control_outputs.values()
        for o in outputs
        if (p := degenerate_repetition(o))
    ]
    if in_controls:
        return result(PASS, f"{found[0]}, as in the controls ({in_controls[0]})")
    controls = ", ".join(str(n) for n in sorted(control_outputs))
    return result(FAIL, f"{found[0]}; controls {controls} show no such run")


def check_cold_warm(length: int, cold: Completion, warm: Completion) -> CheckResult:
    result = partial(CheckResult, "cold_warm", (length,))
    if same_output(cold, warm):
        return result(PASS, f"identical {len(cold.token_ids)} tokens")
    return result(
        FAIL, f"warm answer differs from cold at {describe_difference(cold, warm)}"
    )


def check_controls(
    length: int,
    boundary_outputs: Sequence[Completion],
    control_outputs: Mapping[int, Sequence[Completion]],
    vocab_size: int | None,
) -> CheckResult:
    result = partial(CheckResult, "controls", (length,))
    controls = ", ".join(str(n) for n in sorted(control_outputs))
    every_control = (o for outputs in control_outputs.values() for o in outputs)
    control_kinds = anomalies(every_control, vocab_size)
    extra = sorted(anomalies(boundary_outputs, vocab_size) - control_kinds)
    if extra:
        return result(FAIL, f"{' and '.join(extra)}, unlike controls {controls}")
    return result(PASS, f"same kind of answer as controls {controls}")


def check_concurrent(
    group: tuple[int, ...],
    outputs: Sequence[Completion],
    solo: Mapping[int, Completion],
    context: str,
) -> CheckResult:
    result = partial(CheckResult, "concurrent", group)
    for length, output in zip(group, outputs, strict=True):
        if not same_output(output, solo[length]):
            return result(
                FAIL,
                f"{context}: the {length}-token prompt differs from its solo answer "
                f"at {describe_difference(solo[length], output)}",
            )
    return result(PASS, f"{context}: all match solo answers")


def continues_counting(text: str, at_least: int = 5) -> bool:
    """Whether ``text`` goes on with 11, 12, 13, ... after "1 2 ... 10"."""
    numbers = [int(match) for match in re.findall(r"\d+", text)[:at_least]]
    return len(numbers) == at_least and numbers == list(range(11, 11 + at_least))


def check_ongoing_decode(
    lengths: tuple[int, ...],
    solo: Completion,
    perturbed: Completion,
    overlapped_inserts: int,
    inserted: int,
    why_no_overlap: str = "",
) -> CheckResult:
    """The decode with prompts inserted equals the solo decode; with none of them
    answered while it streamed (``overlapped_inserts``) the check could not run."""
    result = partial(CheckResult, "ongoing_decode", lengths)
    counting = "continues counting" if continues_counting(solo.text) else "not counting"
    # The ids are the decode; its text arrives in pieces and the perturbed stream
    # is cut mid-way, so text is compared only when no ids came back.
    if solo.token_ids or perturbed.token_ids:
        same = solo.token_ids == perturbed.token_ids
    else:
        same = solo.text == perturbed.text
    if not same:
        return result(
            FAIL,
            f"with boundary prompts inserted the decode differs from the solo run at "
            f"{describe_difference(solo, perturbed)}",
        )
    if overlapped_inserts == 0:
        return result(SKIP, why_no_overlap)
    return result(
        PASS,
        f"{len(solo.token_ids)} tokens match the solo run; {overlapped_inserts} of "
        f"{inserted} boundary prompts were answered while it ran ({counting})",
    )


def not_run_sentences(checks: Sequence[CheckResult]) -> list[str]:
    """One sentence per check that could not run for one reason: which, and why."""
    lengths_by_reason: dict[tuple[str, str], list[str]] = {}
    for check in checks:
        if check.status == SKIP:
            key = (check.name, check.detail)
            lengths_by_reason.setdefault(key, []).append(check.length_label)
    sentences = []
    for (name, detail), labels in lengths_by_reason.items():
        shown = [label for label in labels if label != "-"]
        where = ""
        if shown:
            noun = "length" if len(shown) == 1 else "lengths"
            where = f" for {noun} {', '.join(shown)}"
        sentences.append(f"The {name} check could not run{where}: {detail}.")
    return sentences
