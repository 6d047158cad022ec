"""vLLM's module paths are spelled in one place, ``vllm_layout.py``.

A new vLLM layout is then one edit there: this test reads every Python file of
the project (no vLLM needed) and names the file and line of each module path
spelled elsewhere, as a string or as an import of a ``vllm.`` module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("src", "bench", "scripts", "tests")
LAYOUT = "src/vllm_graphsafe/vllm_layout.py"

#: A dotted name under ``vllm.``: how a module path (or an attribute in one) reads.
MODULE_PATH = re.compile(r"vllm(\.[A-Za-z_][A-Za-z0-9_]*)+")

#: Strings that look like a module path and are not one: the plugin's logger.
NOT_MODULE_PATHS = re.compile(r"vllm\.graphsafe(\.[A-Za-z_][A-Za-z0-9_]*)*")

#: Files whose vLLM paths are data, not references to vLLM's code.
DATA_FILES = {
    # Synthetic vLLM source trees, written as text for the registry to read.
    "tests/unit/registry/test_recognition.py": "builds synthetic vLLM source trees",
    "tests/unit/registry/test_registry.py": "builds synthetic vLLM source trees",
    # Source text with made-up ``vllm.`` imports for the import rewriter.
    "tests/unit/backport/test_backport_source.py": "rewrites made-up vLLM imports",
    # The guard that no vLLM module was imported compares names with "vllm.".
    "tests/unit/registry/test_package_without_vllm.py": "matches any vLLM module name",
    "tests/unit/test_vllm_paths_in_one_place.py": "this check",
    # The GPU kit carries one pinned release (vLLM 0.24.0): its modules, as data.
    "scripts/gpu_kit/cpu_check.py": "names the modules of the kit's one vLLM",
    # The tests the backport writes into a vLLM tree import that tree's modules.
    **{
        path.relative_to(REPO).as_posix(): "a test the backport writes into a tree"
        for path in REPO.glob("src/vllm_graphsafe/fixes/*/written/*.py")
    },
}


def python_files(root: Path = REPO) -> Iterator[Path]:
    for top in SCANNED:
        yield from sorted((root / top).rglob("*.py"))


def spelled_paths(path: Path, root: Path = REPO) -> Iterator[str]:
    """``file:line: what`` for each vLLM module path the file spells."""
    relative = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vllm."):
                    yield f"{relative}:{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.startswith("vllm."):
                yield f"{relative}:{node.lineno}: from {module} import ..."
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if MODULE_PATH.fullmatch(text) and not NOT_MODULE_PATHS.fullmatch(text):
                yield f"{relative}:{node.lineno}: {text!r}"


def misplaced_paths(
    root: Path = REPO, skipped: frozenset[str] = frozenset()
) -> list[str]:
    found: list[str] = []
    for path in python_files(root):
        relative = path.relative_to(root).as_posix()
        if relative == LAYOUT or relative in DATA_FILES or relative in skipped:
            continue
        found.extend(spelled_paths(path, root))
    return found


def test_no_vllm_module_path_is_spelled_outside_the_layout_module() -> None:
    found = misplaced_paths()
    assert not found, (
        "vLLM module paths belong in src/vllm_graphsafe/vllm_layout.py (import the "
        "constant, or vllm_layout.load(...) it):\n" + "\n".join(found)
    )


def test_the_check_sees_imports_and_strings(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "sample.py").write_text(
        "import vllm\n"
        "from vllm import LLM\n"
        "from vllm.config import CUDAGraphMode\n"
        "import vllm.v1.utils as utils\n"
        'RUNNER = "vllm.v1.worker.gpu_model_runner"\n'
        'LOGGER = "vllm.graphsafe"\n'
        'TEXT = "from vllm.config import X"\n',
        encoding="utf-8",
    )
    assert misplaced_paths(tmp_path) == [
        "src/sample.py:3: from vllm.config import ...",
        "src/sample.py:4: import vllm.v1.utils",
        "src/sample.py:5: 'vllm.v1.worker.gpu_model_runner'",
    ]


def test_every_allowed_data_file_exists() -> None:
    assert [name for name in DATA_FILES if not (REPO / name).exists()] == []
