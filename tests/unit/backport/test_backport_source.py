"""Splicing, import rewriting and diffs on small synthetic modules (no vLLM)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vllm_graphsafe import recognition
from vllm_graphsafe.backport.output import file_diff
from vllm_graphsafe.tree_edits.imports import render_import, rewrite_import
from vllm_graphsafe.tree_edits.source import LineEdit, MissingSymbolError, SourceFile

MODULE = """\
import numpy as np

from vllm.a import alpha
from vllm.c.d import (
    Gamma,
    delta,
    shape_rule,
)
from vllm.e import epsilon


def f():
    return shape_rule(1, 2, 3)
"""


def source(text: str = MODULE) -> SourceFile:
    return SourceFile.parse("vllm/m.py", text)


def test_short_imports_stay_on_one_line_and_long_ones_wrap() -> None:
    assert (
        render_import("vllm.x", ["b", "A", "C_D"]) == "from vllm.x import C_D, A, b\n"
    )
    names = [f"a_rather_long_name_{i}" for i in range(4)]
    wrapped = render_import("vllm.x", names)
    assert wrapped.startswith("from vllm.x import (\n")
    assert all(len(line) <= 88 for line in wrapped.splitlines())


def test_dropping_a_name_changes_only_its_line() -> None:
    """A statement written one name a line stays so (ruff keeps it so for its
    trailing comma): the edit is the one line, not the statement."""
    module = source()
    text = module.apply(rewrite_import(module, "vllm.c.d", {"shape_rule"}, set()))
    assert text == MODULE.replace("    shape_rule,\n", "")
    one_line = source(
        MODULE.replace(
            "(\n    Gamma,\n    delta,\n    shape_rule,\n)", "Gamma, delta, shape_rule"
        )
    )
    text = one_line.apply(rewrite_import(one_line, "vllm.c.d", {"shape_rule"}, set()))
    assert "from vllm.c.d import Gamma, delta\n" in text


def test_dropping_the_only_name_deletes_the_statement() -> None:
    module = source("from vllm.a import alpha\nfrom vllm.b import beta\n")
    text = module.apply(rewrite_import(module, "vllm.a", {"alpha"}, set()))
    assert text == "from vllm.b import beta\n"


def test_a_new_import_goes_where_isort_puts_it() -> None:
    module = source()
    text = module.apply(rewrite_import(module, "vllm.b", set(), {"beta"}))
    lines = text.splitlines()
    assert (
        lines.index("from vllm.b import beta")
        == lines.index("from vllm.a import alpha") + 1
    )


def test_removing_a_name_the_module_does_not_import_names_it() -> None:
    module = source()
    with pytest.raises(MissingSymbolError, match="omega"):
        rewrite_import(module, "vllm.c.d", {"omega"}, set())


def test_overlapping_edits_are_refused() -> None:
    module = source()
    with pytest.raises(ValueError, match="overlapping"):
        module.apply([LineEdit(0, 3, "x\n"), LineEdit(2, 4, "y\n")])


@pytest.mark.parametrize("old", [None, "a\nb\n", "a\nb"])
def test_file_diffs_apply_with_git(tmp_path: Path, old: str | None) -> None:
    relpath = "pkg/mod.py"
    target = tmp_path / relpath
    if old is not None:
        target.parent.mkdir(parents=True)
        target.write_text(old)
    new = "a\ninserted\nb\n"
    (tmp_path / "change.diff").write_text(file_diff(relpath, old, new))

    applied = subprocess.run(
        ["git", "apply", "change.diff"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )

    assert applied.returncode == 0, applied.stderr
    assert target.read_text() == new


def test_a_backport_command_parses_each_text_once_and_keeps_nothing_after() -> None:
    text = MODULE + "\n"  # a text of its own, parsed by no other test
    assert recognition.parse(text) is not recognition.parse(text)
    with recognition.parses_kept():
        first = recognition.parse(text)
        with recognition.parses_kept():
            assert recognition.parse(text) is first
        assert SourceFile.parse("m.py", text).tree is first
        assert recognition.parse("def broken(:\n") is None
    assert recognition.parse(text) is not first
