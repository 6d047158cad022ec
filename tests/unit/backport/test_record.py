"""The record of an edit: each region put back byte for byte, or named where changed."""

from __future__ import annotations

from vllm_graphsafe.backport.record import EditRecord, record_of, reverse

ORIGINAL = "".join(f"line {i}\n" for i in range(40))


def edited(lines: list[str]) -> str:
    return "".join(lines)


def with_edits() -> str:
    lines = ORIGINAL.splitlines(keepends=True)
    lines.insert(10, "ours A\n")
    lines.insert(13, "ours B\n")  # close to A: one region with it
    lines[30] = "ours C\n"
    return edited(lines)


def recorded(original: str, after: str) -> EditRecord:
    record = record_of("fix", {"f.py": original}, {"f.py": after}, {"t.py": "test\n"})
    parsed = EditRecord.from_text(record.to_text())
    assert parsed is not None
    return parsed


def test_every_region_goes_back_as_it_was() -> None:
    after = with_edits()
    record = recorded(ORIGINAL, after)
    assert len(record.regions["f.py"]) == 2
    restored, changed = reverse(record, {"f.py": after})
    assert restored["f.py"] == ORIGINAL and changed == []


def test_lines_a_merge_added_elsewhere_do_not_matter() -> None:
    after = with_edits()
    record = recorded(ORIGINAL, after)
    merged = "upstream 1\nupstream 2\n" + after + "upstream tail\n"
    restored, changed = reverse(record, {"f.py": merged})
    assert changed == []
    assert restored["f.py"] == "upstream 1\nupstream 2\n" + ORIGINAL + "upstream tail\n"


def test_a_changed_region_is_shown_and_the_others_still_go_back() -> None:
    after = with_edits()
    record = recorded(ORIGINAL, after)
    touched = after.replace("ours C\n", "ours C, edited by hand\n")
    restored, changed = reverse(record, {"f.py": touched})
    assert [c.relpath for c in changed] == ["f.py"]
    assert "-ours C\n+ours C, edited by hand\n" in changed[0].diff
    assert "ours A" not in (restored["f.py"] or "")


def test_line_endings_and_a_missing_final_newline_survive() -> None:
    original = ORIGINAL.replace("\n", "\r\n").rstrip("\r\n")
    after = original.replace("line 5\r\n", "line 5\r\nours\r\n")
    record = recorded(original, after)
    restored, changed = reverse(record, {"f.py": after})
    assert restored["f.py"] == original and changed == []


def test_a_damaged_record_is_no_record() -> None:
    assert EditRecord.from_text("{not json") is None
    assert EditRecord.from_text('{"format": "something else"}') is None


def test_an_edit_made_over_another_in_the_same_lines_is_told() -> None:
    from vllm_graphsafe.backport import reversed_in_place

    first_text = ORIGINAL.replace("line 20\n", "line 20\nfirst\n")
    second_text = first_text.replace("first\n", "first\nsecond\n")
    first = recorded(ORIGINAL, first_text)
    second = record_of("later", {"f.py": first_text}, {"f.py": second_text}, {})

    texts, changed, entangled = reversed_in_place(
        first, [second], {"f.py": second_text}
    )
    assert changed == [] and entangled == ["later"]

    apart = first_text.replace("line 35\n", "line 35\nsecond\n")
    second = record_of("later", {"f.py": first_text}, {"f.py": apart}, {})
    texts, changed, entangled = reversed_in_place(first, [second], {"f.py": apart})
    assert entangled == [] and changed == []
    assert texts["f.py"] == ORIGINAL.replace("line 35\n", "line 35\nsecond\n")
