"""A vLLM source file as text plus its parse tree, and edits spliced into the text.

Every edit is located from the parse tree and replaces whole lines, so
everything around it stays byte for byte as the user's tree has it.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from vllm_graphsafe import recognition


class MissingSymbolError(LookupError):
    """What a fix must edit is not in this tree; the message names it."""


@dataclass(frozen=True)
class LineEdit:
    """Replace lines ``[start, end)`` (0-based) of a file with ``text``."""

    start: int
    end: int
    text: str


@dataclass
class SourceFile:
    relpath: str
    text: str
    tree: ast.Module

    @classmethod
    def parse(cls, relpath: str, text: str) -> SourceFile:
        tree = recognition.parse(text)
        if tree is None:
            raise MissingSymbolError(f"{relpath} as Python (it does not parse)")
        return cls(relpath, text, tree)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    def function(self, qualname: str) -> recognition.FunctionNode:
        node = recognition.find_function(self.tree, qualname)
        if node is None:
            raise MissingSymbolError(f"{self.module_name}.{qualname}")
        return node

    def require_class(
        self, name: str, attributes: tuple[str, ...] = ()
    ) -> ast.ClassDef:
        """The class ``name``, whose instances get each of ``attributes``."""
        cls = recognition.find_class(self.tree, name)
        if cls is None:
            raise MissingSymbolError(f"{self.module_name}.{name}")
        for attribute in attributes:
            if not recognition.class_sets_attribute(cls, attribute):
                raise MissingSymbolError(f"{self.module_name}.{name}.{attribute}")
        return cls

    @property
    def module_name(self) -> str:
        return self.relpath.removesuffix(".py").replace("/", ".")

    def indent_of(self, node: ast.stmt) -> str:
        line = self.lines[node.lineno - 1]
        return line[: len(line) - len(line.lstrip())]

    def insert_before(self, node: ast.stmt, text: str) -> LineEdit:
        """``text`` above ``node`` (and its decorators), indented as it is."""
        decorators: list[ast.expr] = getattr(node, "decorator_list", [])
        line = min([node.lineno, *(d.lineno for d in decorators)]) - 1
        return LineEdit(line, line, indent_block(text, self.indent_of(node)))

    def insert_after(self, node: ast.stmt, text: str) -> LineEdit:
        assert node.end_lineno is not None
        text = indent_block(text, self.indent_of(node))
        return LineEdit(node.end_lineno, node.end_lineno, text)

    def apply(self, edits: Iterable[LineEdit]) -> str:
        """The text with ``edits`` spliced in; overlapping edits are a bug."""
        lines = self.lines
        ordered = sorted(edits, key=lambda edit: (edit.start, edit.end))
        for before, after in itertools.pairwise(ordered):
            if after.start < before.end:
                raise ValueError(f"overlapping edits in {self.relpath}")
        for edit in reversed(ordered):
            lines[edit.start : edit.end] = [edit.text]
        return "".join(lines)


def is_call_of(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Call) and recognition.called_name(node) == name


def statement_calling(function: recognition.FunctionNode, name: str) -> ast.stmt | None:
    """The innermost statement of ``function`` whose own expression calls ``name``."""
    found: ast.stmt | None = None
    for statement in ast.walk(function):
        if (
            isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign)
            and any(is_call_of(node, name) for node in ast.walk(statement))
            and (found is None or statement.lineno >= found.lineno)
        ):
            found = statement
    return found


def indent_block(text: str, indent: str) -> str:
    return "".join(
        indent + line if line.strip() else line
        for line in text.splitlines(keepends=True)
    )
