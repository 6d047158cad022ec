"""releases.json (the brief's contract 3): rows, merging, and the closing table."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from versions import release_key

# The sweep runs with the system Python, before the package is installed anywhere.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from vllm_graphsafe.fixes import fix_ids
from vllm_graphsafe.releases import ci_releases

#: A new document's CI releases: the package's one list.
CI_RELEASES = list(ci_releases())
SATISFIED_STATES = {"applied", "native", "not applicable", "not_applicable"}

Row = dict[str, Any]


def empty_document() -> dict[str, Any]:
    return {"sweep_date": None, "ci_releases": list(CI_RELEASES), "rows": []}


def load_document(path: Path) -> dict[str, Any]:
    """The file as it is, or a new document when there is none yet."""
    if not path.exists():
        return empty_document()
    document: dict[str, Any] = json.loads(path.read_text())
    document.setdefault("sweep_date", None)
    document.setdefault("ci_releases", list(CI_RELEASES))
    document.setdefault("rows", [])
    return document


def row_key(row: Row) -> tuple[str, str]:
    return row["distribution"], row["version"]


def _order(row: Row) -> tuple[Any, ...]:
    return release_key(row["version"]) or ((), -1), row["distribution"]


def merge_rows(existing: list[Row], new: list[Row]) -> list[Row]:
    """Merge by (distribution, version): a new row replaces its namesake; none drops."""
    merged = {row_key(row): row for row in existing}
    for row in new:
        previous = merged.get(row_key(row), {})
        merged[row_key(row)] = {**row, "ci": bool(row["ci"] or previous.get("ci"))}
    return sorted(merged.values(), key=_order)


def write_document(path: Path, document: dict[str, Any]) -> None:
    """Write atomically, so that an interrupted sweep never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2) + "\n"
    handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=".releases-")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.replace(scratch, path)


def is_ci(distribution: str, version: str, ci_releases: list[str]) -> bool:
    return f"{distribution}=={version}" in ci_releases


def reports_failure(outcome: str) -> bool:
    """Whether "3 passed, 1 failed", "..., 2 errors" or "error: ..." shows a failure."""
    counts = re.findall(r"(\d+) (?:failed|errors)", outcome)
    return outcome.startswith("error") or any(int(count) for count in counts)


def row_problems(row: Row) -> list[str]:
    """What the lead has to look at in a row, in a few words each (empty: verified)."""
    if not row["installed"]:
        return [f"did not install: {row['why_not']}"]
    problems = [
        f"{patch_id} {state}"
        for patch_id, state in row["patches"].items()
        if state not in SATISFIED_STATES
    ]
    if not row["patches"]:
        problems.append("no doctor report")
    if reports_failure(row["class_tests"]):
        problems.append("class tests failed")
    if row["negative_controls"] not in ("all failed", "no patch applied"):
        problems.append("negative controls failed")
    if reports_failure(row["engine"]):
        problems.append("engine tests failed")
    return problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[Row], notes: dict[tuple[str, str], str]) -> str:
    """One line per release; a release with something to fix is flagged in bold."""
    header = [
        "release",
        "distribution",
        "torch",
        *fix_ids(),
        "class tests",
        "negative controls",
        "engine",
        "CI",
        "verdict",
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for row in rows:
        problems = row_problems(row)
        verdict = "ok" if not problems else "**" + _cell("; ".join(problems)) + "**"
        note = notes.get(row_key(row))
        if note:
            verdict += f" ({_cell(note)})"
        cells = [
            row["version"],
            row["distribution"],
            row["torch"] or "-",
            *(row["patches"].get(patch_id, "-") for patch_id in fix_ids()),
            row["class_tests"],
            row["negative_controls"],
            row["engine"],
            "yes" if row["ci"] else "no",
            verdict,
        ]
        lines.append("| " + " | ".join(_cell(str(cell)) for cell in cells) + " |")
    return "\n".join(lines)
