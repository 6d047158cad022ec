"""Model Runner V2's own eager path, taken where it replayed a FULL graph.

MRV2 replays in ``if batch_desc.cg_mode == CUDAGraphMode.FULL: ...
run_fullgraph(batch_desc)``, its eager path in the ``else``, which the guard,
inside ``run_fullgraph``, cannot return to: :func:`site_of` compiles that
``else`` from the caller's source as a function of its locals. Calls the FULL
branch made before the replay (``kv_connector.pre_forward``) are dropped from it.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import re
import textwrap
import types
from collections.abc import Callable, Mapping
from typing import Any

from vllm_graphsafe.recognition import called_name

REPLAY = "run_fullgraph"
MODE_ATTRIBUTE = "cg_mode"
FULL = "FULL"
#: The local holding the step's attention metadata, in a runner's step.
METADATA_LOCAL = "attn_metadata"
#: Locals holding attention metadata: ``attn_metadata``, ``draft_attn_metadata``,
#: ``prefill_attn_md``.
_METADATA_NAME = re.compile(r"(?:^|_)attn_(?:metadata|md)$")


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a FULL graph replays in an ``if`` whose ``else`` is vLLM's eager path."""

    function: str
    #: The local holding the batch descriptor the branch tests (``batch_desc``).
    descriptor: str
    #: The local the ``FULL`` branch assigns the replay's result to, if any.
    output: str | None
    #: The ``else`` statements as a function of the caller's locals (``inputs``),
    #: returning its locals after them.
    eager: Callable[..., dict[str, Any]]
    inputs: tuple[str, ...]
    #: The caller's local holding the attention metadata the ``else`` runs on.
    metadata: str = METADATA_LOCAL

    def run_eagerly(self, caller_locals: Mapping[str, Any], descriptor: Any) -> Any:
        """What the replay would have returned, from the ``else`` path."""
        arguments = {name: caller_locals[name] for name in self.inputs}
        arguments[self.descriptor] = descriptor
        after = self.eager(**arguments)
        return after.get(self.output) if self.output is not None else None


class NotASite(LookupError):
    pass


def site_of(code: types.CodeType, module_globals: dict[str, Any]) -> Site:
    try:
        source = inspect.getsource(code)
    except (OSError, TypeError) as error:
        raise NotASite(f"no source for {code.co_name}: {error}") from None
    tree = ast.parse(textwrap.dedent(source))
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        raise NotASite(f"{code.co_name} is not a function definition")
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    branch = replay_branch(function)
    if branch is None:
        raise NotASite(f"{code.co_name} replays no FULL graph in an if/else")
    descriptor, output = branch.descriptor, branch.output
    local_names = set(code.co_varnames) | set(code.co_cellvars)
    statements = _without_calls(branch.node.orelse, branch.calls_before_replay)
    inputs = sorted(
        (_names(statements, ast.Load) & local_names) - _names(statements, ast.Store)
        | {descriptor}
    )
    metadata = eager_metadata(statements, local_names)
    if metadata is None:
        raise NotASite(
            f"{code.co_name} hands its eager path no single attention metadata local"
        )
    return Site(
        function=code.co_name,
        descriptor=descriptor,
        output=output,
        eager=_compile(statements, inputs, code, module_globals),
        inputs=tuple(inputs),
        metadata=metadata,
    )


def eager_metadata(statements: list[ast.stmt], local_names: set[str]) -> str | None:
    """The one attention-metadata local the statements read (None: none or several)."""
    found = {
        name
        for name in _names(statements, ast.Load) & local_names
        if _METADATA_NAME.search(name)
    }
    return found.pop() if len(found) == 1 else None


@dataclasses.dataclass(frozen=True)
class Branch:
    node: ast.If
    descriptor: str
    output: str | None
    #: Names of the calls the FULL branch makes, as statements, before the replay.
    calls_before_replay: frozenset[str]


def replay_branch(function: ast.AST) -> Branch | None:
    """``if <desc>.cg_mode == <...>.FULL: ... <...>.run_fullgraph(<desc>)``
    with an ``else``."""
    for node in ast.walk(function):
        if not isinstance(node, ast.If) or not node.orelse:
            continue
        descriptor = _tested_descriptor(node.test)
        if descriptor is None:
            continue
        before: set[str] = set()
        for statement in node.body:
            found = _replay_of(statement, descriptor)
            if found is not None:
                return Branch(node, descriptor, found[1], frozenset(before))
            if isinstance(statement, ast.Expr) and isinstance(
                statement.value, ast.Call
            ):
                name = called_name(statement.value)
                if name is not None:
                    before.add(name)
    return None


def _tested_descriptor(test: ast.expr) -> str | None:
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq | ast.Is)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == MODE_ATTRIBUTE
        and isinstance(test.left.value, ast.Name)
        and isinstance(test.comparators[0], ast.Attribute)
        and test.comparators[0].attr == FULL
    ):
        return None
    return test.left.value.id


def _replay_of(
    statement: ast.stmt, descriptor: str
) -> tuple[ast.Call, str | None] | None:
    """``x = m.run_fullgraph(desc)`` or the bare call, with the name it assigns."""
    value: ast.expr | None = None
    output: str | None = None
    if isinstance(statement, ast.Expr):
        value = statement.value
    elif (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    ):
        value, output = statement.value, statement.targets[0].id
    if (
        isinstance(value, ast.Call)
        and called_name(value) == REPLAY
        and len(value.args) == 1
        and isinstance(value.args[0], ast.Name)
        and value.args[0].id == descriptor
    ):
        return value, output
    return None


class _DropCalls(ast.NodeTransformer):
    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        if isinstance(node.value, ast.Call) and called_name(node.value) in self.names:
            return ast.Pass(lineno=node.lineno, col_offset=node.col_offset)
        return node


def _without_calls(statements: list[ast.stmt], names: frozenset[str]) -> list[ast.stmt]:
    module = ast.Module(body=copy.deepcopy(statements), type_ignores=[])
    return list(_DropCalls(names).visit(module).body)


def _names(statements: list[ast.stmt], context: type[ast.expr_context]) -> set[str]:
    return {
        node.id
        for statement in statements
        for node in ast.walk(statement)
        if isinstance(node, ast.Name) and isinstance(node.ctx, context)
    }


def _compile(
    statements: list[ast.stmt],
    inputs: list[str],
    code: types.CodeType,
    module_globals: dict[str, Any],
) -> Callable[..., dict[str, Any]]:
    name = f"{code.co_name}_eager_branch"
    module = ast.parse(f"def {name}(*, {', '.join(inputs)}):\n    return locals()\n")
    function = module.body[0]
    assert isinstance(function, ast.FunctionDef)
    ast.increment_lineno(module, statements[0].lineno - 1)
    function.body[:0] = statements
    namespace: dict[str, Any] = {}
    exec(
        compile(ast.fix_missing_locations(module), code.co_filename, "exec"),
        module_globals,
        namespace,
    )
    compiled: Callable[..., dict[str, Any]] = namespace[name]
    return compiled
