"""Upstream's changes next to our hunks, made the same on both sides of a merge.

A file our write changed is held as upstream's lines with our hunks among them
(:class:`Carried`): written out with each hunk's lines it is our branch's
file, with the lines each hunk replaced it is upstream's. A change of
upstream's (a line edited above a hunk, the method a hunk sits in moved, a
formatter's reflow, a function removed, ...) is made on that one sequence, so
upstream's branch gets it and a maintainer's resolution of the merge keeps it
beside our lines, as ``git merge`` keeps both sides' changes.
"""

from __future__ import annotations

import ast
import difflib
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

NOTE = "# upstream's note"


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _blank(item: str | int) -> bool:
    return isinstance(item, str) and not item.strip()


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :] or "\n"


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


@dataclass
class Carried:
    """One file: upstream's lines (str) with our hunks (their numbers) among them."""

    items: list[str | int]
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, upstream: str, ours: str) -> Carried:
        old, new = _lines(upstream), _lines(ours)
        carried = cls([])
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                carried.items += old[i1:i2]
            else:
                carried.items.append(len(carried.before))
                carried.before.append("".join(old[i1:i2]))
                carried.after.append("".join(new[j1:j2]))
        return carried

    def text(self, ours: bool) -> str:
        hunks = self.after if ours else self.before
        return "".join(hunks[i] if isinstance(i, int) else i for i in self.items)

    def item_of_line(self) -> list[int]:
        """For each line of our side (0-based), the item it comes from."""
        owners: list[int] = []
        for index, item in enumerate(self.items):
            count = len(_lines(self.after[item])) if isinstance(item, int) else 1
            owners += [index] * count
        return owners

    def hunks(self) -> list[int]:
        """The item index of every hunk, top to bottom."""
        return [i for i, item in enumerate(self.items) if isinstance(item, int)]

    def parses(self) -> bool:
        try:
            ast.parse(self.text(ours=True))
            ast.parse(self.text(ours=False))
        except SyntaxError:
            return False
        return True


Change = Callable[[Carried], "Carried | None"]


def _noted(line: str) -> str:
    return line.rstrip("\r\n") + f"  {NOTE}" + _ending(line)


def _upstream_line(items: list[str | int], start: int, step: int) -> int | None:
    """The nearest non-blank line of upstream's from ``start`` in direction
    ``step``, where no hunk of ours comes first."""
    index = start
    while 0 <= index < len(items):
        item = items[index]
        if isinstance(item, int):
            return None
        if item.strip() and not item.rstrip("\r\n").endswith("\\"):
            return index
        index += step
    return None


def _note_line(carried: Carried, hunk: int) -> str:
    first = next((line for line in _lines(carried.after[hunk]) if line.strip()), "")
    return f"{_indent(first)}{NOTE}\n"


def _beside(carried: Carried, side: int) -> Carried:
    """Upstream edits the nearest line of its own on one side of each hunk
    (-1 above, +1 below) and adds a line touching the hunk there."""
    items = list(carried.items)
    for position in reversed(carried.hunks()):
        hunk = items[position]
        assert isinstance(hunk, int)
        near = _upstream_line(items, position + side, side)
        if near is not None:
            items[near] = _noted(str(items[near]))
        items.insert(position + (side > 0), _note_line(carried, hunk))
    return Carried(items, carried.before, carried.after)


def above(carried: Carried) -> Carried:
    return _beside(carried, -1)


def below(carried: Carried) -> Carried:
    return _beside(carried, +1)


def between(carried: Carried) -> Carried:
    """Upstream edits, and adds, a line halfway between each two of our hunks."""
    items = list(carried.items)
    hunks = carried.hunks()
    for first, second in reversed(list(itertools.pairwise(hunks))):
        middle = (first + second) // 2
        near = _upstream_line(items, middle, -1) or _upstream_line(items, middle, 1)
        if near is None or not first < near < second:
            continue
        items[near] = _noted(str(items[near]))
        items.insert(near + 1, f"{_indent(str(items[near]))}{NOTE}\n")
    return Carried(items, carried.before, carried.after)


# -- the functions our hunks sit in ----------------------------------------------------

Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Place:
    """A def of upstream's, as item indices: ``first``..``last`` inclusive."""

    name: str
    first: int
    last: int
    #: The item indices of the body of the def or module holding it.
    parent_first: int
    parent_last: int


def _defs(carried: Carried) -> Iterator[tuple[Def, Def | ast.Module]]:
    module = ast.parse(carried.text(ours=True))
    stack: list[tuple[ast.AST, Def | ast.Module]] = [(module, module)]
    while stack:
        node, parent = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child, parent
                stack.append((child, child))
            else:
                stack.append((child, parent))


def _places(carried: Carried) -> list[Place]:
    """Every def whose first and last lines are upstream's."""
    owner = carried.item_of_line()
    items = carried.items
    found = []
    for node, parent in _defs(carried):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        last = (node.end_lineno or node.lineno) - 1
        if isinstance(items[owner[first]], int) or isinstance(items[owner[last]], int):
            continue
        if isinstance(parent, ast.Module):
            span = (0, len(items) - 1)
        else:
            body = parent.body
            span = (owner[body[0].lineno - 1], owner[(body[-1].end_lineno or 1) - 1])
        found.append(Place(node.name, owner[first], owner[last], *span))
    return found


def _place_of(places: list[Place], hunk_at: int) -> Place | None:
    """The innermost def of upstream's around a hunk, else the one just above."""
    around = [p for p in places if p.first < hunk_at < p.last]
    if around:
        return max(around, key=lambda p: p.first)
    above_it = [p for p in places if p.last < hunk_at]
    return max(above_it, key=lambda p: (p.last, -p.first)) if above_it else None


def _chosen(carried: Carried, places: list[Place]) -> list[Place]:
    """The places of our hunks, each once, none inside another."""
    chosen = {
        place
        for position in carried.hunks()
        if (place := _place_of(places, position)) is not None
    }
    return sorted(
        (
            p
            for p in chosen
            if not any(
                o != p and o.first <= p.first and p.last <= o.last for o in chosen
            )
        ),
        key=lambda p: p.first,
    )


def renamed(carried: Carried) -> Carried:
    """Upstream renames the function each hunk sits in (or the one above it),
    in every line of its own in the file."""
    items = list(carried.items)
    for place in _chosen(carried, _places(carried)):
        word = re.compile(rf"\b{re.escape(place.name)}\b")
        items = [
            word.sub(f"{place.name}_renamed", i) if isinstance(i, str) else i
            for i in items
        ]
    return Carried(items, carried.before, carried.after)


def _with_trailing_blanks(items: list[str | int], place: Place) -> tuple[int, int]:
    end = place.last + 1
    while end < len(items) and _blank(items[end]):
        end += 1
    return place.first, end


def moved(carried: Carried) -> Carried:
    """Upstream moves the function each hunk sits in (or the one above it) to
    the other end of the class or module holding it: our lines in it go
    along, our lines beside it stay."""
    items, places = carried.items, _places(carried)
    moves: dict[int, list[str | int]] = {}
    skipped: set[int] = set()
    for place in _chosen(carried, places):
        start, end = _with_trailing_blanks(items, place)
        siblings = [
            p
            for p in places
            if (p.parent_first, p.parent_last)
            == (place.parent_first, place.parent_last)
        ]
        first = min(siblings, key=lambda p: p.first)
        if first == place:
            tail = moves.setdefault(place.parent_last + 1, [])
            tail += ["\n", *items[place.first : place.last + 1]]
        else:
            moves.setdefault(first.first, []).extend(items[start:end])
        skipped.update(range(start, end))
    out: list[str | int] = []
    for index, item in enumerate(items):
        out.extend(moves.get(index, []))
        if index not in skipped:
            out.append(item)
    out.extend(moves.get(len(items), []))
    return Carried(out, carried.before, carried.after)


def _one_line(node: ast.stmt, lines: list[str]) -> str | None:
    first = lines[node.lineno - 1]
    last = lines[(node.end_lineno or node.lineno) - 1]
    if node.col_offset != len(_indent(first)):
        return None
    if (node.end_col_offset or 0) != len(last.rstrip("\r\n")):
        return None
    return _indent(first) + ast.unparse(node) + _ending(last)


def reflowed(carried: Carried) -> Carried:
    """A formatter's reflow around each hunk: the statement of upstream's just
    above and just below rewritten on one line (as ``ast.unparse`` writes it),
    and, above lines we inserted, the blank line taken away (or one added).
    (Above lines we removed, a line upstream adds has no side: a merge
    conflicts there, and which side of it the lines go back is a guess.)"""
    text = carried.text(ours=True)
    lines, owner = _lines(text), carried.item_of_line()
    simple = [
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.stmt) and not hasattr(node, "body")
    ]
    items = list(carried.items)
    replace: dict[int, tuple[int, str]] = {}
    for position in carried.hunks():
        spans = []
        for node in simple:
            first, last = owner[node.lineno - 1], owner[(node.end_lineno or 1) - 1]
            if any(isinstance(items[i], int) for i in range(first, last + 1)):
                continue
            spans.append((first, last, node))
        for pick in (
            max(
                (s for s in spans if s[1] < position), key=lambda s: s[1], default=None
            ),
            min(
                (s for s in spans if s[0] > position), key=lambda s: s[0], default=None
            ),
        ):
            if pick is None:
                continue
            rewritten = _one_line(pick[2], lines)
            if rewritten is not None and pick[0] not in replace:
                replace[pick[0]] = (pick[1], rewritten)
    out: list[str | int] = []
    index = 0
    while index < len(items):
        if index in replace:
            last, rewritten = replace[index]
            out.append(rewritten)
            index = last + 1
            continue
        item = items[index]
        if isinstance(item, int) and not carried.before[item]:
            if out and _blank(out[-1]):
                out.pop()
            else:
                out.append("\n")
        out.append(item)
        index += 1
    return Carried(out, carried.before, carried.after)


def function_removed(carried: Carried) -> Carried:
    """Upstream removes the function each hunk sits in (with our lines in
    it); hunks beside a function stay."""
    items = carried.items
    gone: set[int] = set()
    for place in _chosen(carried, _places(carried)):
        if any(place.first < p < place.last for p in carried.hunks()):
            start, end = _with_trailing_blanks(items, place)
            gone.update(range(start, end))
    return Carried(
        [item for index, item in enumerate(items) if index not in gone],
        carried.before,
        carried.after,
    )


def file_removed(carried: Carried) -> None:
    return None


#: Each change upstream makes next to our hunks, by name.
NEIGHBOURS: dict[str, Change] = {
    "above": above,
    "below": below,
    "between": between,
    "renamed": renamed,
    "moved": moved,
    "reflowed": reflowed,
}
#: Changes that take our edit's place away.
REMOVALS: dict[str, Change] = {
    "function-removed": function_removed,
    "file-removed": file_removed,
}
