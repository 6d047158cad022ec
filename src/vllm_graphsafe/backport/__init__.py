"""The plugin's fixes as in-place edits to a vLLM source tree, for maintainers.

``backport(root, fix_ids)`` decides, with the plugin's own code-based detection
(``patch.decide(settings, SourceReader(root=root))``), which fixes the tree
lacks, and plans the edit of each: located by parsing, spliced into the
user's own text. Nothing is written here; :mod:`.output` renders diffs, patch
files and writes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from vllm_graphsafe import fixes
from vllm_graphsafe.backport.plan import Plan
from vllm_graphsafe.backport.source import MissingSymbolError
from vllm_graphsafe.backport.tree import Tree
from vllm_graphsafe.registry import Patch, PatchState, SourceReader
from vllm_graphsafe.settings import Settings

#: Fix ids in the order their edits are made (two share the V1 runner file).
FIX_IDS = tuple(fixes.fix_ids())


class Status(str, enum.Enum):
    NATIVE = "native"
    NEEDED = "needed"
    CANNOT_BIND = "cannot bind"
    NOT_APPLICABLE = "not applicable"


@dataclass
class Outcome:
    fix_id: str
    status: Status
    reason: str
    plan: Plan | None = None
    #: relpath -> text before this fix's edits (None: a new file).
    before: dict[str, str | None] = field(default_factory=dict)


@dataclass
class Backport:
    """The decision for each requested fix, and the tree's files after the edits."""

    root: Path
    outcomes: list[Outcome]
    #: relpath -> text after every bindable fix (source files and written tests).
    edited: dict[str, str] = field(default_factory=dict)

    def needed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status is Status.NEEDED]

    def unbound(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status is Status.CANNOT_BIND]


class NotAVllmTreeError(ValueError):
    """DIR does not hold a ``vllm/`` package."""


class OverlaySourceReader(SourceReader):
    """A tree's source as it would read with ``edited`` (relpath -> text) written."""

    def __init__(self, root: Path, edited: dict[str, str]) -> None:
        super().__init__(root=root)
        self._edited = edited

    def text(self, module: str) -> str | None:
        relpath = "/".join(module.split(".")) + ".py"
        if relpath in self._edited:
            return self._edited[relpath]
        return super().text(module)


def _all_enabled() -> Settings:
    return Settings(
        disabled_ids=frozenset(), disable_all=False, strict=False, stats_dir=None
    )


def patches_by_id() -> dict[str, Patch]:
    return {patch.id: patch for patch in fixes.all_patches()}


def detect(root: Path, edited: dict[str, str] | None = None) -> dict[str, Patch]:
    """Each fix's plugin state for the tree, or as if ``edited`` were written."""
    sources: SourceReader = (
        SourceReader(root=root) if not edited else OverlaySourceReader(root, edited)
    )
    patches = patches_by_id()
    for patch in patches.values():
        patch.decide(_all_enabled(), sources)
    return patches


def check_tree(root: Path) -> None:
    if not (root / "vllm" / "__init__.py").is_file():
        raise NotAVllmTreeError(
            f"{root} does not hold a vllm/ package (no {root / 'vllm' / '__init__.py'})"
        )


def backport(root: Path, fix_ids: list[str] | None = None) -> Backport:
    """Decide and plan the requested fixes (all by default) for the tree at ``root``."""
    check_tree(root)
    wanted = [fix for fix in fixes.fix_ids() if fix_ids is None or fix in fix_ids]
    states = detect(root)
    tree = Tree(root)
    outcomes: list[Outcome] = []
    for fix_id in wanted:
        patch = states[fix_id]
        if patch.state is PatchState.NATIVE:
            outcomes.append(Outcome(fix_id, Status.NATIVE, patch.reason))
            continue
        if patch.state is PatchState.NOT_APPLICABLE:
            outcomes.append(Outcome(fix_id, Status.NOT_APPLICABLE, patch.reason))
            continue
        outcomes.append(_plan_one(tree, fix_id))
    return Backport(root, outcomes, dict(tree.edited))


def _plan_one(tree: Tree, fix_id: str) -> Outcome:
    try:
        plan = fixes.get(fix_id).plan(tree)
    except MissingSymbolError as missing:
        return Outcome(fix_id, Status.CANNOT_BIND, f"missing {missing}")
    candidate = {**tree.edited, **plan.texts}
    after = detect(tree.root, candidate)[fix_id]
    if after.state is not PatchState.NATIVE:
        # Our edit must read as the fix to the plugin; refuse rather than guess.
        return Outcome(
            fix_id,
            Status.CANNOT_BIND,
            f"the planned edit is not recognised as native ({after.reason})",
        )
    before = {path: tree.current(path) for path in [*plan.texts, *plan.tests]}
    tree.edited.update(plan.texts)
    tree.edited.update(plan.tests)
    return Outcome(fix_id, Status.NEEDED, plan.layout, plan, before)
