"""A vLLM source tree being backported: the files on disk plus the edits so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vllm_graphsafe.tree_edits.source import MissingSymbolError, SourceFile


@dataclass
class Tree:
    """``root`` holds the ``vllm/`` package; ``edited`` maps relpath -> new text."""

    root: Path
    edited: dict[str, str] = field(default_factory=dict)

    def source(self, module: str) -> SourceFile:
        relpath = "/".join(module.split(".")) + ".py"
        if relpath in self.edited:
            return SourceFile.parse(relpath, self.edited[relpath])
        return SourceFile.read(self.root, module)

    def exists(self, module: str) -> bool:
        relpath = "/".join(module.split(".")) + ".py"
        return relpath in self.edited or (self.root / relpath).is_file()

    def original(self, relpath: str) -> str | None:
        try:
            # newline="": the file's own line endings, byte for byte.
            with open(self.root / relpath, encoding="utf-8", newline="") as handle:
                return handle.read()
        except (OSError, UnicodeDecodeError):
            return None

    def current(self, relpath: str) -> str | None:
        if relpath in self.edited:
            return self.edited[relpath]
        return self.original(relpath)

    def require(self, module: str) -> SourceFile:
        if not self.exists(module):
            raise MissingSymbolError(f"module {module}")
        return self.source(module)
