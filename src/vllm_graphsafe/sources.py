"""Reading vLLM module source without importing it, as text and as parsed code.

Each module read is parsed whole, once (``ast.parse``: about 40 ms for the
V1 runner, the largest), and its identity kept (the file's path and the
SHA-256 of its bytes), so that a verdict can be kept with the files it read.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

from vllm_graphsafe import recognition

#: A module's source text and its identity: (file path, SHA-256 of its bytes).
Source = tuple[str, tuple[str, str]]


def _decoded(path: str) -> Source | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text, (path, hashlib.sha256(data).hexdigest())


def _module_file(module: str) -> str | None:
    """The file of ``module``, found without importing its parent packages:
    ``importlib.util.find_spec`` would run their ``__init__`` files, which
    take seconds (``vllm.v1.worker.gpu.spec_decode`` imports ``vllm.config``)."""
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    if path is not None:
        return str(path)
    top, _, rest = module.partition(".")
    try:
        top_spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if top_spec is None:
        return None
    if not rest:
        return top_spec.origin
    searched = False
    for base in top_spec.submodule_search_locations or ():
        candidate = Path(base, *rest.split("."))
        for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if file.is_file():
                return str(file)
        searched = searched or Path(base, "__init__.py").is_file()
    if searched:
        # A plain package directory without the file: the module is absent
        # (asking the import system would import its parent packages).
        return None
    try:  # an unusual layout (import hooks, zip files): ask the import system
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


class SourceReader:
    """Reads ``<root>/vllm/...py`` (a vLLM source tree, so a fix can judge an
    edited tree), or without ``root`` the installed package."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = None if root is None else Path(root)
        self._sources: dict[str, Source | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._lines: dict[str, list[str] | None] = {}
        self._bindings: dict[str, dict[str, ast.stmt]] = {}
        self._recordings: list[set[str]] = []
        #: These sources' code, compiled (``behaviour.compiled.shared_code``).
        self.compiled: object | None = None

    def exists(self, module: str) -> bool:
        return self.text(module) is not None

    def _source(self, module: str) -> Source | None:
        for recording in self._recordings:
            recording.add(module)
        if module not in self._sources:
            if self.root is None:
                path = _module_file(module)
                found = _decoded(path) if path and path.endswith(".py") else None
            else:
                base = self.root.joinpath(*module.split("."))
                found = _decoded(str(base.with_suffix(".py"))) or _decoded(
                    str(base / "__init__.py")
                )
            self._sources[module] = found
        return self._sources[module]

    def text(self, module: str) -> str | None:
        found = self._source(module)
        return None if found is None else found[0]

    def identity(self, module: str) -> tuple[str, str] | None:
        """``(file path, SHA-256 of its bytes)`` of ``module``; None: no source."""
        found = self._source(module)
        return None if found is None else found[1]

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[str]]:
        """Collect the name of every module read in the block."""
        modules: set[str] = set()
        self._recordings.append(modules)
        try:
            yield modules
        finally:
            self._recordings.remove(modules)

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
        """Whether ``module`` defines ``qualname`` (a method, or a module-level
        def, class, import or assignment)."""
        if "." in qualname:
            return self.function_node(module, qualname) is not None
        tree = self.tree(module)
        return tree is not None and recognition.module_binds(tree, qualname)

    def function_node(
        self, module: str, qualname: str
    ) -> recognition.FunctionNode | None:
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
        tree = self.tree(module)
        return None if tree is None else recognition.find_class(tree, name)

    def has_class(self, module: str, name: str) -> bool:
        return self.class_node(module, name) is not None

    def top_level_binding(self, module: str, name: str) -> ast.stmt | None:
        """The first statement that binds ``name`` when ``module`` runs."""
        tree = self.tree(module)
        if module not in self._bindings:
            self._bindings[module] = (
                {} if tree is None else recognition.first_bindings(tree.body)
            )
        return self._bindings[module].get(name)

    def sets_attribute(self, module: str, owner: str, attribute: str) -> bool:
        cls = self.class_node(module, owner)
        return cls is not None and recognition.class_sets_attribute(cls, attribute)

    def calls(self, module: str, caller: str, callee: str) -> bool:
        node = self.function_node(module, caller)
        return node is not None and recognition.calls_name(node, callee)

    def module_calls(self, module: str, callee: str) -> bool:
        tree = self.tree(module)
        return tree is not None and recognition.calls_name(tree, callee)
