"""The record of one fix's edit, kept in the tree beside the tests it wrote.

Upstream's lines beside a hunk are only a hint (``above``, ``below``) to choose
between places where our lines recur, since a merge moves and changes them.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from vllm_graphsafe import recognition

FORMAT = "vllm-graphsafe backport record 2"
FORMAT_1 = "vllm-graphsafe backport record 1"
#: Lines of upstream's text kept on each side of a hunk, as a hint.
HINT = 3
#: A git object id (SHA-1, or SHA-256).
_BLOB_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


def record_path(fix_id: str) -> str:
    return f"tests/v1/worker/graphsafe_backport_{fix_id.replace('-', '_')}.json"


def lines_of(text: str) -> list[str]:
    return text.splitlines(keepends=True)


class Hunk(NamedTuple):
    """One run of our lines: ``after`` took the place of ``before`` (empty for
    an insertion), starting at ``line`` (0-based) of the file as written."""

    line: int
    before: str
    after: str
    #: Up to HINT lines of the file just above and just below, as written.
    above: str = ""
    below: str = ""
    #: The function or class of the tree the hunk sits in ("" at module
    #: level; None where unknown): where it is gone, so is this hunk's place.
    scope: str | None = None


class FileEdit(NamedTuple):
    hunks: tuple[Hunk, ...]
    created: bool = False
    #: git's blob id of the file as the write left it (every fix's edit in).
    written_blob: str | None = None


@dataclass
class EditRecord:
    fix_id: str
    files: dict[str, FileEdit] = field(default_factory=dict)
    #: relpath -> SHA-256 of a test file the edit wrote.
    tests: dict[str, str] = field(default_factory=dict)
    #: Directories the edit created for its tests, deepest first.
    directories: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        document = {
            "format": FORMAT,
            "about": (
                "vllm-graphsafe backport wrote this file with the edit of "
                f"{self.fix_id}: `vllm-graphsafe backport --check` reads it to "
                "tell this edit from upstream's fix, `--drop` to take it out "
                "exactly. Keep it with the edit; it goes when the edit does."
            ),
            "fix": self.fix_id,
            "files": {
                relpath: {
                    "created": edit.created,
                    "written_blob": edit.written_blob,
                    "hunks": [hunk._asdict() for hunk in edit.hunks],
                }
                for relpath, edit in sorted(self.files.items())
            },
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
        if not isinstance(document, dict):
            return None
        fix_id, files = document.get("fix"), document.get("files")
        tests, directories = document.get("tests", {}), document.get("directories", [])
        created = document.get("created", {})
        reader = {FORMAT: _file_edit, FORMAT_1: _regions_as_edit}.get(
            str(document.get("format"))
        )
        if not isinstance(fix_id, str) or not isinstance(files, dict):
            return None
        if not _str_map(tests) or reader is None:
            return None
        if not _str_list(directories) or not isinstance(created, dict):
            return None
        record = cls(fix_id, tests=dict(tests), directories=list(directories))
        for relpath, data in files.items():
            edit = reader(data, created.get(relpath))
            if edit is None:
                return None
            record.files[relpath] = edit
        return record


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _hunk(data: Any) -> Hunk | None:
    if not isinstance(data, dict) or not isinstance(data.get("line"), int):
        return None
    texts = [data.get(key, "") for key in ("before", "after", "above", "below")]
    scope = data.get("scope")
    if not all(isinstance(text, str) for text in texts):
        return None
    if scope is not None and not isinstance(scope, str):
        return None
    before, after, above, below = texts
    return Hunk(data["line"], before, after, above, below, scope)


def _file_edit(data: Any, _created: object) -> FileEdit | None:
    if not isinstance(data, dict) or not isinstance(data.get("hunks"), list):
        return None
    blob = data.get("written_blob")
    hunks = [_hunk(h) for h in data["hunks"]]
    if None in hunks or (blob is not None and not _BLOB_ID.fullmatch(str(blob))):
        return None
    return FileEdit(
        tuple(h for h in hunks if h is not None), bool(data.get("created")), blob
    )


def _regions_as_edit(data: Any, created: object) -> FileEdit | None:
    """A format-1 file entry (regions: context, before, after, context) as
    hunks: each run of changed lines inside a region is one hunk."""
    keys = ("context_before", "before", "after", "context_after")
    if not isinstance(data, list):
        return None
    hunks: list[Hunk] = []
    for region in data:
        if not isinstance(region, dict) or not isinstance(region.get("line"), int):
            return None
        if not all(isinstance(region.get(key), str) for key in keys):
            return None
        above, before, after, below = (lines_of(region[key]) for key in keys)
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                hunks.append(
                    Hunk(
                        region["line"] + j1,
                        "".join(before[i1:i2]),
                        "".join(after[j1:j2]),
                        "".join((above + after[:j1])[-HINT:]),
                        "".join((after[j2:] + below)[:HINT]),
                    )
                )
    return FileEdit(tuple(hunks), bool(created))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def blob_id(text: str) -> str:
    """git's (SHA-1) object id of a file holding ``text``."""
    data = text.encode("utf-8")
    return hashlib.sha1(
        b"blob %d\0" % len(data) + data, usedforsecurity=False
    ).hexdigest()


#: The fields of a statement that hold statements (or handlers and match
#: cases, which do): a def or class stands nowhere else.
_BLOCKS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def definitions(text: str) -> list[tuple[int, int, str]] | None:
    """(first line, last line, dotted name) of every function and class in
    ``text`` (1-based, decorators included); None where it does not parse."""
    module = recognition.parse(text)
    if module is None:
        return None
    found: list[tuple[int, int, str]] = []

    def visit(statements: list[ast.AST], prefix: str) -> None:
        for child in statements:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                found.append((first, child.end_lineno or child.lineno, name))
                visit(list(child.body), name + ".")
                continue
            for block in child._fields:
                if block in _BLOCKS:
                    visit(getattr(child, block), prefix)

    visit(list(module.body), "")
    return found


def _scope(
    spans: list[tuple[int, int, str]] | None, known: set[str], start: int, end: int
) -> str | None:
    """The innermost function or class of the original file around the hunk at
    ``[start, end)`` of the edited one (one with no lines: around the lines on
    each side of it)."""
    if spans is None:
        return None
    first, last = (start + 1, end) if end > start else (max(start, 1), start + 1)
    around = [s for s in spans if s[0] <= first and last <= s[1] and s[2] in known]
    return max(around, key=lambda s: s[0])[2] if around else ""


def _slid(new: list[str], start: int, end: int, low: int, high: int) -> int:
    """How far to slide inserted lines ``new[start:end]`` (within the unchanged
    lines ``new[low:high]`` around them) so that they end in a blank line and
    begin with one that is not, as a method or block written in is read; 0
    where no such place is."""
    places = [0]
    while (
        start + places[-1] > low
        and new[start + places[-1] - 1] == new[end + places[-1] - 1]
    ):
        places.append(places[-1] - 1)
    shift = 0
    while end + shift < high and new[start + shift] == new[end + shift]:
        shift += 1
        places.append(shift)

    def whole(shift: int) -> bool:
        block = new[start + shift : end + shift]
        return not block[-1].strip() and bool(block[0].strip())

    return min((s for s in places if whole(s)), key=abs, default=0)


def hunks_between(original: str, edited: str) -> tuple[Hunk, ...]:
    old, new = lines_of(original), lines_of(edited)
    spans = definitions(edited)
    known = {name for _, _, name in definitions(original) or []}
    opcodes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    hunks = []
    for index, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            continue
        if tag == "insert":
            low = opcodes[index - 1][3] if index else j1
            high = opcodes[index + 1][4] if index + 1 < len(opcodes) else j2
            shift = _slid(new, j1, j2, low, high)
            i1, i2, j1, j2 = i1 + shift, i2 + shift, j1 + shift, j2 + shift
        hunks.append(
            Hunk(
                line=j1,
                before="".join(old[i1:i2]),
                after="".join(new[j1:j2]),
                above="".join(new[max(j1 - HINT, 0) : j1]),
                below="".join(new[j2 : j2 + HINT]),
                scope=_scope(spans, known, j1, j2),
            )
        )
    return tuple(hunks)


def record_of(
    fix_id: str,
    originals: Mapping[str, str | None],
    edited: Mapping[str, str],
    tests: Mapping[str, str],
) -> EditRecord:
    """The record of a fix's edit from ``originals`` (None: a new file) to
    ``edited``, with the ``tests`` it wrote."""
    record = EditRecord(fix_id)
    for relpath, text in edited.items():
        before = originals.get(relpath)
        record.files[relpath] = FileEdit(
            hunks_between(before or "", text), created=before is None
        )
    record.tests = {relpath: digest(text) for relpath, text in tests.items()}
    return record


def with_written_blobs(record: EditRecord, written: Mapping[str, str]) -> EditRecord:
    record.files = {
        relpath: edit._replace(written_blob=blob_id(written[relpath]))
        for relpath, edit in record.files.items()
    }
    return record
