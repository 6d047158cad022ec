"""What a newcomer reads first: what the project fixes and for whom, the words
it uses, and a unit-tier command that works in a fresh environment.

CI runs the README's unit-tier block itself, in a fresh virtual environment
(scripts/readme_unit_tier.sh, from scripts/test.sh); these check what it runs.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from vllm_graphsafe.exit_statuses import DEMO_INSTALL_FAILED

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    return README.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_readme_unit_tier_block_installs_the_package_with_its_test_tools() -> None:
    block = subprocess.run(
        ["bash", str(ROOT / "scripts" / "readme_unit_tier.sh"), "--print"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    venv = next(i for i, c in enumerate(commands) if " -m venv " in c)
    install = commands.index("pip install '.[test]'")
    tests = next(
        i for i, c in enumerate(commands) if "-m pytest" in c and "tests/unit" in c
    )
    # A fresh environment, then the package and pytest, then the tier.
    assert venv < install < tests
    assert "activate" in commands[venv]
    # The extra holds what the tier imports, and the plugin its workers need.
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*)\]$", pyproject, flags=re.MULTILINE)
    assert test_extra and "pytest" in test_extra.group(1)
    if " -n " in commands[tests]:
        assert "pytest-xdist" in test_extra.group(1)


def test_the_opening_says_what_breaks_for_whom_and_who_need_not_install() -> None:
    opening = section("What this fixes, and who needs it")
    # The symptom, as an operator sees it, and where it was measured.
    assert "wrong tokens" in opening
    assert "H200" in opening and "vLLM 0.33's GDN" in opening
    assert "another\nuser's answer" in opening or "another user's answer" in opening
    # Who is affected, and who is not.
    for setting in ("GDN", "Mamba", "speculative decoding", "FULL", "one token"):
        assert setting in opening, setting
    assert "**Who needs it.**" in opening and "**Who need not.**" in opening
    assert "--enforce-eager" in opening
    # The second bug: what is known, and what is not.
    assert "**The second bug" in opening
    assert "What is known" in opening and "What is not" in opening


def test_every_term_the_readme_leans_on_is_in_its_glossary() -> None:
    glossary = section("What this fixes, and who needs it").split(
        "### Words used here", 1
    )[1]
    defined = " ".join(
        row.split("|")[1] for row in glossary.splitlines() if row.startswith("| ")
    )
    for term in (
        "K+1",
        "decode graph",
        "FULL graph",
        "GDN",
        "Mamba",
        "boundary prompt",
        "native",
        "DBO",
        "dummy run",
        "prefix-cache hit",
        "Model Runner V2",
    ):
        assert term in defined, term


def test_the_setup_shows_how_to_point_the_demo_at_another_index() -> None:
    setup = section("Set-up on a fresh machine")
    for variable in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        assert re.search(rf"^{variable}=\S+ bash scripts/demo\.sh", setup, re.M), (
            variable
        )
    # What a failed install looks like, and its status (the demo's table's).
    assert f"exit status {DEMO_INSTALL_FAILED}" in setup and "one sentence" in setup
