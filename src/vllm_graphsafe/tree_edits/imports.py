"""Top-level ``from vllm... import ...`` statements, rewritten as ruff sorts them."""

from __future__ import annotations

import ast

from vllm_graphsafe.tree_edits.source import LineEdit, MissingSymbolError, SourceFile

LINE_LENGTH = 88


def _member_key(name: str) -> tuple[int, str]:
    # isort's order-by-type (ruff's default): CONSTANTS, Classes, then the rest.
    if name.isupper() and len(name) > 1:
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name.lower()


def render_import(module: str, names: list[str], expanded: bool = False) -> str:
    """``from module import names`` as ruff format writes it (no base indent):
    on one line where it fits, unless ``expanded`` (a statement written one
    name a line, which ruff keeps so for its trailing comma)."""
    members = sorted(set(names), key=_member_key)
    one_line = f"from {module} import {', '.join(members)}\n"
    if len(one_line) - 1 <= LINE_LENGTH and not expanded:
        return one_line
    body = "".join(f"    {member},\n" for member in members)
    return f"from {module} import (\n{body})\n"


def rewrite_import(
    source: SourceFile, module: str, remove: set[str], add: set[str]
) -> list[LineEdit]:
    """Edits that drop ``remove`` from and add ``add`` to ``from module import``;
    a new statement is placed where ruff's isort expects it."""
    imports = [
        node
        for node in source.tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
    ]
    existing = next((node for node in imports if node.module == module), None)
    if existing is None:
        if remove:
            name = sorted(remove)[0]
            raise MissingSymbolError(f"the import of {name} from {module}")
        return _insert_new(source, imports, module, sorted(add))
    if any(alias.asname for alias in existing.names):
        raise MissingSymbolError(f"a plain (unaliased) import from {module}")
    names = [alias.name for alias in existing.names]
    for name in remove:
        if name not in names:
            raise MissingSymbolError(f"the import of {name} from {module}")
    kept = [name for name in names if name not in remove] + sorted(add - set(names))
    assert existing.end_lineno is not None
    expanded = existing.end_lineno > existing.lineno
    text = render_import(module, kept, expanded) if kept else ""
    return [LineEdit(existing.lineno - 1, existing.end_lineno, text)]


def _insert_new(
    source: SourceFile, imports: list[ast.ImportFrom], module: str, names: list[str]
) -> list[LineEdit]:
    text = render_import(module, names)
    package = module.split(".")[0]
    section = [node for node in imports if (node.module or "").split(".")[0] == package]
    if not section:
        raise MissingSymbolError(f"an import section for {package} modules")
    for node in section:
        if (node.module or "").lower() > module.lower():
            return [LineEdit(node.lineno - 1, node.lineno - 1, text)]
    last = section[-1]
    assert last.end_lineno is not None
    return [LineEdit(last.end_lineno, last.end_lineno, text)]


def uses_name(source: SourceFile, name: str, outside: ast.AST) -> bool:
    """Whether ``name`` is read anywhere in the module outside node ``outside``."""
    skip = {id(node) for node in ast.walk(outside)}
    return any(
        isinstance(node, ast.Name) and node.id == name and id(node) not in skip
        for node in ast.walk(source.tree)
    )
