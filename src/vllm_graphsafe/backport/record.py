"""The record of one fix's edit, kept in the tree beside the tests it wrote.

``--write`` stores, per fix, each changed region of each source file exactly
as it was and as the edit left it (with a few lines of context), and the
digest of each test file it wrote, in
``tests/v1/worker/graphsafe_backport_<fix>.json``. From it:

* ``--check`` tells our edit (every region still as written) from upstream's
  fix, and names a region a merge or a person changed;
* ``--drop`` puts each region back byte for byte and deletes the tests and
  the record, or, where a region changed, refuses and shows it.

A region is found by its text (context included), nearest to where it was
written, so lines added or removed elsewhere in the file by a merge do not
matter.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Lines of unchanged text kept on each side of a region.
CONTEXT = 3
FORMAT = "vllm-graphsafe backport record 1"


def record_path(fix_id: str) -> str:
    """Where a fix's record lives in the tree, beside its written tests."""
    return f"tests/v1/worker/graphsafe_backport_{fix_id.replace('-', '_')}.json"


@dataclass(frozen=True)
class Region:
    """One changed run of lines: ``before`` became ``after``, between
    ``context_before`` and ``context_after``; ``line`` is where ``after``
    started (0-based) in the edited file."""

    line: int
    context_before: str
    before: str
    after: str
    context_after: str

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "context_before": self.context_before,
            "before": self.before,
            "after": self.after,
            "context_after": self.context_after,
        }


@dataclass
class EditRecord:
    fix_id: str
    #: relpath -> the regions of that source file, top to bottom.
    regions: dict[str, list[Region]] = field(default_factory=dict)
    #: relpath -> SHA-256 of a test file the edit wrote (new files).
    tests: dict[str, str] = field(default_factory=dict)
    #: relpath -> whether the edit created the file (rather than changed it).
    created: dict[str, bool] = field(default_factory=dict)
    #: Directories the edit created for its tests, deepest first.
    directories: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        document = {
            "format": FORMAT,
            "about": (
                "vllm-graphsafe backport wrote this file with the edit of "
                f"{self.fix_id}: `vllm-graphsafe backport --check` reads it to "
                "tell this edit from upstream's fix, `--drop` to reverse it "
                "exactly. Keep it with the edit; it goes when the edit does."
            ),
            "fix": self.fix_id,
            "files": {
                relpath: [region.to_json() for region in regions]
                for relpath, regions in sorted(self.regions.items())
            },
            "created": dict(sorted(self.created.items())),
            "tests": dict(sorted(self.tests.items())),
            "directories": list(self.directories),
        }
        return json.dumps(document, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_text(cls, text: str) -> EditRecord | None:
        """The record in ``text``; None where it is not one of ours as written."""
        try:
            document = json.loads(text)
        except ValueError:
            return None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return None
        fix_id, files = document.get("fix"), document.get("files")
        tests, created = document.get("tests"), document.get("created", {})
        if not isinstance(fix_id, str) or not isinstance(files, dict):
            return None
        if not _str_map(tests) or not isinstance(created, dict):
            return None
        directories = document.get("directories", [])
        if not isinstance(directories, list) or not all(
            isinstance(d, str) for d in directories
        ):
            return None
        assert isinstance(tests, dict)
        record = cls(fix_id, tests=dict(tests), created={}, directories=directories)
        for relpath, regions in files.items():
            if not isinstance(relpath, str) or not isinstance(regions, list):
                return None
            parsed = [_region(r) for r in regions]
            if any(r is None for r in parsed):
                return None
            record.regions[relpath] = [r for r in parsed if r is not None]
        record.created = {
            str(k): bool(v) for k, v in created.items() if isinstance(k, str)
        }
        return record


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _region(data: Any) -> Region | None:
    keys = ("context_before", "before", "after", "context_after")
    if not isinstance(data, dict) or not isinstance(data.get("line"), int):
        return None
    if not all(isinstance(data.get(key), str) for key in keys):
        return None
    return Region(data["line"], *(data[key] for key in keys))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def regions_between(original: str, edited: str) -> list[Region]:
    """The changed runs of lines from ``original`` to ``edited``; changes closer
    than twice the context make one region, so no region's context holds
    another's lines."""
    old = original.splitlines(keepends=True)
    new = edited.splitlines(keepends=True)
    found: list[Region] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT):
        changes = [op for op in group if op[0] != "equal"]
        i1, j1 = changes[0][1], changes[0][3]
        i2, j2 = changes[-1][2], changes[-1][4]
        found.append(
            Region(
                line=j1,
                context_before="".join(new[max(j1 - CONTEXT, 0) : j1]),
                before="".join(old[i1:i2]),
                after="".join(new[j1:j2]),
                context_after="".join(new[j2 : j2 + CONTEXT]),
            )
        )
    return found


def record_of(
    fix_id: str,
    originals: Mapping[str, str | None],
    edited: Mapping[str, str],
    tests: Mapping[str, str],
) -> EditRecord:
    """The record of a fix's edit: ``originals`` (relpath -> text before, None
    for a new file) to ``edited`` (source files), plus the ``tests`` written."""
    record = EditRecord(fix_id)
    for relpath, text in edited.items():
        before = originals.get(relpath)
        record.created[relpath] = before is None
        record.regions[relpath] = regions_between(before or "", text)
    record.tests = {relpath: digest(text) for relpath, text in tests.items()}
    return record


@dataclass(frozen=True)
class Changed:
    """A region of our edit that is no longer as written."""

    relpath: str
    #: A unified diff from the region as written to what the file holds there.
    diff: str


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _find(text: str, block: str, near_line: int) -> int | None:
    """The offset of ``block`` in ``text`` at a line start nearest to
    ``near_line``; None where it is not there."""
    starts = _line_starts(text)
    at_line = set(starts)
    best: tuple[int, int] | None = None
    offset = text.find(block)
    while offset >= 0:
        if offset in at_line:
            distance = abs(starts.index(offset) - near_line)
            if best is None or distance < best[0]:
                best = (distance, offset)
        offset = text.find(block, offset + 1)
    return None if best is None else best[1]


def reverse(
    record: EditRecord, current: Mapping[str, str | None]
) -> tuple[dict[str, str | None], list[Changed]]:
    """Each recorded file with our regions put back as they were (None: a
    file the edit created, to delete), and the regions no longer as written."""
    restored: dict[str, str | None] = {}
    changed: list[Changed] = []
    for relpath, regions in record.regions.items():
        text = current.get(relpath)
        if text is None:
            changed.append(Changed(relpath, f"{relpath} is gone\n"))
            continue
        for region in sorted(regions, key=lambda r: r.line, reverse=True):
            written = region.context_before + region.after + region.context_after
            offset = _find(
                text, written, region.line - region.context_before.count("\n")
            )
            if offset is None:
                changed.append(Changed(relpath, _what_differs(relpath, text, region)))
                continue
            put_back = region.context_before + region.before + region.context_after
            text = text[:offset] + put_back + text[offset + len(written) :]
        created = record.created.get(relpath, False)
        restored[relpath] = None if created and text == "" else text
    return restored, changed


def forward(
    record: EditRecord, current: Mapping[str, str | None]
) -> tuple[dict[str, str | None], bool]:
    """Each recorded file with our regions made again where they are as they
    were before the edit (the edit re-applied to a tree it was taken out of),
    and whether every region was."""
    done: dict[str, str | None] = {}
    whole = True
    for relpath, regions in record.regions.items():
        text = current.get(relpath)
        if text is None:
            text = "" if record.created.get(relpath, False) else None
        if text is None:
            continue
        for region in sorted(regions, key=lambda r: r.line, reverse=True):
            before = region.context_before + region.before + region.context_after
            offset = _find(
                text, before, region.line - region.context_before.count("\n")
            )
            if offset is None:
                whole = False
                continue
            made = region.context_before + region.after + region.context_after
            text = text[:offset] + made + text[offset + len(before) :]
        done[relpath] = text
    return done, whole


def _what_differs(relpath: str, text: str, region: Region) -> str:
    """The region as written against the lines the file holds near it."""
    written = region.context_before + region.after + region.context_after
    lines = text.splitlines(keepends=True)
    want = written.splitlines(keepends=True)
    anchor = region.context_before or region.context_after
    offset = _find(text, anchor, region.line) if anchor else None
    start = (
        _line_starts(text).index(offset)
        if offset is not None
        else min(max(region.line - CONTEXT, 0), len(lines))
    )
    have = lines[start : start + len(want)]
    return "".join(
        difflib.unified_diff(
            want, have, fromfile=f"{relpath} (as written)", tofile=f"{relpath} (now)"
        )
    )


def tests_changed(record: EditRecord, current: Mapping[str, str | None]) -> list[str]:
    """The written test files that are gone or no longer as written."""
    return [
        relpath
        for relpath, sha in record.tests.items()
        if current.get(relpath) is None or digest(current[relpath] or "") != sha
    ]
