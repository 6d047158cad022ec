"""vLLM's code compiled out of its source files, never imported.

A source tree may be unbuilt and its package ``__init__`` files import half of
vLLM, so each function or class a judgement needs is compiled from its own
statements, and each name it uses is bound on first use the way its module
would bind it: a def or class of the module is compiled the same way, a
``vllm`` import is followed into the tree's source, the standard library,
numpy and torch are imported, a simple constant is evaluated, and anything
else (a logger, an environment table, a compiled kernel) is a
:class:`~.stand_in.StandIn`. A class as big as a model runner is never
compiled whole: each method is compiled when first looked up.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import collections
import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from vllm_graphsafe.behaviour.fakes import OVERRIDES
from vllm_graphsafe.behaviour.judgement import CannotRun
from vllm_graphsafe.behaviour.stand_in import StandIn
from vllm_graphsafe.sources import SourceReader

#: Third-party packages imported for real (vLLM's code computes with them).
REAL_PACKAGES = frozenset({"numpy", "torch"})
#: Decorators kept when compiling a def: they make what its callers use.
_KEPT_DECORATORS = frozenset(
    {
        "staticmethod",
        "classmethod",
        "property",
        "cached_property",
        "setter",
        "contextmanager",
    }
)
#: Decorators left out: they change how a def runs, not what it answers.
_DROPPED_DECORATORS = frozenset(
    {
        "inference_mode",
        "no_grad",
        "cache",
        "lru_cache",
        "wraps",
        "override",
        "deprecated",
        "final",
        "abstractmethod",
        "compile",
        "instrument",
        "nvtx_range",
    }
)
#: Decorators kept on a class: the ones that make its fields.
_KEPT_CLASS_DECORATORS = frozenset({"dataclass"})
_FLAGS = __future__.annotations.compiler_flag
#: Calls a module-level constant may make and still be evaluated.
_CONSTANT_CALLS = frozenset({"frozenset", "set", "tuple", "dict", "list", "int"})


class CompileError(RuntimeError):
    """Code the judgement needs could not be compiled out of the source."""


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name):
        return target.id
    return ""


def _runs_as_written(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the def, compiled with only its kept decorators, is called the
    way vLLM calls it (a ``triton.jit`` kernel, say, is not: it is indexed by
    its launch grid)."""
    return all(
        _decorator_name(d) in _KEPT_DECORATORS | _DROPPED_DECORATORS
        for d in node.decorator_list
    )


class _Namespace(dict[str, Any]):
    """A compiled module's globals: each name bound on first use."""

    def __init__(self, code: SourceCode, module: str) -> None:
        # ``__name__`` names this module, which the interpreter has: the
        # dataclasses of compiled code look their module up in sys.modules,
        # and the tree's own modules are never imported there.
        super().__init__(__name__=__name__, __builtins__=builtins)
        self._code = code
        self._module = module

    def __missing__(self, name: str) -> Any:
        value = self._code.bind(self._module, name)
        self[name] = value
        return value


class TreeModule:
    """A module of the tree, as seen through ``import``: its names on use."""

    def __init__(self, code: SourceCode, module: str) -> None:
        self._code = code
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        try:
            return self._code.namespace(self._module)[name]
        except NameError:
            if self._code.sources.top_level_binding(self._module, "__getattr__"):
                # The module makes its attributes when asked (vllm.envs does).
                return StandIn(f"{self._module}.{name}")
            raise AttributeError(
                f"module {self._module!r} has no attribute {name!r}"
            ) from None

    def __repr__(self) -> str:
        return f"<tree module {self._module}>"


class SourceCode:
    """One vLLM source tree's code, compiled on demand; ``overrides`` replace
    a name wherever a module binds it (a fake collective, say)."""

    def __init__(
        self,
        sources: SourceReader,
        overrides: Mapping[str, Any] | None = None,
        package: str = "vllm",
    ) -> None:
        self.sources = sources
        self.overrides = dict(overrides or {})
        self.package = package
        self._namespaces: dict[str, _Namespace] = {}
        self._lazy_classes: dict[tuple[str, str], type] = {}
        self._chains: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._methods: dict[tuple[str, str, str], Any] = {}

    def namespace(self, module: str) -> dict[str, Any]:
        if module not in self._namespaces:
            self._namespaces[module] = _Namespace(self, module)
        return self._namespaces[module]

    def in_tree(self, module: str) -> bool:
        return module == self.package or module.startswith(self.package + ".")

    def module(self, module: str) -> Any:
        """``module`` as an ``import`` binds it."""
        if self.in_tree(module):
            return TreeModule(self, module)
        top = module.partition(".")[0]
        if top in sys.stdlib_module_names or top in REAL_PACKAGES:
            # An absent or broken package is not this judgement's.
            with contextlib.suppress(Exception):
                return importlib.import_module(module)
        return StandIn(module)

    def bind(self, module: str, name: str) -> Any:
        """What ``name`` is in ``module`` when it runs (see the module docstring)."""
        if name in self.overrides:
            return self.overrides[name]
        if name == "__file__":
            identity = self.sources.identity(module)
            return identity[0] if identity else StandIn("__file__")
        site = self.sources.top_level_binding(module, name)
        if site is None:
            if hasattr(builtins, name):
                return getattr(builtins, name)
            if self.in_tree(module) and self.sources.exists(f"{module}.{name}"):
                return TreeModule(self, f"{module}.{name}")
            if "import *" in (self.sources.text(module) or ""):
                return StandIn(f"{module}.{name}")  # a star import may bind it
            # What vLLM would raise running this code.
            raise NameError(f"name {name!r} is not defined in {module}")
        try:
            return self._bound_by(module, name, site)
        except CompileError:
            return StandIn(f"{module}.{name}")

    def _bound_by(self, module: str, name: str, statement: ast.stmt) -> Any:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            if _runs_as_written(statement):
                return self._compile(module, statement, None, _KEPT_DECORATORS)[name]
        elif isinstance(statement, ast.ClassDef):
            return self._compile(module, statement, None, _KEPT_CLASS_DECORATORS)[name]
        elif isinstance(statement, ast.ImportFrom):
            return self._imported_from(module, statement, name)
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname == name:
                    return self.module(alias.name)
                if alias.asname is None and alias.name.partition(".")[0] == name:
                    return self.module(name)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            value = statement.value
            if value is not None and _is_constant_expression(value):
                return self._evaluate(module, value)
        return StandIn(f"{module}.{name}")

    def _imported_from(self, module: str, statement: ast.ImportFrom, name: str) -> Any:
        source = self._absolute(module, statement)
        for alias in statement.names:
            if (alias.asname or alias.name) != name:
                continue
            full = f"{source}.{alias.name}"
            if not self.in_tree(source):
                real = self.module(source)
                if isinstance(real, ModuleType):
                    return getattr(real, alias.name, StandIn(full))
            elif self.sources.top_level_binding(source, alias.name) is not None:
                return self.namespace(source)[alias.name]
            elif self.sources.exists(full):
                return TreeModule(self, full)
            return StandIn(full)
        return StandIn(f"{module}.{name}")

    def _absolute(self, module: str, statement: ast.ImportFrom) -> str:
        """The module ``from ... import`` names, relative imports resolved."""
        if not statement.level:
            return statement.module or ""
        identity = self.sources.identity(module)
        is_package = identity is not None and identity[0].endswith("__init__.py")
        parts = module.split(".")
        keep = len(parts) - statement.level + is_package
        base = ".".join(parts[: max(keep, 0)])
        if statement.module:
            return f"{base}.{statement.module}" if base else statement.module
        return base

    def _evaluate(self, module: str, node: ast.expr) -> Any:
        expression = ast.Expression(node)
        ast.fix_missing_locations(expression)
        try:
            code = compile(expression, f"<{module}>", "eval", _FLAGS, True)
            return eval(code, self.namespace(module))
        except Exception as error:
            raise CompileError(str(error)) from error

    def _compile(
        self,
        module: str,
        statement: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        owner: str | None,
        kept: frozenset[str],
    ) -> dict[str, Any]:
        """Run ``statement`` (inside a class named ``owner``, so that private
        names mangle as they do in vLLM) in ``module``'s namespace, compiled
        from its own lines at their lines of the file (a long method compiles
        several times faster from text than from its parse)."""
        lines = self.sources.lines(module)
        assert lines is not None  # the statement was parsed from them
        indent = statement.col_offset
        decorators = [
            f"{' ' * indent}@{ast.unparse(d)}\n"
            for d in statement.decorator_list
            if _decorator_name(d) in kept
        ]
        if owner is not None:
            header = f"class {owner}:\n"
        else:  # a module-level statement inside an ``if``, ``try`` or ``with``
            header = "if True:\n" if indent else ""
        padding = "\n" * (statement.lineno - 1 - len(decorators) - bool(header))
        body = lines[statement.lineno - 1 : statement.end_lineno]
        source = "".join([padding, header, *decorators, *body])
        identity = self.sources.identity(module)
        filename = identity[0] if identity else f"<{module}>"
        namespace = self.namespace(module)
        # Where the statement binds its name; module-level code in it (a
        # default value, a decorator) finds the module's other names through
        # it (the interpreter asks such code's globals without ``__missing__``).
        local = collections.ChainMap[str, Any]({}, namespace)
        try:
            code = compile(source, filename, "exec", _FLAGS, True)
            exec(code, namespace, local)
        except Exception as error:
            raise CompileError(
                f"{module}.{getattr(statement, 'name', '?')}: {error}"
            ) from error
        if owner is not None:
            return dict(vars(local[owner]))
        return dict(local.maps[0])

    def name_or_none(self, module: str, name: str) -> Any:
        try:
            return self.namespace(module)[name]
        except NameError:
            return None

    def method(self, module: str, owner: str, name: str) -> Any:
        """The class attribute ``owner.name`` made by its ``def``; None where
        neither the class nor its bases (in the tree) define it."""
        key = (module, owner, name)
        if key not in self._methods:
            self._methods[key] = self._method(module, owner, name)
        return self._methods[key]

    def defining_class(
        self, module: str, owner: str, name: str
    ) -> tuple[str, str] | None:
        for location in self._lookup_order(module, owner):
            if self.sources.defines(location[0], f"{location[1]}.{name}"):
                return location
        return None

    def _lookup_order(self, module: str, owner: str) -> Iterator[tuple[str, str]]:
        """The class, then (only if asked for) each base the tree defines, in
        the order Python looks methods up (depth first, each class once): most
        methods are the class's own, and its bases' modules are then never read."""
        yield module, owner
        key = (module, owner)
        if key not in self._chains:
            chain: list[tuple[str, str]] = []
            self._walk_bases(module, owner, chain, 0)
            self._chains[key] = chain
        yield from self._chains[key][1:]

    def _method(self, module: str, owner: str, name: str) -> Any:
        for where, cls in self._lookup_order(module, owner):
            # A private name (``self.__x`` in class C) is looked up mangled.
            prefix = f"_{cls.lstrip('_')}"
            written = name[len(prefix) :] if name.startswith(f"{prefix}__") else name
            node = self.sources.function_node(where, f"{cls}.{written}")
            if node is not None:
                if not _runs_as_written(node):
                    return StandIn(f"{cls}.{name}")
                return self._compile(where, node, cls, _KEPT_DECORATORS)[name]
        return None

    def _walk_bases(
        self, module: str, name: str, chain: list[tuple[str, str]], depth: int
    ) -> None:
        if (module, name) in chain or depth > 16:
            return
        header = self.sources.class_node(module, name)
        if header is None:
            return
        chain.append((module, name))
        for base in header.bases:
            located = self.locate(module, base)
            if located is not None:
                self._walk_bases(*located, chain, depth + 1)

    def locate(self, module: str, reference: ast.expr) -> tuple[str, str] | None:
        """The tree module and class a base class expression names."""
        if isinstance(reference, ast.Name):
            return self._locate_name(module, reference.id, 0)
        if isinstance(reference, ast.Attribute) and isinstance(
            reference.value, ast.Name
        ):
            target = self.sources.top_level_binding(module, reference.value.id)
            if isinstance(target, ast.Import):
                for alias in target.names:
                    if (alias.asname or alias.name) == reference.value.id:
                        return self._locate_name(alias.name, reference.attr, 0)
        return None

    def _locate_name(
        self, module: str, name: str, depth: int
    ) -> tuple[str, str] | None:
        if depth > 8 or not self.in_tree(module):
            return None
        statement = self.sources.top_level_binding(module, name)
        if isinstance(statement, ast.ClassDef):
            return module, name
        if isinstance(statement, ast.ImportFrom):
            source = self._absolute(module, statement)
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    return self._locate_name(source, alias.name, depth + 1)
        return None

    def lazy_class(self, module: str, name: str) -> type:
        """A class standing for ``module.name``: each method compiled when
        first looked up, any other attribute a stand-in unless set."""
        key = (module, name)
        if key in self._lazy_classes:
            return self._lazy_classes[key]
        if not self.sources.has_class(module, name):
            raise CompileError(f"{module} defines no class {name}")
        missing: set[str] = set()

        def __getattr__(instance: Any, attribute: str) -> Any:
            if attribute.startswith("__") and attribute.endswith("__"):
                raise AttributeError(attribute)
            if attribute not in missing:
                compiled = self.method(module, name, attribute)
                if compiled is not None:
                    setattr(cls, attribute, compiled)
                    return getattr(instance, attribute)
                missing.add(attribute)
            return StandIn(f"{name}.{attribute}")

        cls = type(name, (), {"__getattr__": __getattr__, "__module__": module})
        self._lazy_classes[key] = cls
        return cls

    def instance(self, module: str, name: str, state: Mapping[str, Any]) -> Any:
        obj: Any = object.__new__(self.lazy_class(module, name))
        obj.__dict__.update(state)
        return obj


def _is_constant_expression(node: ast.expr) -> bool:
    """Literals, names and attributes, containers and arithmetic of them, and
    calls of a few builtins: a module-level constant worth evaluating."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            if not (
                isinstance(child.func, ast.Name) and child.func.id in _CONSTANT_CALLS
            ):
                return False
        elif isinstance(child, ast.Lambda | ast.NamedExpr | ast.Await | ast.Yield):
            return False
    return True


def shared_code(sources: SourceReader) -> SourceCode:
    """Compiled once for every fix: they read many of the same functions."""
    code = sources.compiled
    if not isinstance(code, SourceCode):
        code = sources.compiled = SourceCode(sources, overrides=OVERRIDES)
    return code


def compiled_runner(
    sources: SourceReader, module: str, owner: str
) -> tuple[Callable[[Mapping[str, Any]], Any], Any, Any]:
    """How a fix's cases make an ``owner`` of ``module`` (holding the state
    given), and the ``CUDAGraphMode`` and ``BatchDescriptor`` it binds."""
    code = shared_code(sources)
    return (
        lambda state: code.instance(module, owner, state),
        code.name_or_none(module, "CUDAGraphMode"),
        code.name_or_none(module, "BatchDescriptor"),
    )


def keyword_arguments(
    function: Any, supplied: Mapping[str, Any], unsupplied: Callable[[str], Any]
) -> dict[str, Any]:
    """``function``'s arguments by name: the ``supplied`` ones, and
    ``unsupplied(name)`` for any other without a default."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError) as error:
        raise CannotRun(f"its signature cannot be read ({error})") from error
    arguments: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in supplied:
            arguments[parameter.name] = supplied[parameter.name]
        elif parameter.default is parameter.empty:
            arguments[parameter.name] = unsupplied(parameter.name)
    return arguments
