"""Reading vLLM module source without importing it, as text and as parsed code.

Each read keeps the file's identity (its path and the SHA-256 of its bytes),
and yes/no questions about the code (``calls``, ``defines``) keep their
answers, so that a judgement can be kept with what it read
(:mod:`vllm_graphsafe.verdicts`).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllm_graphsafe import recognition


class SourceReader:
    """Reads vLLM module source without importing it, as text and as parsed code.

    With ``root`` it reads ``<root>/vllm/...py`` (a vLLM source tree) instead
    of the installed package, so a patch can judge an edited tree.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = None if root is None else Path(root)
        self._texts: dict[str, str | None] = {}
        self._identities: dict[str, tuple[str, str] | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        #: Yes/no answers about the code (``calls``, ``defines``), by question.
        self._answers: dict[str, bool] = {}
        self._recordings: list[Reading] = []

    def exists(self, module: str) -> bool:
        return self.text(module) is not None

    def text(self, module: str) -> str | None:
        for recording in self._recordings:
            recording.modules.add(module)
        if module not in self._texts:
            found = (
                _read_source(module)
                if self.root is None
                else _read_tree_source(self.root, module)
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
        """Collect every module read, and every yes/no answer given, in the block."""
        reading = Reading()
        self._recordings.append(reading)
        try:
            yield reading
        finally:
            self._recordings.remove(reading)

    def know(self, answers: Mapping[str, bool]) -> None:
        """Take ``answers`` given before on sources with these same bytes."""
        self._answers.update(answers)

    def _answer(self, module: str, question: str, work: Callable[[], bool]) -> bool:
        self.text(module)
        if question not in self._answers:
            self._answers[question] = work()
        for recording in self._recordings:
            recording.answers[question] = self._answers[question]
        return self._answers[question]

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            text = self.text(module)
            self._trees[module] = None if text is None else recognition.parse(text)
        return self._trees[module]

    def defines(self, module: str, qualname: str) -> bool:
        """Whether ``module`` defines ``qualname`` in code (a method, or a
        module-level def, class, import or assignment)."""
        return self._answer(
            module,
            question("defines", module, qualname),
            lambda: self._defines(module, qualname),
        )

    def _defines(self, module: str, qualname: str) -> bool:
        tree = self.tree(module)
        if tree is None:
            return False
        if "." in qualname:
            return recognition.find_function(tree, qualname) is not None
        return recognition.module_binds(tree, qualname)

    def function_node(
        self, module: str, qualname: str
    ) -> recognition.FunctionNode | None:
        tree = self.tree(module)
        return None if tree is None else recognition.find_function(tree, qualname)

    def function(self, module: str, qualname: str) -> str | None:
        """Source text of the ``def`` of ``qualname``, decorators excluded."""
        node = self.function_node(module, qualname)
        text = self.text(module)
        if node is None or text is None:
            return None
        lines = text.splitlines(keepends=True)
        return "".join(lines[node.lineno - 1 : node.end_lineno])

    def class_node(self, module: str, name: str) -> ast.ClassDef | None:
        tree = self.tree(module)
        return None if tree is None else recognition.find_class(tree, name)

    def calls(self, module: str, caller: str, callee: str) -> bool:
        """Whether ``caller`` (a qualname in ``module``) calls ``callee`` by name."""

        def work() -> bool:
            node = self.function_node(module, caller)
            return node is not None and recognition.calls_name(node, callee)

        return self._answer(module, question("calls", module, caller, callee), work)

    def module_calls(self, module: str, callee: str) -> bool:
        """Whether any code of ``module`` calls ``callee`` by name."""

        def work() -> bool:
            tree = self.tree(module)
            return tree is not None and recognition.calls_name(tree, callee)

        return self._answer(module, question("module_calls", module, callee), work)


@dataclass
class Reading:
    """What a judgement read: modules, and yes/no answers by question."""

    modules: set[str] = field(default_factory=set)
    answers: dict[str, bool] = field(default_factory=dict)


def question(kind: str, module: str, *names: str) -> str:
    """A yes/no question's key: its kind, the module it is about, then names."""
    return "|".join((kind, module, *names))


def question_module(key: str) -> str:
    return key.split("|")[1]


#: A module's source text and its identity: (file path, SHA-256 of its bytes).
_Source = tuple[str, tuple[str, str]]


def _decoded(path: str) -> _Source | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text, (path, hashlib.sha256(data).hexdigest())


def _read_tree_source(root: Path, module: str) -> _Source | None:
    base = root.joinpath(*module.split("."))
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        found = _decoded(str(file))
        if found is not None:
            return found
    return None


def _module_file(module: str) -> str | None:
    """The file of ``module``, found without importing its parent packages.

    ``importlib.util.find_spec`` imports every parent package of a dotted
    name: in a process that has only ``vllm`` itself that runs package
    ``__init__`` files which take seconds (``vllm.v1.worker.gpu.spec_decode``
    imports ``vllm.config``). The package directories are searched first.
    """
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
    for base in top_spec.submodule_search_locations or ():
        candidate = Path(base, *rest.split("."))
        for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if file.is_file():
                return str(file)
    try:  # an unusual layout (import hooks, zip files): ask the import system
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _read_source(module: str) -> _Source | None:
    path = _module_file(module)
    if path is None or not path.endswith(".py"):
        return None
    return _decoded(path)
