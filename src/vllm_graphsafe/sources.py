"""Reading vLLM module source without importing it, as text and as parsed code.

Each module read is parsed whole, once (``ast.parse``: about 40 ms for the
V1 runner, the largest), and its identity kept (the file's path and the
SHA-256 of its bytes), so that a verdict can be kept with the files it read
(:mod:`vllm_graphsafe.verdicts`).
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_graphsafe import recognition
from vllm_graphsafe.source_files import read_source, read_tree_source


@dataclass
class Reading:
    modules: set[str] = field(default_factory=set)


class SourceReader:
    """Reads vLLM module source without importing it, as text and as parsed code.

    With ``root`` it reads ``<root>/vllm/...py`` (a vLLM source tree) instead
    of the installed package, so a fix can judge an edited tree.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = None if root is None else Path(root)
        self._texts: dict[str, str | None] = {}
        self._identities: dict[str, tuple[str, str] | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._lines: dict[str, list[str] | None] = {}
        self._bindings: dict[str, dict[str, ast.stmt]] = {}
        self._recordings: list[Reading] = []
        #: The code these sources hold, compiled for the fixes' judgements
        #: (``behaviour.compiled.shared_code``), kept with them.
        self.compiled: object | None = None

    def exists(self, module: str) -> bool:
        return self.text(module) is not None

    def text(self, module: str) -> str | None:
        for recording in self._recordings:
            recording.modules.add(module)
        if module not in self._texts:
            found = (
                read_source(module)
                if self.root is None
                else read_tree_source(self.root, module)
            )
            self._texts[module] = None if found is None else found[0]
            self._identities[module] = None if found is None else found[1]
        return self._texts[module]

    def identity(self, module: str) -> tuple[str, str] | None:
        """``(file path, SHA-256 of its bytes)`` of ``module``; None: no source."""
        self.text(module)
        return self._identities.get(module)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Reading]:
        """Collect every module read in the block."""
        reading = Reading()
        self._recordings.append(reading)
        try:
            yield reading
        finally:
            self._recordings.remove(reading)

    def lines(self, module: str) -> list[str] | None:
        """The module's lines, line ends kept; None where it has no source."""
        if module not in self._lines:
            text = self.text(module)
            self._lines[module] = None if text is None else text.splitlines(True)
        return self._lines[module]

    def forget(self) -> None:
        """Drop every parsed module (judging is done): the compiled code holds
        reference cycles that would keep them alive until the collector runs."""
        self._trees.clear()
        self._lines.clear()
        self._bindings.clear()
        self.compiled = None

    def tree(self, module: str) -> ast.Module | None:
        """The whole module, parsed; None where it has no source or none that parses."""
        text = self.text(module)  # recorded as read, parsed or not
        if module not in self._trees:
            self._trees[module] = None if text is None else recognition.parse(text)
        return self._trees[module]

    def defines(self, module: str, qualname: str) -> bool:
        """Whether ``module`` defines ``qualname`` in code (a method, or a
        module-level def, class, import or assignment)."""
        if "." in qualname:
            return self.function_node(module, qualname) is not None
        tree = self.tree(module)
        return tree is not None and recognition.module_binds(tree, qualname)

    def function_node(
        self, module: str, qualname: str
    ) -> recognition.FunctionNode | None:
        """The ``def`` of ``qualname`` (``Class.method`` or a module-level name)."""
        tree = self.tree(module)
        return None if tree is None else recognition.find_function(tree, qualname)

    def function(self, module: str, qualname: str) -> str | None:
        """Source text of the ``def`` of ``qualname``, decorators excluded."""
        node = self.function_node(module, qualname)
        lines = self.lines(module)
        if node is None or lines is None:
            return None
        return "".join(lines[node.lineno - 1 : node.end_lineno])

    def class_node(self, module: str, name: str) -> ast.ClassDef | None:
        """The module-level ``class`` named ``name`` (the first one)."""
        tree = self.tree(module)
        return None if tree is None else recognition.find_class(tree, name)

    def has_class(self, module: str, name: str) -> bool:
        return self.class_node(module, name) is not None

    def top_level_binding(self, module: str, name: str) -> ast.stmt | None:
        """The first statement that binds ``name`` when ``module`` runs: a def,
        class, import or assignment at module level, or inside a module-level
        ``if``, ``try`` or ``with`` (never under ``if TYPE_CHECKING:``)."""
        tree = self.tree(module)
        if module not in self._bindings:
            self._bindings[module] = (
                {} if tree is None else recognition.first_bindings(tree.body)
            )
        return self._bindings[module].get(name)

    def sets_attribute(self, module: str, owner: str, attribute: str) -> bool:
        """Whether instances of class ``owner`` get ``attribute`` from its own
        code (:func:`recognition.class_sets_attribute`); False without the class."""
        cls = self.class_node(module, owner)
        return cls is not None and recognition.class_sets_attribute(cls, attribute)

    def calls(self, module: str, caller: str, callee: str) -> bool:
        node = self.function_node(module, caller)
        return node is not None and recognition.calls_name(node, callee)

    def module_calls(self, module: str, callee: str) -> bool:
        tree = self.tree(module)
        return tree is not None and recognition.calls_name(tree, callee)
