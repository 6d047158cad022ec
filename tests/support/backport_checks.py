"""Helpers shared by ``scripts/verify_backport.py`` and the backport tests.

They copy a release's installed ``vllm`` package into a scratch tree (``.py``
files copied, everything else hard-linked when the file system allows, so a
copy costs seconds and the release itself is never edited), run ruff with
vLLM's rule set, and compare its findings.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.vllm_ruff import config_text


def copy_package(package: Path, tree_root: Path) -> Path:
    """Copy ``package`` (an installed ``vllm/``) to ``tree_root/vllm``; return it."""
    target = tree_root / "vllm"

    def copy(source: str, destination: str) -> object:
        if source.endswith(".py"):
            return shutil.copy2(source, destination)
        try:
            os.link(source, destination)
        except OSError:
            shutil.copy2(source, destination)
        return destination

    shutil.copytree(
        package,
        target,
        copy_function=copy,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return target


def ruff_findings(
    ruff: str, tree_root: Path, relpaths: list[str]
) -> collections.Counter[tuple[str, str]]:
    """(relpath, rule code) -> count, under vLLM's rules, for files that exist."""
    present = [path for path in relpaths if (tree_root / path).is_file()]
    if not present:
        return collections.Counter()
    config = tree_root.parent / f"{tree_root.name}-vllm-ruff.toml"
    config.write_text(config_text(tree_root.resolve()), encoding="utf-8")
    try:
        result = subprocess.run(
            [
                ruff,
                "check",
                "--config",
                str(config),
                "--no-cache",
                "--exit-zero",
                "--output-format",
                "json",
                *present,
            ],
            cwd=tree_root,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        config.unlink(missing_ok=True)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for finding in json.loads(result.stdout or "[]"):
        path = Path(finding["filename"]).resolve().relative_to(tree_root.resolve())
        counts[(path.as_posix(), str(finding["code"]))] += 1
    return counts


def new_findings(
    before: collections.Counter[tuple[str, str]],
    after: collections.Counter[tuple[str, str]],
) -> list[str]:
    """Findings the edit added (per file and rule), as ``path: CODE xN`` lines."""
    return [
        f"{path}: {code} x{count - before.get((path, code), 0)}"
        for (path, code), count in sorted(after.items())
        if count > before.get((path, code), 0)
    ]


def find_ruff(repo_root: Path) -> str | None:
    bundled = repo_root / ".venvs" / "tools" / "bin" / "ruff"
    if bundled.is_file():
        return str(bundled)
    return shutil.which("ruff")
