"""Our edit found in a tree by our own lines, and taken out again.

A hunk is where its lines are, in one piece, exactly as written; upstream's
lines around it may have moved, changed or gone, as under ``git merge``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from vllm_graphsafe.backport import git
from vllm_graphsafe.backport.record import (
    EditRecord,
    FileEdit,
    Hunk,
    definitions,
    digest,
    lines_of,
)


class Changed(NamedTuple):
    """Part of our edit that is no longer as written."""

    relpath: str
    #: A unified diff from what was written to what the file holds there.
    diff: str


class Gone(NamedTuple):
    """Part of our edit whose place the tree no longer has."""

    relpath: str
    #: What is gone, in words: the file, or the function our lines sat in.
    what: str


class Reversal(NamedTuple):
    #: relpath -> the file with every hunk found taken out (None: delete it).
    texts: dict[str, str | None]
    changed: list[Changed]
    gone: list[Gone]


def _blank(line: str) -> bool:
    return not line.strip()


def _forms(hunk: Hunk) -> Iterator[list[str]]:
    """Our lines, and for an insertion the same lines with their blank first
    or last lines on the other side: a merge may align those blank lines with
    upstream's."""
    ours = lines_of(hunk.after)
    yield ours
    if hunk.before or not ours:
        return
    lead = next((n for n, line in enumerate(ours) if not _blank(line)), len(ours))
    trail = next(
        (n for n, line in enumerate(reversed(ours)) if not _blank(line)), len(ours)
    )
    for moved in range(1, trail + 1):
        yield ours[len(ours) - moved :] + ours[: len(ours) - moved]
    for moved in range(1, lead + 1):
        yield ours[moved:] + ours[:moved]


def _agreement(lines: list[str], start: int, end: int, hunk: Hunk) -> int:
    """How many of the hint's lines, outward from the hunk, are the file's."""
    count = 0
    for distance, line in enumerate(reversed(lines_of(hunk.above)), 1):
        if start - distance < 0 or lines[start - distance] != line:
            break
        count += 1
    for distance, line in enumerate(lines_of(hunk.below)):
        if end + distance >= len(lines) or lines[end + distance] != line:
            break
        count += 1
    return count


def locate(lines: list[str], hunks: tuple[Hunk, ...]) -> list[tuple[int, int] | None]:
    """Where each hunk's lines are: where they recur, the place whose neighbours
    agree most with the hint, then the one nearest to where it was written."""
    starts: dict[str, list[int]] = {}
    for number, line in enumerate(lines):
        starts.setdefault(line, []).append(number)
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, int] | None] = []
    shift = 0
    for hunk in hunks:
        best: tuple[tuple[int, int], tuple[int, int]] | None = None
        for ours in _forms(hunk):
            places = (
                (s for s in starts.get(ours[0], ()) if lines[s : s + len(ours)] == ours)
                if ours
                else iter(range(len(lines) + 1))
            )
            for start in places:
                end = start + len(ours)
                if any(start < b and a < end for a, b in taken):
                    continue
                agree = _agreement(lines, start, end, hunk)
                if not ours and not agree:
                    continue  # a deletion is placed by its neighbours alone
                rank = (-agree, abs(start - hunk.line - shift))
                if best is None or rank < best[0]:
                    best = (rank, (start, end))
            if best is not None:
                break
        found.append(None if best is None else best[1])
        if best is not None:
            taken.append(best[1])
            shift = best[1][0] - hunk.line
    return found


def _put_back(
    lines: list[str], hunks: tuple[Hunk, ...], spots: list[tuple[int, int] | None]
) -> str:
    out = list(lines)
    placed = [
        (spot, hunk)
        for spot, hunk in zip(spots, hunks, strict=True)
        if spot is not None
    ]
    for (start, end), hunk in sorted(placed, key=lambda p: p[0], reverse=True):
        out[start:end] = lines_of(hunk.before)
    return "".join(out)


def _after_hint(lines: list[str], hunk: Hunk) -> int:
    """Where the lines the hint has above the hunk end, nearest to where the
    hunk was written; else where it was written."""
    above = lines_of(hunk.above)
    ends = [
        start + len(above)
        for start in range(len(lines) - len(above) + 1)
        if above and lines[start : start + len(above)] == above
    ]
    return min(
        ends, key=lambda e: abs(e - hunk.line), default=min(hunk.line, len(lines))
    )


def _where_ours_were(lines: list[str], ours: list[str], hunk: Hunk) -> tuple[int, int]:
    """The lines of the file that best match ours."""
    run = difflib.SequenceMatcher(None, lines, ours, autojunk=False).find_longest_match(
        0, len(lines), 0, len(ours)
    )
    if not any(not _blank(line) for line in ours[run.b : run.b + run.size]):
        near = _after_hint(lines, hunk)
        return near, min(near + len(ours), len(lines))
    near = run.a - run.b
    first = max(near - len(ours), 0)
    window = lines[first : near + 2 * len(ours)]
    matcher = difflib.SequenceMatcher(None, window, ours, autojunk=False)
    blocks = [b for b in matcher.get_matching_blocks() if b.size]
    start = first + blocks[0].a - blocks[0].b
    end = first + blocks[-1].a + len(ours) - blocks[-1].b
    return max(start, 0), min(end, len(lines))


#: How alike (difflib's ratio) what the file holds must be to our lines for
#: them to read as changed rather than gone (difflib's own "close match").
ALIKE = 0.6


def _missing(relpath: str, text: str, hunk: Hunk) -> Changed | Gone:
    """Why a hunk was not found: our lines changed (shown), or their function
    or class is gone, and nothing like them is left."""
    lines = lines_of(text)
    ours = lines_of(hunk.after) or lines_of(hunk.above + hunk.below)
    start, end = _where_ours_were(lines, ours, hunk)
    have = lines[start:end]
    alike = difflib.SequenceMatcher(None, "".join(ours), "".join(have)).ratio()
    if hunk.scope and alike < ALIKE:
        spans = definitions(text)
        if spans is not None and hunk.scope not in {name for *_, name in spans}:
            return Gone(relpath, f"{hunk.scope} in {relpath}")
    if alike < ALIKE and not _agreement(lines, start, end, hunk):
        have = []  # nothing like our lines, nor their neighbours: taken out
    diff = difflib.unified_diff(
        ours, have, fromfile=f"{relpath} (as written)", tofile=f"{relpath} (now)"
    )
    return Changed(relpath, "".join(diff))


def _taken_out(
    relpath: str, text: str, edit: FileEdit, repository: git.Repository | None
) -> tuple[str, list[Changed | Gone]]:
    lines = lines_of(text)
    spots = locate(lines, edit.hunks)
    missing = [
        _missing(relpath, text, hunk)
        for hunk, spot in zip(edit.hunks, spots, strict=True)
        if spot is None
    ]
    if not missing and repository is not None and edit.written_blob is not None:
        merged = _three_way(text, edit, repository)
        if merged is not None:
            return merged, []
    return _put_back(lines, edit.hunks, spots), missing


def _three_way(text: str, edit: FileEdit, repository: git.Repository) -> str | None:
    """``text`` with our edit taken out by git's three-way merge from the file
    as the write left it; None where git cannot (no such blob, a conflict)."""
    assert edit.written_blob is not None
    written = repository.blob(edit.written_blob)
    if written is None:
        return None
    lines = lines_of(written)
    spots = locate(lines, edit.hunks)
    if None in spots:
        return None
    return git.merge_file(text, written, _put_back(lines, edit.hunks, spots))


def reverse(
    record: EditRecord,
    current: Mapping[str, str | None],
    repository: git.Repository | None = None,
) -> Reversal:
    """Each recorded file with every hunk of ours found taken out, and the
    hunks not found."""
    reversal = Reversal({}, [], [])
    for relpath, edit in record.files.items():
        text = current.get(relpath)
        if text is None:
            reversal.gone.append(Gone(relpath, relpath))
            continue
        restored, missing = _taken_out(relpath, text, edit, repository)
        reversal.changed.extend(m for m in missing if isinstance(m, Changed))
        reversal.gone.extend(m for m in missing if isinstance(m, Gone))
        reversal.texts[relpath] = None if edit.created and restored == "" else restored
    return reversal


def tests_changed(record: EditRecord, current: Mapping[str, str | None]) -> list[str]:
    return [
        relpath
        for relpath, sha in record.tests.items()
        if current.get(relpath) is None or digest(current[relpath] or "") != sha
    ]
