"""The demo's output in the documentation: regenerated from a saved run, checked.

``docs/demo-output.md`` holds a whole run of ``vllm-graphsafe demo`` as it was
printed; ``README.md`` holds an excerpt of the same run (each section's verdict
line). Both are generated blocks, spliced by :func:`catalogue.replace_block`.
Save a run with its exit status on the last line, then write both blocks::

    { vllm-graphsafe demo; echo "exit status $?"; } > demo.log 2>&1
    python -m tests.support.demo_output --write demo.log

``--check`` (a unit test runs it) says whether the documented run still has the
structure the demo prints now: the section headings in order, the kind of every
line, and the exit status those lines imply. Timings, counts, paths, ports and
pids may differ from run to run and are not compared. Exit status: 0 current,
1 stale, 2 bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_graphsafe.catalogue import MarkerError, markers, replace_block

EXIT_OK = 0
EXIT_STALE = 1
EXIT_BAD_INPUT = 2

FULL_BLOCK = "demo-output"
EXCERPT_BLOCK = "demo-excerpt"
README = Path("README.md")
FULL_DOC = Path("docs/demo-output.md")
EXIT_LINE = re.compile(r"^exit status (\d+)$")
HEADING = re.compile(r"^=== (.+) ===$")
PROGRESS = re.compile(r"^ *(\d+) s  (.+?)(?: \(for (\d+) s\))?$")
ROW = re.compile(r"^(\w+) +(\S+)  (PASS|FAIL|NOT RUN) +(.*)$")
#: What scripts/demo.sh prints about its environment before the demo starts.
SETUP_LINE = re.compile(
    r"(Reusing |Preparing |\[install-venv |  \.\.\. still install).*"
)


class StaleOutput(ValueError):
    """The documented run does not have the structure the demo prints now."""


@dataclass(frozen=True)
class Kind:
    """One kind of line: its name, how to recognise it, how many in a row."""

    name: str
    matches: Callable[[str], bool]
    least: int = 1
    most: int | None = 1


def _equals(text: str) -> Callable[[str], bool]:
    return lambda line: line == text


def _fits(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern)
    return lambda line: compiled.fullmatch(line) is not None


def _is_progress(line: str) -> bool:
    from vllm_graphsafe.cli.startup_phases import (
        STARTING,
        STARTUP_PHASES,
        progress_line,
    )

    found = PROGRESS.fullmatch(line)
    if found is None:
        return False
    elapsed, phase, lasted = found.groups()
    if phase not in {STARTING, *(label for label, _ in STARTUP_PHASES)}:
        return False
    in_phase = None if lasted is None else float(lasted)
    return line == progress_line(float(elapsed), phase, in_phase)


def _is_check_row(line: str) -> bool:
    from vllm_graphsafe.probe.checks import CHECK_NAMES

    found = ROW.fullmatch(line)
    return found is not None and found.group(1) in CHECK_NAMES


def grammar() -> dict[str, tuple[Kind, ...]]:
    """Each section the demo prints, by heading, and its kinds of line in order.

    Built from the demo's own headings, notes and formatters, so that a change
    to what the demo prints makes the documented run stale.
    """
    from vllm_graphsafe import vllm_layout
    from vllm_graphsafe.cli import demo, doctor
    from vllm_graphsafe.emulator.demo import EMULATION_NOTE
    from vllm_graphsafe.metrics import EXAMPLE_ALERT

    progress = Kind("start-up progress", _is_progress, least=0, most=None)
    alert = EXAMPLE_ALERT.strip().splitlines()
    return {
        "": (Kind("setup line", _fits(SETUP_LINE.pattern), least=0, most=None),),
        demo.MODEL_SECTION: (Kind("model path", _fits(r"\S+ \(\d+\.\d s\)")),),
        demo.SERVER_SECTION: (
            Kind(
                "server command",
                lambda line: f" -m {vllm_layout.OPENAI_API_SERVER} --model " in line,
            ),
            Kind("why the server module", _equals(demo.MODULE_FORM_NOTE)),
            Kind("server pid and log", _fits(r"server pid \d+; log: \S+")),
            progress,
            Kind("healthy", _fits(r"healthy at http://127\.0\.0\.1:\d+ after \d+ s")),
        ),
        demo.DOCTOR_SECTION: (
            Kind("environment", _fits(r"(vLLM|torch|python|runners): +\S.*"), 4, 4),
            Kind("fix table header", _fits(r"patch +state +reason")),
            Kind("fix table rule", _fits(r"-+(  -+)+")),
            Kind("fix row", _fits(r"[a-z0-9]+(-[a-z0-9]+)+ +[a-z ]+?  +\S.*"), 1, None),
            Kind("judgements heading", _equals(doctor.JUDGEMENTS_HEADING), 0),
            Kind(
                "judgement", _fits(r"  [a-z0-9]+(-[a-z0-9]+)+( \(.+\))?: \S.*"), 0, None
            ),
            Kind("judged from source", _fits(r"\(judged from vLLM's source.*\)"), 0),
            Kind("doctor verdict", _equals("every fix this vLLM needs is active")),
        ),
        demo.PROBE_SECTION: (
            Kind("random weights note", _equals(demo.RANDOM_WEIGHTS_NOTE)),
            Kind("check table header", _fits(r"check +length +result +detail")),
            Kind("check row", _is_check_row, most=None),
            Kind("probe summary", _fits(r"probe (passed|FAILED|INCOMPLETE): .*")),
            Kind("check not run", _fits(r"The \w+ check could not run.*\."), 0, None),
        ),
        demo.STATS_SECTION: (
            Kind("CPU note", _equals(demo.CPU_NOTE)),
            Kind("process count", _fits(r"patch states in \d+ vLLM process\(es\):")),
            Kind("patch states", _fits(r"  [a-z0-9-]+: .+ in \d+"), most=None),
            Kind("decisions heading", _equals("dispatch decisions:")),
            Kind("decisions", _fits(r"  [a-z0-9-]+: \w+=\d+(, \w+=\d+)*"), most=None),
            Kind(
                "kept off the decode graph",
                _fits(
                    r"The plugin kept \d+ prefill step\(s\) off the decode graph; "
                    r"\d+ genuine decode step\(s\) kept it\."
                ),
            ),
        ),
        demo.METRICS_SECTION: (
            Kind("metric", _fits(r"graphsafe_\w+\{[^}]*\} \d+(\.\d+)?"), most=None),
            Kind("alert heading", _equals("An example alerting rule:")),
            Kind("alert rule", alert.__contains__, len(alert), len(alert)),
        ),
        demo.HAZARD_SECTION: (
            Kind(
                "second server",
                _equals("starting a second server with the plugin disabled ..."),
            ),
            progress,
            Kind("emulation note", _equals(EMULATION_NOTE)),
            Kind("boundary prompt", _fits(r'Prompt: ".+')),
            Kind(
                "answer",
                _fits(r"  plugin (disabled|enabled ): .+|      ids \[.*\]  text .*"),
                4,
                4,
            ),
            Kind(
                "stopping", _fits(r"stopping the second vLLM server \(pid \d+\) \.\.\.")
            ),
            Kind("stopped", _equals("second server stopped")),
            Kind("stopping", _fits(r"stopping the vLLM server \(pid \d+\) \.\.\.")),
            Kind("stopped", _equals("server stopped")),
        ),
    }


def split_sections(lines: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The run's non-blank lines by section; lines before the first heading
    come under the heading ``""``."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in lines:
        heading = HEADING.fullmatch(line)
        if heading:
            sections.append((heading.group(1), []))
        elif line.strip():
            sections[-1][1].append(line)
    return sections


def line_kinds(title: str, lines: Sequence[str], kinds: Sequence[Kind]) -> list[str]:
    """Each line's kind, read in order; ``StaleOutput`` names the first misfit."""
    found: list[str] = []
    position = 0
    for kind in kinds:
        count = 0
        while (
            position < len(lines)
            and (kind.most is None or count < kind.most)
            and kind.matches(lines[position])
        ):
            found.append(kind.name)
            position += 1
            count += 1
        if count < kind.least:
            where = repr(lines[position]) if position < len(lines) else "its end"
            raise StaleOutput(f"section {title!r}: expected {kind.name!r} at {where}")
    if position < len(lines):
        raise StaleOutput(
            f"section {title!r}: the demo prints no such line: {lines[position]!r}"
        )
    return found


def expected_exit_status(sections: dict[str, list[str]]) -> int:
    """The status the demo returns for a run that printed these lines."""
    from vllm_graphsafe.cli import demo

    hazard = sections.get(demo.HAZARD_SECTION, [])
    shown = any("plugin disabled: GARBAGE" in line for line in hazard) and any(
        "plugin enabled : clean" in line for line in hazard
    )
    if not shown:
        return demo.EXIT_HAZARD_NOT_SHOWN
    return probe_exit_status(sections.get(demo.PROBE_SECTION, []))


def _rows(lines: Sequence[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for line in lines:
        found = ROW.fullmatch(line)
        if found and _is_check_row(line):
            name, label, status, detail = found.groups()
            rows.append((name, label, status, detail))
    return rows


def probe_exit_status(lines: Sequence[str]) -> int:
    """The probe's status from its printed table; the table, its summary and
    its sentences must be as the probe prints them now."""
    from vllm_graphsafe.cli.probe import STATUS_LABELS, format_table, summary_line
    from vllm_graphsafe.probe.checks import CheckResult, not_run_sentences
    from vllm_graphsafe.probe.run import checks_exit_status

    statuses = {label: status for status, label in STATUS_LABELS.items()}
    checks = [
        CheckResult(
            name,
            tuple(int(n) for n in label.split("+")) if label != "-" else (),
            statuses[status],
            detail,
        )
        for name, label, status, detail in _rows(lines)
    ]
    table = format_table(checks).splitlines()
    if not all(line in lines for line in table):
        raise StaleOutput("the probe's table is laid out differently now")
    summary = summary_line(checks)
    if summary not in lines:
        raise StaleOutput(f"the probe's summary is now {summary!r}")
    for sentence in not_run_sentences(checks):
        if sentence not in lines:
            raise StaleOutput(f"the probe now also says {sentence!r}")
    return checks_exit_status(checks)


def check_run(text: str) -> None:
    """Raise ``StaleOutput`` unless ``text`` has the structure the demo prints."""
    from vllm_graphsafe.cli import demo

    lines = text.strip("\n").splitlines()
    status_line = EXIT_LINE.fullmatch(lines[-1]) if lines else None
    if status_line is None:
        raise StaleOutput("the run does not end with its 'exit status N' line")
    sections = split_sections(lines[:-1])
    titles = [title for title, _ in sections[1:]]
    if titles != list(demo.SECTIONS):
        raise StaleOutput(f"its sections are {titles}, the demo's {demo.SECTIONS}")
    kinds = grammar()
    for title, section_lines in sections:
        line_kinds(title, section_lines, kinds[title])
    recorded = int(status_line.group(1))
    expected = expected_exit_status(dict(sections))
    if recorded != expected:
        raise StaleOutput(
            f"it ends with exit status {recorded}; the demo returns {expected} "
            f"for those lines"
        )


def excerpt(text: str) -> str:
    """The verdicts, as the demo printed them: the probe's summary, the
    plugin's counts, the emulated bug without and with the plugin. (The saved
    run's last line, its exit status, is the shell's, not the demo's.)"""
    wanted = re.compile(
        r"probe \w+: .*|The plugin kept .*|  plugin (disabled|enabled ): .*"
    )
    return "\n".join(line for line in printed_lines(text) if wanted.fullmatch(line))


def printed_lines(saved_run: str) -> list[str]:
    """The lines the demo printed: the saved run less its exit-status line."""
    lines = saved_run.strip("\n").splitlines()
    if lines and EXIT_LINE.fullmatch(lines[-1]):
        lines = lines[:-1]
    return lines


def fenced(text: str) -> str:
    return "```text\n" + text.strip("\n") + "\n```"


def unfenced(block: str) -> str:
    lines = block.strip("\n").splitlines()
    if len(lines) < 2 or lines[0] != "```text" or lines[-1] != "```":
        raise StaleOutput("the block is not one ```text fence")
    return "\n".join(lines[1:-1])


def block_text(document: str, name: str) -> str:
    start_marker, end_marker = markers(name)
    start = document.find(start_marker)
    end = document.find(end_marker)
    if start < 0 or end < start:
        raise MarkerError(f"the document has no {start_marker} ... {end_marker} block")
    return document[start + len(start_marker) : end]


def check_documents(readme: str, full_doc: str) -> None:
    """Raise ``StaleOutput`` unless the documented run and its excerpt are current."""
    run = unfenced(block_text(full_doc, FULL_BLOCK))
    check_run(run)
    if unfenced(block_text(readme, EXCERPT_BLOCK)) != excerpt(run):
        raise StaleOutput("the README's excerpt is not the documented run's")


def write_documents(saved_run: str, readme: Path, full_doc: Path) -> None:
    """Put a saved run in ``full_doc`` and its excerpt in ``readme``, once it
    is known to have the demo's structure."""
    run = saved_run.replace("\r", "").strip("\n")
    check_run(run)
    full_doc.write_text(
        replace_block(full_doc.read_text(encoding="utf-8"), FULL_BLOCK, fenced(run)),
        encoding="utf-8",
    )
    readme.write_text(
        replace_block(
            readme.read_text(encoding="utf-8"), EXCERPT_BLOCK, fenced(excerpt(run))
        ),
        encoding="utf-8",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.demo_output",
        description="Check, or write from a saved run, the demo's output in "
        f"{FULL_DOC} (whole) and {README} (excerpt). Exit status: 0 current, "
        "1 stale, 2 bad input.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true")
    action.add_argument(
        "--write", metavar="SAVED_RUN", type=Path, help="a run saved as shown above"
    )
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--doc", type=Path, default=FULL_DOC)
    args = parser.parse_args(argv)
    try:
        if args.write is not None:
            write_documents(
                args.write.read_text(encoding="utf-8"), args.readme, args.doc
            )
        else:
            check_documents(
                args.readme.read_text(encoding="utf-8"),
                args.doc.read_text(encoding="utf-8"),
            )
    except (OSError, MarkerError) as error:
        print(f"Cannot read or write the documents: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except StaleOutput as error:
        source = args.write or f"{args.doc}"
        print(f"{source}: not the demo's current output: {error}.", file=sys.stderr)
        return EXIT_STALE
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
