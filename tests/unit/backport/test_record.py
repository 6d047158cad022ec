"""The record of an edit: our hunks found by our own lines and taken out byte for
byte, wherever a merge moved or changed upstream's lines around them; a change
to our own lines shown, a place upstream removed told apart from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vllm_graphsafe.backport import without_ours
from vllm_graphsafe.backport.git import Repository
from vllm_graphsafe.backport.ours import Changed, Gone, reverse
from vllm_graphsafe.backport.record import (
    EditRecord,
    definitions,
    record_of,
    with_written_blobs,
)

UPSTREAM = "".join(f"line {i}\n" for i in range(40))


def ours_in(text: str) -> str:
    lines = text.splitlines(keepends=True)
    lines.insert(10, "ours A\n")
    lines.insert(13, "ours B\n")  # two upstream lines between A and B
    lines[30] = "ours C\n"  # replaces upstream's line 28
    return "".join(lines)


def recorded(original: str, after: str, relpath: str = "f.py") -> EditRecord:
    record = record_of("fix", {relpath: original}, {relpath: after}, {"t.py": "test\n"})
    parsed = EditRecord.from_text(record.to_text())
    assert parsed is not None
    return parsed


def test_every_hunk_goes_back_as_it_was() -> None:
    after = ours_in(UPSTREAM)
    record = recorded(UPSTREAM, after)
    assert [h.after for h in record.files["f.py"].hunks] == [
        "ours A\n",
        "ours B\n",
        "ours C\n",
    ]
    reversal = reverse(record, {"f.py": after})
    assert reversal.texts["f.py"] == UPSTREAM
    assert reversal.changed == [] and reversal.gone == []


@pytest.mark.parametrize(
    "where",
    ["line 9\n", "line 10\n", "line 11\n", "line 27\n", "line 29\n", "line 0\n"],
    ids=["above", "below", "between", "above-replaced", "below-replaced", "far"],
)
def test_upstream_lines_next_to_ours_may_change(where: str) -> None:
    """Upstream edits the line just above, just below or between our hunks,
    and adds lines elsewhere: ours are still found, and taking them out
    leaves upstream's file."""
    record = recorded(UPSTREAM, ours_in(UPSTREAM))
    upstream = "new first\n" + UPSTREAM.replace(where, "upstream's own\n") + "tail\n"
    merged = "new first\n" + ours_in(UPSTREAM).replace(where, "upstream's own\n")
    merged += "tail\n"
    reversal = reverse(record, {"f.py": merged})
    assert reversal.changed == []
    assert reversal.texts["f.py"] == upstream


def test_a_record_keeps_upstreams_lines_only_as_a_hint() -> None:
    """Where our lines recur, the place whose neighbours agree is ours."""
    upstream = "a\nours\nb\n" + "x\n" * 10 + "c\nd\n"
    after = upstream.replace("c\nd\n", "c\nours\nd\n")
    record = recorded(upstream, after)
    reversal = reverse(record, {"f.py": after})
    assert reversal.texts["f.py"] == upstream


def test_blank_lines_a_merge_aligned_the_other_way() -> None:
    """An insertion that ends in a blank line, where upstream removed the
    blank line above it: the merge keeps our lines' blank line above them."""
    upstream = "def a():\n    pass\n\ndef c():\n    pass\n"
    after = "def a():\n    pass\n\ndef b():\n    pass\n\ndef c():\n    pass\n"
    record = recorded(upstream, after)
    assert record.files["f.py"].hunks[0].after == "def b():\n    pass\n\n"
    upstream_now = "def a():\n    pass\ndef c():\n    pass\n"
    merged = "def a():\n    pass\n\ndef b():\n    pass\ndef c():\n    pass\n"
    reversal = reverse(record, {"f.py": merged})
    assert reversal.changed == []
    assert reversal.texts["f.py"] == upstream_now


def test_a_change_to_our_lines_is_shown_and_the_rest_still_go_back() -> None:
    after = ours_in(UPSTREAM)
    record = recorded(UPSTREAM, after)
    touched = after.replace("ours C\n", "ours C, edited by hand\n")
    reversal = reverse(record, {"f.py": touched})
    assert [c.relpath for c in reversal.changed] == ["f.py"]
    assert "-ours C\n+ours C, edited by hand\n" in reversal.changed[0].diff
    assert "ours A" not in (reversal.texts["f.py"] or "")


def test_our_lines_gone_from_a_place_upstream_rewrote_are_shown_taken_out() -> None:
    """Our lines at module level, where upstream rewrote everything around
    them and the merge kept upstream's side: nothing like them, nor their
    neighbours, is there."""
    upstream = "import a\nimport b\nimport c\n\nX = 1\n"
    ours = upstream.replace("import b\n", "import b\nimport ours\n")
    record = recorded(upstream, ours)
    merged = "import alpha\nimport beta\n\nX = 1\n"
    reversal = reverse(record, {"f.py": merged})
    assert reversal.gone == []
    (changed,) = reversal.changed
    assert changed.diff.endswith("@@ -1 +0,0 @@\n-import ours\n")


SOURCE = """\
class Runner:
    def step(self):
        x = 1
        y = 2
        return x + y

    def other(self):
        return 0
"""
OURS = SOURCE.replace(
    "        y = 2\n",
    "        y = 2\n        # ours: checked\n        assert x < y, (x, y)\n",
)


def test_the_function_our_lines_were_in_removed_is_gone() -> None:
    record = recorded(SOURCE, OURS)
    assert record.files["f.py"].hunks[0].scope == "Runner.step"
    removed = "class Runner:\n    def other(self):\n        return 0\n"
    reversal = reverse(record, {"f.py": removed})
    assert reversal.changed == []
    assert reversal.gone == [Gone("f.py", "Runner.step in f.py")]
    assert reversal.texts["f.py"] == removed
    assert reverse(record, {"f.py": None}).gone == [Gone("f.py", "f.py")]


def test_our_lines_changed_in_a_renamed_function_are_changed_not_gone() -> None:
    record = recorded(SOURCE, OURS)
    renamed = OURS.replace("def step", "def step_v2").replace("x < y", "x <= y")
    reversal = reverse(record, {"f.py": renamed})
    assert reversal.gone == []
    assert [type(c) for c in reversal.changed] == [Changed]


def test_line_endings_and_a_missing_final_newline_survive() -> None:
    original = UPSTREAM.replace("\n", "\r\n").rstrip("\r\n")
    after = original.replace("line 5\r\n", "line 5\r\nours\r\n")
    record = recorded(original, after)
    reversal = reverse(record, {"f.py": after})
    assert reversal.texts["f.py"] == original and reversal.changed == []


def test_a_damaged_record_is_no_record() -> None:
    text = recorded(UPSTREAM, ours_in(UPSTREAM)).to_text()
    assert EditRecord.from_text(text) is not None
    assert (
        EditRecord.from_text(
            text.replace('"written_blob": null', '"written_blob": "-p"')
        )
        is None
    )
    assert EditRecord.from_text("{not json") is None
    assert EditRecord.from_text('{"format": "something else"}') is None
    assert (
        EditRecord.from_text('{"format": "vllm-graphsafe backport record 2"}') is None
    )


#: A record as vllm-graphsafe wrote it before its records held hunks: "line 4"
#: given "ours A" after it and "line 8" replaced by "ours B".
FORMAT_1 = """{
 "format": "vllm-graphsafe backport record 1",
 "fix": "fix",
 "files": {"f.py": [{
    "line": 5,
    "context_before": "line 2\\nline 3\\nline 4\\n",
    "before": "line 5\\nline 6\\nline 7\\nline 8\\n",
    "after": "ours A\\nline 5\\nline 6\\nline 7\\nours B\\n",
    "context_after": "line 9\\nline 10\\nline 11\\n"}]},
 "created": {"f.py": false},
 "tests": {"t.py": "f2ca1bb6c7e907d06dafe4687e579fce76b37e4e93b7605022da52e6ccc26fd2"},
 "directories": []
}
"""


def test_a_record_of_the_first_format_is_read_as_hunks() -> None:
    record = EditRecord.from_text(FORMAT_1)
    assert record is not None
    upstream = "".join(f"line {i}\n" for i in range(12))
    written = upstream.replace("line 4\n", "line 4\nours A\n").replace(
        "line 8\n", "ours B\n"
    )
    # Upstream changed a line between our two runs, and one just above.
    upstream_now = upstream.replace("line 6\n", "six\n").replace("line 4\n", "four\n")
    merged = written.replace("line 6\n", "six\n").replace("line 4\n", "four\n")
    reversal = reverse(record, {"f.py": merged})
    assert reversal.changed == []
    assert reversal.texts["f.py"] == upstream_now


def test_an_edit_made_over_another_in_the_same_lines_is_told() -> None:
    first_text = UPSTREAM.replace("line 20\n", "line 20\nfirst\n")
    second_text = first_text.replace("first\n", "first (and second)\n")
    first = recorded(UPSTREAM, first_text)
    second = record_of("later", {"f.py": first_text}, {"f.py": second_text}, {})

    reversal, entangled = without_ours(first, [second], {"f.py": second_text})
    assert reversal.changed == [] and entangled == ["later"]
    assert reversal.texts["f.py"] == UPSTREAM

    apart = first_text.replace("line 35\n", "line 35\nsecond\n")
    second = record_of("later", {"f.py": first_text}, {"f.py": apart}, {})
    reversal, entangled = without_ours(first, [second], {"f.py": apart})
    assert entangled == [] and reversal.changed == []
    assert reversal.texts["f.py"] == UPSTREAM.replace("line 35\n", "line 35\nsecond\n")


# -- git's three-way merge, where the tree is a repository ---------------------------

#: Two functions alike but for one line, which our edit adds to the second.
BODY = "    a = 1\n    b = 1\n    c = 1\n{}    d = 1\n    e = 1\n    z = 1\n"
TWINS = "def f():\n" + BODY.format("    check()\n") + "\n\ndef g():\n" + BODY.format("")
TWINS_OURS = TWINS + ""
TWINS_OURS = (
    TWINS_OURS[: TWINS_OURS.rindex("    d = 1")]
    + "    check()\n"
    + (TWINS_OURS[TWINS_OURS.rindex("    d = 1") :])
)
PREAMBLE = "".join(f"# upstream's line {i}\n" for i in range(20))


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_git_takes_our_lines_out_where_they_recur_alike(tmp_path: Path) -> None:
    """Our line and its neighbours recur; upstream added lines above both.
    From our lines alone, the nearer copy is upstream's; git's three-way
    merge from the file as written takes out ours."""
    assert TWINS_OURS.count("check()") == 2
    record = recorded(TWINS, TWINS_OURS)
    merged = PREAMBLE + TWINS_OURS
    upstream_now = PREAMBLE + TWINS

    by_lines = reverse(record, {"f.py": merged})
    assert by_lines.texts["f.py"] != upstream_now  # the first copy went

    assert Repository.of(tmp_path) is None
    git(tmp_path, "init", "-q")
    (tmp_path / "f.py").write_text(TWINS_OURS)
    git(tmp_path, "add", "f.py")
    git(tmp_path, "commit", "-qm", "our edit")
    repository = Repository.of(tmp_path)
    assert repository is not None
    written = {"f.py": TWINS_OURS}
    with_written_blobs(record, written)
    by_git = reverse(record, {"f.py": merged}, repository)
    assert by_git.changed == []
    assert by_git.texts["f.py"] == upstream_now


def test_without_the_file_as_written_the_hunks_are_taken_out_one_by_one(
    tmp_path: Path,
) -> None:
    git(tmp_path, "init", "-q")
    repository = Repository.of(tmp_path)
    assert repository is not None
    after = ours_in(UPSTREAM)
    record = with_written_blobs(recorded(UPSTREAM, after), {"f.py": after})
    assert repository.blob(record.files["f.py"].written_blob or "") is None
    reversal = reverse(record, {"f.py": "x\n" + after}, repository)
    assert reversal.texts["f.py"] == "x\n" + UPSTREAM


NESTED = """\
import sys

if sys.version_info >= (3, 10):

    @decorated
    def in_if():
        def inner():
            pass
else:
    def in_else():
        pass

try:
    class InTry:
        @property
        def method(self):
            return lambda: 0
except ImportError:
    def in_handler():
        pass
finally:
    def in_finally():
        pass

with open(__file__) as handle:
    async def in_with():
        pass

match sys.platform:
    case "linux":
        def in_case():
            pass

for _ in ():
    def in_loop():
        pass
"""


def test_every_def_and_class_is_found_in_whatever_block_holds_it() -> None:
    assert sorted(definitions(NESTED) or []) == [
        (5, 8, "in_if"),
        (7, 8, "in_if.inner"),
        (10, 11, "in_else"),
        (14, 17, "InTry"),
        (15, 17, "InTry.method"),
        (19, 20, "in_handler"),
        (22, 23, "in_finally"),
        (26, 27, "in_with"),
        (31, 32, "in_case"),
        (35, 36, "in_loop"),
    ]
    assert definitions("def broken(:\n") is None
