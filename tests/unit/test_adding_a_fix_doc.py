"""docs/adding-a-fix.md names the places a new fix touches, as the code has them."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import fix_tests
from vllm_graphsafe import fixes, vllm_layout
from vllm_graphsafe.fixes import all_fixes

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "adding-a-fix.md").read_text(encoding="utf-8")
FIXES = ROOT / "src" / "vllm_graphsafe" / "fixes"

#: Each place the page lists, in its order, as the code holds it.
PLACES = [
    ("Its folder", FIXES / "v1_phase_dispatch"),
    ("The list", Path(fixes.__file__)),
    ("vllm_layout.py", Path(vllm_layout.__file__)),
    ("What the test suite knows of it", Path(fix_tests.__file__)),
    ("class-level tests", ROOT / "tests" / "release" / "classes"),
    ("generated blocks", ROOT / "src" / "vllm_graphsafe" / "catalogue.py"),
    ("CHANGELOG.md", ROOT / "CHANGELOG.md"),
]


def numbered_places() -> list[str]:
    return re.findall(r"^\d+\. \*\*(.+?)\*\*", DOC, flags=re.MULTILINE)


def test_the_page_lists_every_place_and_says_how_many() -> None:
    places = numbered_places()
    assert len(places) == len(PLACES)
    for (named, path), heading in zip(PLACES, places, strict=True):
        assert named.lower() in heading.lower(), (named, heading)
        assert path.exists(), path
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert f"touches these {words[len(PLACES) - 1]} places" in DOC


def test_the_folder_modules_it_names_are_those_every_fix_folder_has() -> None:
    folders = [FIXES / fix.package.rsplit(".", 1)[-1] for fix in all_fixes()]
    every = set.intersection(*({p.name for p in f.glob("*.py")} for f in folders))
    some = set.union(*({p.name for p in f.glob("*.py")} for f in folders)) - every
    folder_part = DOC.split("2. **The list**", 1)[0]
    named = set(re.findall(r"^   - `(\w+\.py)`", folder_part, flags=re.MULTILINE))
    assert named == every, "the page's folder modules differ from every fix folder's"
    optional = set(re.findall(r"where it has any, `(\w+\.py)`", folder_part))
    assert optional <= some
