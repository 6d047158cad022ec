"""Our edits carried through upstream merges that change the lines next to them.

On the installed release's tree in git: ``--write`` committed on ``ours``; for
each kind of upstream change next to every hunk of every fix written (a line
edited and one added directly above, directly below, between two hunks; the
function a hunk sits in renamed, moved; a formatter's reflow; the function or
the file removed), upstream's branch is merged into ours. Then ``--check``
says ``ours`` (or ``target gone`` where upstream removed our lines' place),
``--drop`` leaves upstream's tree byte for byte, and ``--check`` then finds
nothing of ours. One repository per tree serves every case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backport_trees import copy_sources
from tests.release.merge_cycle import (
    CARRIED,
    Carrying,
    backport,
    carrying,
    git,
    lines_removed,
    merge_upstream,
    same_as_upstream,
    states,
)
from tests.release.neighbours import NEIGHBOURS, NOTE, REMOVALS, Change


@pytest.fixture(scope="module")
def carried(
    release_package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Carrying:
    root = tmp_path_factory.mktemp("carried")
    copy_sources(release_package, root)
    tree = carrying(root)
    if not tree.records:
        pytest.skip("this release needs none of the fixes")
    return tree


def upstream_next_to_ours(tree: Carrying, name: str, change: Change) -> None:
    merged = merge_upstream(tree, name, change)
    gone = lines_removed(tree, merged) if name in REMOVALS else set()

    report = backport(tree.root, "--check")

    expected = {fix: "target gone" if fix in gone else "ours" for fix in tree.records}
    assert {f: s for f, s in states(report).items() if f in tree.records} == expected, [
        (fix["id"], fix["changed"]) for fix in report["fixes"] if fix["changed"]
    ]
    dropped = backport(tree.root, "--drop")
    assert dropped["exit_status"] == 0, dropped
    assert same_as_upstream(tree.root, name) == ""
    after = states(backport(tree.root, "--check"))
    assert not set(after.values()) & CARRIED, after


@pytest.mark.parametrize("name", NEIGHBOURS)
def test_upstream_changes_next_to_our_hunks(carried: Carrying, name: str) -> None:
    upstream_next_to_ours(carried, name, NEIGHBOURS[name])


@pytest.mark.parametrize("name", REMOVALS)
def test_upstream_removes_where_our_edit_is(carried: Carrying, name: str) -> None:
    upstream_next_to_ours(carried, name, REMOVALS[name])


def test_a_change_to_our_own_lines_is_refused(carried: Carrying) -> None:
    our_own_lines_changed(carried)


def our_own_lines_changed(carried: Carrying) -> None:
    """A line of each fix's edit changed by hand: ``ours, changed``, the line
    shown, and ``--drop`` changes nothing."""
    root = carried.root
    git(root, "reset", "-q", "--hard")
    git(root, "clean", "-fdq")
    git(root, "checkout", "-q", "-B", "hand-edit", "ours")
    for record in carried.records.values():
        relpath, edit = next(iter(record.files.items()))
        hunk = next(h for h in edit.hunks if h.after.strip())
        path = root / relpath
        text = path.read_text(encoding="utf-8")
        line = next(
            line for line in hunk.after.splitlines(keepends=True) if line.strip()
        )
        edited = hunk.after.replace(line, line.rstrip("\n") + f"  {NOTE}\n", 1)
        assert text.count(hunk.after) == 1
        path.write_text(text.replace(hunk.after, edited), encoding="utf-8")
    git(root, "commit", "-q", "-am", "a hand edit of our lines")

    report = backport(root, "--check")

    assert {
        f: s for f, s in states(report).items() if f in carried.records
    } == dict.fromkeys(carried.records, "ours, changed")
    assert report["exit_status"] == 6
    for fix in report["fixes"]:
        if fix["id"] in carried.records:
            assert any(NOTE in changed["diff"] for changed in fix["changed"]), fix
    refused = backport(root, "--drop")
    assert refused["exit_status"] == 6
    assert git(root, "status", "--porcelain").stdout == ""
