"""The plugin's fixes as in-place edits to a vLLM source tree, for maintainers.

Nothing is written here; :mod:`.output` renders diffs, patch files and writes.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from vllm_graphsafe import fixes
from vllm_graphsafe.backport import git
from vllm_graphsafe.backport.ours import Changed, Gone, Reversal, reverse, tests_changed
from vllm_graphsafe.backport.record import (
    EditRecord,
    record_of,
    record_path,
    with_written_blobs,
)
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.judging import PatchState, Verdict, judge
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.tree_edits.plan import Plan
from vllm_graphsafe.tree_edits.source import MissingSymbolError
from vllm_graphsafe.tree_edits.tree import Tree, module_path, read_exact

#: Fix ids in the order their edits are made (two share the V1 runner file).
FIX_IDS = tuple(fixes.fix_ids())


class Status(str, enum.Enum):
    NEEDED = "needed"
    OURS = "ours"
    OURS_CHANGED = "ours, changed"
    NATIVE = "native"
    BOTH = "both"
    NOT_APPLICABLE = "not applicable"
    #: Needed, but the tree lacks what our edit changes.
    CANNOT_BIND = "cannot bind"
    #: Our edit's place (its file, or the function it was in) is gone.
    TARGET_GONE = "target gone"


@dataclass
class Outcome:
    fix_id: str
    status: Status
    reason: str
    plan: Plan | None = None
    #: relpath -> text before this fix's edits (None: a new file).
    before: dict[str, str | None] = field(default_factory=dict)
    #: How native was judged: of the tree as it is, or (ours, both, target
    #: gone) of the tree with our edit taken out.
    evidence: Evidence | None = None
    changed: list[Changed] = field(default_factory=list)
    gone: list[Gone] = field(default_factory=list)
    record: EditRecord | None = None

    @property
    def files(self) -> list[str]:
        if self.plan is not None:
            return sorted(self.plan.texts)
        return sorted(self.record.files) if self.record else []

    @property
    def tests(self) -> list[str]:
        if self.plan is not None:
            return sorted(self.plan.tests)
        if self.record is None:
            return []
        return sorted([*self.record.tests, record_path(self.fix_id)])


@dataclass
class Backport:
    root: Path
    outcomes: list[Outcome]
    #: relpath -> text after every bindable fix (source files, written tests
    #: and each fix's record).
    edited: dict[str, str] = field(default_factory=dict)

    def needed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status is Status.NEEDED]

    def unbound(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status is Status.CANNOT_BIND]


class NotAVllmTreeError(ValueError):
    pass


class ConflictError(ValueError):
    def __init__(self, files: list[str]) -> None:
        super().__init__(
            f"conflict markers in {', '.join(files)}; resolve them and run "
            "--check again"
        )
        self.files = files


class OverlaySourceReader(SourceReader):
    """A tree's source as it would read with ``edited`` written."""

    def __init__(self, root: Path, edited: dict[str, str]) -> None:
        super().__init__(root=root)
        self._edited = edited

    def text(self, module: str) -> str | None:
        relpath = module_path(module)
        if relpath in self._edited:
            return self._edited[relpath]
        return super().text(module)


class Judged(NamedTuple):
    """The state the plugin would reach on a tree (the fix enabled), and why."""

    state: PatchState
    reason: str
    evidence: Evidence | None

    def finding(self) -> str | None:
        """How native or needed was found; None without the code it fixes."""
        return None if self.evidence is None else self.evidence.finding()


def _judged(verdict: Verdict) -> Judged:
    return Judged(*verdict.settle(), verdict.evidence)


def detect(root: Path, edited: dict[str, str] | None = None) -> dict[str, Judged]:
    """Each fix judged on the tree, or as if ``edited`` were written."""
    sources = OverlaySourceReader(root, edited or {})
    return {fix.id: _judged(judge(fix, sources)) for fix in fixes.all_fixes()}


def judge_one(root: Path, fix_id: str, edited: dict[str, str] | None = None) -> Judged:
    return _judged(judge(fixes.get(fix_id), OverlaySourceReader(root, edited or {})))


def planner(fix_id: str) -> ModuleType:
    return importlib.import_module(f"{fixes.get(fix_id).package}.backport")


def conflicted_files(root: Path) -> list[str]:
    """The files the fixes read, edit or wrote that hold git's conflict markers."""
    scanned = [
        *(root / "vllm" / "v1" / "worker").rglob("*.py"),
        *(root / "tests" / "v1" / "worker").glob("*graphsafe_backport_*"),
    ]
    return [
        relpath
        for relpath in sorted({str(path.relative_to(root)) for path in scanned})
        if any(
            line.startswith(("<<<<<<< ", ">>>>>>> "))
            for line in (read_exact(root / relpath) or "").splitlines()
        )
    ]


def read_record(root: Path, fix_id: str) -> EditRecord | None:
    text = read_exact(root / record_path(fix_id))
    if text is None:
        return None
    record = EditRecord.from_text(text)
    return record if record is not None and record.fix_id == fix_id else None


def backport(root: Path, fix_ids: list[str] | None = None) -> Backport:
    """Where the tree stands for each requested fix (all by default), and the
    edit of each fix it needs."""
    if not (root / "vllm" / "__init__.py").is_file():
        raise NotAVllmTreeError(
            f"{root} does not hold a vllm/ package (no {root / 'vllm' / '__init__.py'})"
        )
    conflicts = conflicted_files(root)
    if conflicts:
        raise ConflictError(conflicts)
    wanted = [fix for fix in fixes.fix_ids() if fix_ids is None or fix in fix_ids]
    tree = Tree(root)
    outcomes: list[Outcome] = []
    records = {fix: read_record(root, fix) for fix in fixes.fix_ids()}
    for fix_id in wanted:
        record = records[fix_id]
        if record is not None:
            outcomes.append(_carried(root, fix_id, record, records))
            continue
        patch = judge_one(root, fix_id)
        if patch.state is PatchState.NOT_APPLICABLE:
            outcomes.append(Outcome(fix_id, Status.NOT_APPLICABLE, patch.reason))
            continue
        if patch.state is PatchState.NATIVE:
            outcome = Outcome(fix_id, Status.NATIVE, patch.reason)
        else:
            outcome = _plan_one(tree, fix_id)
        outcome.evidence = patch.evidence
        outcomes.append(outcome)
    # Each planned record names its files as the whole write leaves them (a
    # later fix may edit the same file), for git's three-way merge to start from.
    for outcome in outcomes:
        if outcome.plan is None or outcome.record is None:
            continue
        text = with_written_blobs(outcome.record, tree.edited).to_text()
        outcome.plan.tests[record_path(outcome.fix_id)] = text
        tree.edited[record_path(outcome.fix_id)] = text
    return Backport(root, outcomes, dict(tree.edited))


def _later(fix_id: str, records: dict[str, EditRecord | None]) -> list[EditRecord]:
    order = fixes.fix_ids()
    return [
        record
        for fix in order[order.index(fix_id) + 1 :]
        if (record := records.get(fix)) is not None
    ]


def _files_of(records: Iterable[EditRecord]) -> list[str]:
    return sorted({p for r in records for p in [*r.files, *r.tests]})


def without_ours(
    record: EditRecord,
    later: list[EditRecord],
    current: dict[str, str | None],
    repository: git.Repository | None = None,
) -> tuple[Reversal, list[str]]:
    """The recorded files with ``record``'s edit taken out, and the fixes
    whose later edits had to go with it: where a later edit was made over our
    lines (e.g. in the same import statement), our lines are found only once
    the later edits are taken out, in the reverse of the order they were made."""
    direct = reverse(record, current, repository)
    if not direct.changed or not later:
        return direct, []
    texts = dict(current)
    for made_later in reversed(later):
        texts.update(reverse(made_later, texts, repository).texts)
    beneath = reverse(record, texts, repository)
    if beneath.changed:
        return direct, []
    return beneath, [r.fix_id for r in later if set(r.files) & set(record.files)]


def _gone_reason(gone: list[Gone], left: list[str], without: Judged) -> str:
    files = [g.what for g in gone if g.what == g.relpath]
    places = [g.what for g in gone if g.what != g.relpath and g.relpath not in files]
    if without.state is PatchState.NOT_APPLICABLE:
        found = Status.NOT_APPLICABLE.value
    else:
        found = without.finding() or Status.NEEDED.value
    return (
        f"the tree no longer has {' nor '.join(dict.fromkeys(files + places))}, "
        f"where our edit was; left of ours: {', '.join(left)}; the tree without "
        f"them: {found}; drop what is left (--drop)"
    )


def _carried(
    root: Path, fix_id: str, record: EditRecord, records: dict[str, EditRecord | None]
) -> Outcome:
    later = _later(fix_id, records)
    current = {p: read_exact(root / p) for p in _files_of([record, *later])}
    reversal, _ = without_ours(record, later, current)
    changed = reversal.changed + [
        Changed(relpath, f"{relpath} is gone or no longer as written\n")
        for relpath in tests_changed(record, current)
    ]
    if changed:
        patch = judge_one(root, fix_id)
        where = ", ".join(dict.fromkeys(c.relpath for c in changed))
        gone = ", ".join(dict.fromkeys(g.what for g in reversal.gone))
        status, reason = Status.OURS_CHANGED, f"our edit was changed in {where}"
        if gone:
            reason += f"; the tree no longer has {gone}"
    else:
        without = {
            p: t for p, t in {**current, **reversal.texts}.items() if t is not None
        }
        patch = judge_one(root, fix_id, without)
        if reversal.gone:
            left = [p for p, t in reversal.texts.items() if t != current.get(p)]
            left += [*sorted(record.tests), record_path(fix_id)]
            status = Status.TARGET_GONE
            reason = _gone_reason(reversal.gone, left, patch)
        elif patch.state is PatchState.NATIVE:
            status = Status.BOTH
            reason = "the tree fixes it without our edit: drop ours (--drop)"
        else:
            status = Status.OURS
            reason = "our edit, as written; the tree still needs it"
    return Outcome(
        fix_id,
        status,
        reason,
        evidence=patch.evidence,
        changed=changed,
        gone=reversal.gone,
        record=record,
    )


def _plan_one(tree: Tree, fix_id: str) -> Outcome:
    try:
        plan = planner(fix_id).plan(tree)
    except MissingSymbolError as missing:
        return Outcome(fix_id, Status.CANNOT_BIND, f"missing {missing}")
    candidate = {**tree.edited, **plan.texts}
    after = judge_one(tree.root, fix_id, candidate)
    if after.state is not PatchState.NATIVE:
        # Our edit must pass the fix's own cases; refuse rather than guess.
        return Outcome(
            fix_id,
            Status.CANNOT_BIND,
            f"the planned edit does not pass the fix's cases ({after.finding()})",
        )
    for relpath, text in plan.texts.items():
        plan.texts[relpath] = keep_line_endings(tree.current(relpath), text)
    written = [*plan.tests, record_path(fix_id)]
    before = {path: tree.current(path) for path in [*plan.texts, *written]}
    record = record_of(fix_id, before, plan.texts, plan.tests)
    record.directories = _directories_to_create(tree, written)
    plan.tests[record_path(fix_id)] = record.to_text()
    tree.edited.update(plan.texts)
    tree.edited.update(plan.tests)
    return Outcome(fix_id, Status.NEEDED, plan.layout, plan, before, record=record)


def keep_line_endings(original: str | None, edited: str) -> str:
    """``edited`` with the lines an edit added ending in CR LF where all of
    ``original``'s do."""
    if original is None or "\r\n" not in original:
        return edited
    if original.count("\r\n") != original.count("\n"):
        return edited  # mixed endings: the edit's own lines end with LF
    return re.sub(r"(?<!\r)\n", "\r\n", edited)


def _directories_to_create(tree: Tree, relpaths: list[str]) -> list[str]:
    """The parents of ``relpaths`` that neither the tree nor an earlier edit
    has, deepest first."""
    wanted: set[str] = set()
    for relpath in relpaths:
        for parent in Path(relpath).parents[:-1]:  # all but "."
            on_disk = (tree.root / parent).is_dir()
            by_edit = any(p.startswith(f"{parent}/") for p in tree.edited)
            if not on_disk and not by_edit:
                wanted.add(str(parent))
    return sorted(wanted, key=lambda d: (-d.count("/"), d))


@dataclass
class Dropping:
    """What ``--drop`` does to the tree: relpath -> new text (None: delete)."""

    outcomes: list[Outcome]
    changes: dict[str, str | None] = field(default_factory=dict)
    #: Directories our edits created, removed where they end up empty.
    directories: list[str] = field(default_factory=list)
    #: Hunks left in place (``--force`` only): changed since written.
    left: list[Changed] = field(default_factory=list)
    #: Fixes not dropped: a later edit shares their lines (drop both).
    entangled: list[str] = field(default_factory=list)


def drop(root: Path, fix_ids: list[str] | None = None, force: bool = False) -> Dropping:
    """Our edits of the requested fixes taken out, their tests and records
    deleted. Where a hunk changed since it was written, nothing of that fix
    is dropped unless ``force``: then the changed hunks stay."""
    result = backport(root, fix_ids)
    dropping = Dropping(result.outcomes)
    records = {fix: read_record(root, fix) for fix in fixes.fix_ids()}
    repository = git.Repository.of(root)
    texts: dict[str, str | None] = {}
    droppable = {Status.OURS, Status.BOTH, Status.TARGET_GONE}
    if force:
        droppable.add(Status.OURS_CHANGED)
    for outcome in reversed(result.outcomes):
        record = outcome.record
        if record is None or outcome.status not in droppable:
            continue
        later = _later(record.fix_id, records)
        files = _files_of([record, *later])
        current = {p: texts[p] if p in texts else read_exact(root / p) for p in files}
        reversal, entangled = without_ours(record, later, current, repository)
        if entangled:
            dropping.entangled.append(
                f"{record.fix_id}'s edit shares lines with {', '.join(entangled)}'s, "
                "made after it: drop that too (--fix each), or drop it first"
            )
            continue
        texts.update({p: t for p, t in reversal.texts.items() if t != current.get(p)})
        records[record.fix_id] = None  # gone: later drops need not step round it
        stale_tests = set(tests_changed(record, current))
        for relpath in record.tests:
            if relpath not in stale_tests and current.get(relpath) is not None:
                texts[relpath] = None
        texts[record_path(record.fix_id)] = None
        dropping.directories += record.directories
        dropping.left += reversal.changed
        dropping.left += [
            Changed(p, f"{p} was changed since it was written; left in place\n")
            for p in sorted(stale_tests)
            if current.get(p) is not None
        ]
    dropping.changes = texts
    return dropping
