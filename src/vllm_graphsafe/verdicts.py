"""This user's kept verdicts.

Judging parses the modules a fix reads (a hundred milliseconds or so for all
fixes), and every vLLM process would judge again at start-up: a verdict is
kept with the identity (path, SHA-256) of every module file it read, a missing
one recorded as missing, and of this package's own code, and used only while
all of them still match (an in-place vLLM upgrade or a module that moves on
``sys.path`` gives a fresh judgement).

Entries live in ``GRAPHSAFE_CACHE_DIR``, else ``$XDG_CACHE_HOME/vllm-graphsafe``,
else ``~/.cache/vllm-graphsafe`` (``off`` keeps none), in a private directory
(:mod:`vllm_graphsafe.private_files`). An entry that is damaged, not ours, or
a link is judged again and replaced, never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeGuard

import vllm_graphsafe
from vllm_graphsafe.judging import Verdict
from vllm_graphsafe.private_files import (
    is_private_directory,
    make_private_directory,
    write_private_file,
)
from vllm_graphsafe.sources import SourceReader

CACHE_OFF = frozenset({"off", "none", "0"})
#: Largest entry read back; a real one is well under 8 kB.
_MAX_ENTRY_BYTES = 1 << 16
_FORMAT = 3
_PACKAGE = Path(vllm_graphsafe.__file__).parent
#: ``module -> (file path, SHA-256 hex)``, or None where the module has no source.
FileIdentities = Mapping[str, tuple[str, str] | None]
#: Where a verdict came from: this user's kept verdicts, or vLLM's source read now.
Origin = Literal["kept", "judged"]


def cache_directory(
    chosen: str | None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """Where verdicts live: ``chosen`` (``GRAPHSAFE_CACHE_DIR``), else under
    the user's cache directory; None where ``chosen`` turns it off."""
    env = os.environ if environ is None else environ
    chosen = (chosen or "").strip()
    if chosen.lower() in CACHE_OFF:
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = (env.get("XDG_CACHE_HOME") or "").strip()
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "vllm-graphsafe"


def rules_identity() -> str:
    """This package's version and each of its files' name, size and mtime."""
    parts = [vllm_graphsafe.__version__]
    for file in sorted(_PACKAGE.rglob("*.py")):
        with contextlib.suppress(OSError):
            info = file.stat()
            parts.append(
                f"{file.relative_to(_PACKAGE)}:{info.st_size}:{info.st_mtime_ns}"
            )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _checksum(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class VerdictCache:
    def __init__(self, directory: Path, scope: str) -> None:
        self.directory = directory
        #: Names the installation (vLLM's package directory), so venvs do not mix.
        self._scope = hashlib.sha256(scope.encode()).hexdigest()[:16]
        self._rules = rules_identity()

    def _name(self, fix_id: str) -> str:
        return f"verdict-{fix_id}-{self._scope}.json"

    def load(self, fix_id: str, sources: SourceReader) -> Verdict | None:
        """The stored verdict, where every module file it was judged on is as
        ``sources`` finds it now and the entry is sound."""
        raw = self._read(self._name(fix_id))
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(entry, dict) or set(entry) != {"body", "check"}:
            return None
        body = entry["body"]
        if (
            not isinstance(body, dict)
            or entry["check"] != _checksum(body)
            or body.get("format") != _FORMAT
            or body.get("rules") != self._rules
            or body.get("fix") != fix_id
        ):
            return None
        files = body.get("files")
        verdict = Verdict.from_json(body.get("verdict"))
        if verdict is None or not _valid_files(files):
            return None
        for module, identity in files.items():
            if (tuple(identity) if identity else None) != sources.identity(module):
                return None
        return verdict

    def store(self, fix_id: str, verdict: Verdict, files: FileIdentities) -> None:
        """Keep ``verdict``; a directory or file we cannot use keeps nothing."""
        body = {
            "format": _FORMAT,
            "fix": fix_id,
            "rules": self._rules,
            "files": {m: list(i) if i else None for m, i in files.items()},
            "verdict": verdict.to_json(),
        }
        data = json.dumps({"body": body, "check": _checksum(body)}).encode()
        with contextlib.suppress(OSError):
            make_private_directory(self.directory)
            if is_private_directory(self.directory):
                write_private_file(self.directory, self._name(fix_id), data)

    def _read(self, name: str) -> bytes | None:
        if not is_private_directory(self.directory):
            return None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.directory / name, flags)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (
                not stat.S_ISREG(info.st_mode)
                or info.st_uid != os.getuid()
                or info.st_mode & 0o077
                or info.st_size > _MAX_ENTRY_BYTES
            ):
                return None
            return os.read(fd, _MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)


def _valid_files(files: Any) -> TypeGuard[dict[str, Any]]:
    if not isinstance(files, dict):
        return False
    for module, identity in files.items():
        if not isinstance(module, str):
            return False
        if identity is not None and not (
            isinstance(identity, list)
            and len(identity) == 2
            and all(isinstance(part, str) for part in identity)
        ):
            return False
    return True


def verdict_cache(chosen: str | None, sources: SourceReader) -> VerdictCache | None:
    """The verdicts of the vLLM that ``sources`` reads, kept where ``chosen`` says."""
    try:
        directory = cache_directory(chosen)
    except RuntimeError:  # no home directory to find
        return None
    vllm = sources.identity("vllm")
    if directory is None or vllm is None:
        return None
    return VerdictCache(directory, scope=vllm[0])


def kept_or_judged(
    fix_id: str,
    judge: Callable[[SourceReader], Verdict],
    sources: SourceReader,
    cache: VerdictCache | None,
) -> tuple[Verdict, Origin]:
    """The fix's verdict from ``cache`` where every file it read is unchanged,
    else ``judge(sources)`` now, then kept in ``cache``."""
    kept = None if cache is None else cache.load(fix_id, sources)
    if kept is not None:
        return kept, "kept"
    with sources.recording() as modules:
        verdict = judge(sources)
    if cache is not None:
        files = {m: sources.identity(m) for m in sorted(modules)}
        cache.store(fix_id, verdict, files)
    return verdict, "judged"
