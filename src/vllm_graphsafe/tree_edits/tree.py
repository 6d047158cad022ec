"""A vLLM source tree being backported: the files on disk plus the edits so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vllm_graphsafe.tree_edits.source import MissingSymbolError, SourceFile


def read_exact(path: Path) -> str | None:
    """The file's text with its own line endings; None where it cannot be
    read as UTF-8."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def module_path(module: str) -> str:
    return "/".join(module.split(".")) + ".py"


@dataclass
class Tree:
    """``root`` holds the ``vllm/`` package; ``edited`` maps relpath -> new text."""

    root: Path
    edited: dict[str, str] = field(default_factory=dict)

    def source(self, module: str) -> SourceFile:
        relpath = module_path(module)
        text = self.current(relpath)
        if text is None:
            raise MissingSymbolError(f"module {module} ({relpath})")
        return SourceFile.parse(relpath, text)

    def exists(self, module: str) -> bool:
        relpath = module_path(module)
        return relpath in self.edited or (self.root / relpath).is_file()

    def current(self, relpath: str) -> str | None:
        if relpath in self.edited:
            return self.edited[relpath]
        return read_exact(self.root / relpath)

    def require(self, module: str) -> SourceFile:
        if not self.exists(module):
            raise MissingSymbolError(f"module {module}")
        return self.source(module)
