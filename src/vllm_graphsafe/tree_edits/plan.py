"""What every fix's backport planner returns, and the helpers they share.

``plan(tree)`` raises ``MissingSymbolError`` before anything is changed: a fix
is applied whole or not at all."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources

from vllm_graphsafe import recognition
from vllm_graphsafe.tree_edits.source import (
    LineEdit,
    MissingSymbolError,
    SourceFile,
    is_call_of,
)

#: The header of every test file the backport writes (vLLM's own).
WRITTEN_TEST_HEADER = """\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""


def written_test_path(fix_id: str) -> str:
    return f"tests/v1/worker/test_graphsafe_backport_{fix_id.replace('-', '_')}.py"


def render_written_tests(
    package: str, sections: Iterable[str], **constants: bool | str
) -> str:
    """The files ``sections`` of the ``written/`` folder of ``package`` joined,
    each from the end of its ``if TYPE_CHECKING:`` block (there for ruff and
    mypy: what the files before it bind), each ``NAME = ...`` line of
    ``constants`` set to its value."""
    folder = resources.files(package) / "written"
    texts = [(folder / f"{name}.py").read_text("utf-8") for name in sections]
    text = WRITTEN_TEST_HEADER + "\n\n".join(map(_after_type_checking, texts))
    for name, value in constants.items():
        literal = f'"{value}"' if isinstance(value, str) else repr(value)
        text, count = re.subn(
            rf"^{name} = .*$", f"{name} = {literal}", text, flags=re.M
        )
        assert count == 1, f"{package}'s written tests set {name} once"
    return text


def _after_type_checking(text: str) -> str:
    for node in ast.parse(text).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            return "".join(text.splitlines(keepends=True)[node.end_lineno :]).lstrip()
    return text


@dataclass
class Plan:
    fix_id: str
    layout: str
    #: relpath -> the new text of a source file of the tree.
    texts: dict[str, str] = field(default_factory=dict)
    #: relpath -> text of a test file written beside the change.
    tests: dict[str, str] = field(default_factory=dict)
    #: Names the edit introduces, for the README and commit message.
    names: tuple[str, ...] = ()


def edit(plan: Plan, source: SourceFile, edits: list[LineEdit]) -> None:
    plan.texts[source.relpath] = source.apply(edits)


def direct_call_assignment(
    function: recognition.FunctionNode, callee: str, owner: str
) -> ast.Assign:
    """``name = callee(...)`` (or ``self.callee``) directly in ``function``."""
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and is_call_of(node.value, callee)
        ):
            return node
    raise MissingSymbolError(f"the assignment from {callee}(...) in {owner}")
