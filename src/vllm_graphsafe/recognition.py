"""Reading vLLM's code by its parsed form, never by substrings, so that a name
in a comment, a string or a log message means nothing."""

from __future__ import annotations

import ast
import collections
import contextlib
import gc
from collections.abc import Iterable, Iterator

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef

#: Each text's parse, while :func:`parses_kept` holds; None outside it.
_kept_parses: dict[str, ast.Module | None] | None = None


@contextlib.contextmanager
def parses_kept() -> Iterator[None]:
    """Within the block, a text is parsed once however often it is read: for
    the backport, which judges a tree as it is, as edited and with our edit
    taken out; never around the plugin, where the parses would stay in vLLM's
    memory."""
    global _kept_parses
    outer = _kept_parses
    _kept_parses = {} if outer is None else outer
    try:
        yield
    finally:
        _kept_parses = outer


def parse(text: str) -> ast.Module | None:
    kept = _kept_parses
    if kept is not None and text in kept:
        return kept[text]
    # The tree's nodes are fresh objects that hold no cycle: with the collector
    # on, parsing the model runner in a process that holds vLLM and torch can
    # trigger full collections over every object there (up to a second).
    collecting = gc.isenabled()
    gc.disable()
    try:
        tree: ast.Module | None = ast.parse(text)
    except (SyntaxError, ValueError):
        tree = None
    finally:
        if collecting:
            gc.enable()
    if kept is not None:
        kept[text] = tree
    return tree


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """:func:`ast.walk`, in its order (breadth first, fields in order), without
    its per-node generators: judging a fix walks every node of the functions
    it reads."""
    todo = collections.deque([node])
    take, add = todo.popleft, todo.append
    while todo:
        node = take()
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                add(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        add(item)
        yield node


def find_class(tree: ast.Module | ast.ClassDef, name: str) -> ast.ClassDef | None:
    """The first ``class`` named ``name`` in ``tree``'s body."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def find_function(tree: ast.Module, qualname: str) -> FunctionNode | None:
    """The ``def`` of ``qualname`` (``Class.method`` or a module-level name)."""
    *owners, leaf = qualname.split(".")
    scope: ast.Module | ast.ClassDef | None = tree
    for owner in owners:
        scope = None if scope is None else find_class(scope, owner)
    if scope is None:
        return None
    for node in scope.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name == leaf
        ):
            return node
    return None


def module_binds(tree: ast.Module, name: str) -> bool:
    """Whether the module binds ``name`` at top level (def, class, import, assign)."""
    return any(name in _names_bound(node) for node in tree.body)


def first_bindings(body: Iterable[ast.stmt]) -> dict[str, ast.stmt]:
    """Each name ``body`` binds when it runs, with the first statement that
    binds it: a def, class, import or assignment, or one inside an ``if``,
    ``try`` or ``with`` there (an ``if TYPE_CHECKING:`` body binds nothing at
    run time)."""
    found: dict[str, ast.stmt] = {}
    for node in body:
        inner: list[ast.stmt] = []
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                inner += node.body
            inner += node.orelse
        elif isinstance(node, ast.Try):
            inner += node.body
            for handler in node.handlers:
                inner += handler.body
            inner += node.orelse + node.finalbody
        elif isinstance(node, ast.With):
            inner += node.body
        else:
            for name in _names_bound(node):
                found.setdefault(name, node)
        for name, statement in first_bindings(inner).items():
            found.setdefault(name, statement)
    return found


def _names_bound(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            yield alias.asname or alias.name.split(".")[0]
    else:
        if isinstance(node, ast.For | ast.AsyncFor):
            targets = list(_flatten([node.target]))
        else:
            targets = _assigned(node)
        yield from (target.id for target in targets if isinstance(target, ast.Name))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def parameter_names(function: FunctionNode) -> list[str]:
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def assigned_names(function: FunctionNode) -> set[str]:
    """The names a function binds: its parameters and what it assigns."""
    names = set(parameter_names(function))
    for node in walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def called_name(call: ast.Call) -> str | None:
    """``f`` for ``f(...)`` and ``x.y.f(...)``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def calls(function: ast.AST) -> Iterator[ast.Call]:
    return (node for node in walk(function) if isinstance(node, ast.Call))


def calls_name(function: ast.AST, name: str) -> bool:
    return any(called_name(call) == name for call in calls(function))


def self_methods_called(function: FunctionNode) -> list[str]:
    """Names of ``self.<method>(...)`` calls in ``function``, in order, once each."""
    names: list[str] = []
    for call in calls(function):
        target = call.func
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and target.attr not in names
        ):
            names.append(target.attr)
    return names


def referenced_names(node: ast.AST) -> set[str]:
    """Every ``Name`` id and ``Attribute`` attr inside ``node``."""
    names: set[str] = set()
    for child in walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
    return names


def class_sets_attribute(cls: ast.ClassDef, attribute: str) -> bool:
    """Whether instances of ``cls`` get ``attribute`` from its own code: a
    class-level field, a method or property, or ``self.<attribute> = ...``."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            continue
        if attribute in names:
            return True
    return any(
        isinstance(target, ast.Attribute)
        and target.attr == attribute
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
        for child in walk(cls)
        for target in _assigned(child)
    )


def _assigned(node: ast.AST) -> list[ast.expr]:
    """What ``node`` assigns to, tuples unpacked (nothing: no assignment)."""
    if isinstance(node, ast.Assign):
        return list(_flatten(node.targets))
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def _flatten(targets: Iterable[ast.expr]) -> Iterator[ast.expr]:
    for target in targets:
        if isinstance(target, ast.Tuple | ast.List):
            yield from _flatten(target.elts)
        else:
            yield target


def compares_names(function: ast.AST, left: set[str], right: set[str]) -> bool:
    """An ``ast.Compare`` with a name of ``left`` on one side, ``right`` on another."""
    for node in walk(function):
        if not isinstance(node, ast.Compare):
            continue
        operands = [referenced_names(o) for o in (node.left, *node.comparators)]
        for index, names in enumerate(operands):
            others = operands[:index] + operands[index + 1 :]
            if names & left and any(other & right for other in others):
                return True
    return False


def _chain_names(node: ast.expr) -> set[str]:
    """Names along ``a.b[i].c``."""
    names: set[str] = set()
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.add(node.id)
    return names


def stores_into_subscript_of(function: ast.AST, name: str) -> bool:
    """Assigns to ``...name...[i]`` or calls ``...name...[i].copy_(...)``."""
    for node in walk(function):
        targets = _assigned(node)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "copy_"
        ):
            targets = [node.func.value]
        for target in targets:
            if isinstance(target, ast.Subscript) and name in _chain_names(target.value):
                return True
    return False
