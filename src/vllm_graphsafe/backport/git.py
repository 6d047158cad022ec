"""git's three-way merge, to take our edit out of a file as ``git revert`` of our
write would, through whatever upstream merged since; None where git cannot."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

#: No prompt, no pager, no user or system configuration that changes a merge.
_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def _git(args: list[str], cwd: Path | None = None) -> bytes | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env={**os.environ, **_ENV},
            capture_output=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


class Repository:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs: dict[str, str | None] = {}

    @classmethod
    def of(cls, root: Path) -> Repository | None:
        """The repository holding ``root``; None where there is none (or no git)."""
        inside = _git(["rev-parse", "--is-inside-work-tree"], cwd=root)
        return cls(root) if inside is not None and inside.strip() == b"true" else None

    def blob(self, blob_id: str) -> str | None:
        if blob_id not in self._blobs:
            data = _git(["cat-file", "blob", blob_id], cwd=self.root)
            try:
                self._blobs[blob_id] = None if data is None else data.decode("utf-8")
            except UnicodeDecodeError:
                self._blobs[blob_id] = None
        return self._blobs[blob_id]


def merge_file(current: str, base: str, other: str) -> str | None:
    """``current`` with the change from ``base`` to ``other`` merged in."""
    with tempfile.TemporaryDirectory(prefix="graphsafe-merge-") as scratch:
        paths = []
        for name, text in (("current", current), ("base", base), ("other", other)):
            path = Path(scratch) / name
            path.write_bytes(text.encode("utf-8"))
            paths.append(str(path))
        merged = _git(["merge-file", "-p", "-q", *paths])
    return None if merged is None else merged.decode("utf-8")
