"""A file of a fix's ``written/`` folder written after others reads only their
names: its ``if TYPE_CHECKING:`` block imports from them alone, so mypy's check
of those imports (``implicit_reexport`` there) checks the file as written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FIXES = Path(__file__).resolve().parents[3] / "src" / "vllm_graphsafe" / "fixes"


@pytest.mark.parametrize(
    "path",
    sorted(FIXES.glob("*/written/*.py")),
    ids=lambda path: f"{path.parent.parent.name}/{path.name}",
)
def test_a_written_file_reads_only_the_files_of_its_folder(path: Path) -> None:
    folder = f"vllm_graphsafe.fixes.{path.parent.parent.name}.written"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            modules = [getattr(statement, "module", None) for statement in node.body]
            assert modules, path
            for module in modules:
                assert module is not None and module.startswith(f"{folder}.")
                assert module != f"{folder}.{path.stem}"
