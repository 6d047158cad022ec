"""The package's modules import in one direction: facts -> judge -> verdict ->
hooks, the products on top (docs/architecture.md draws it).

Every import of a module of ``src/vllm_graphsafe`` counts, one inside a
function too (only ``if TYPE_CHECKING:`` blocks are left out): none may name a
module of a higher layer. Seen a folder at a time, the same holds: the
package's folders and top-level modules import each other without a loop, an
import for type checking included, so each can be read above what it uses.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "vllm_graphsafe"

#: Lowest first. A module is in the layer of its longest matching pattern.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "vllm_graphsafe",
            "vllm_layout",
            "settings",
            "releases",
            "private_files",
            "exit_statuses",
            "recognition",
            "forwarding",
            "hook_points",
        ),
    ),
    (
        "facts",
        (
            "fixes",
            "fix",
            "fixes.phase_events",
            "fixes.phase_rows",
            "fixes.scheduled_rows",
            "fixes.*.logic",
            "fixes.mrv2_phase_dispatch",
            "fixes.replay_guard",
            "fixes.v1_dummy_staging",
            "fixes.v1_phase_dispatch",
        ),
    ),
    (
        "judge",
        (
            "sources",
            "behaviour*",
            "judging",
            "fixes.*.judge",
            "fixes.*.behaviour",
            "fixes.v1_phase_dispatch.drafting",
            "fixes.replay_guard.eager_branch",
        ),
    ),
    ("verdict", ("verdicts",)),
    (
        "hooks",
        (
            "counts*",
            "metrics",
            "fixes.*.hooks",
            "fixes.v1_phase_dispatch.early",
            "fixes.replay_guard.mrv2",
            "fixes.replay_guard.common",
            "registry",
        ),
    ),
    (
        "products",
        (
            "plugin",
            "emulator_plugin",
            "catalogue",
            "cli*",
            "backport*",
            "tree_edits*",
            "fixes.*.backport",
            "fixes.*.written.*",
            "probe*",
            "emulator*",
            "local_engine*",
        ),
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    local = module.removeprefix("vllm_graphsafe.")
    best: tuple[int, int] | None = None
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if fnmatch.fnmatchcase(local, pattern) and (
                best is None or len(pattern) > best[1]
            ):
                best = (index, len(pattern))
    assert best is not None, f"{module} is in no layer of this test"
    return best[0]


def imported(tree: ast.Module, module: str, *, type_checking: bool = False) -> set[str]:
    """The package's modules ``tree`` imports (its own package resolved);
    those under ``if TYPE_CHECKING:`` only with ``type_checking``."""
    found: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if type_checking:
            break
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("vllm_graphsafe")}


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_is_in_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_module_imports_one_of_a_higher_layer() -> None:
    known = modules()
    upward = []
    for module, path in known.items():
        own = layer_of(module)
        for target in imported(ast.parse(path.read_text()), module):
            if target not in known:
                continue  # a name imported from a module, seen as its module
            if layer_of(target) > own:
                upward.append(
                    f"{module} ({LAYERS[own][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    assert upward == []


def folder_of(module: str) -> str:
    """The folder or top-level module of the package that holds ``module``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_folders_import_each_other_without_a_loop() -> None:
    arrows: dict[str, set[str]] = {}
    for module, path in modules().items():
        tree = ast.parse(path.read_text())
        source = folder_of(module)
        for target in imported(tree, module, type_checking=True):
            if folder_of(target) not in (source, "vllm_graphsafe"):
                arrows.setdefault(source, set()).add(folder_of(target))
    loops = []
    for source, targets in sorted(arrows.items()):
        for target in sorted(targets):
            if source in reachable(arrows, target):
                loops.append(f"{source} -> {target} -> ... -> {source}")
    assert loops == []


def reachable(arrows: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in arrows.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen
