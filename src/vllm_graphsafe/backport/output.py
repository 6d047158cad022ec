"""Render a backport: unified diffs, ``git am`` patch files, and in-place writes."""

from __future__ import annotations

import contextlib
import difflib
import email.utils
import os
import stat
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

from vllm_graphsafe import fixes
from vllm_graphsafe.backport import Backport, Outcome
from vllm_graphsafe.tree_edits.plan import written_test_path
from vllm_graphsafe.tree_edits.tree import read_exact

AUTHOR = "vllm-graphsafe backport <backport@vllm-graphsafe.invalid>"
_NO_NEWLINE = "\\ No newline at end of file\n"


def file_diff(relpath: str, old: str | None, new: str | None) -> str:
    """A git-style diff of one file (``old`` None: new; ``new`` None: deleted)."""
    header = f"diff --git a/{relpath} b/{relpath}\n"
    if new is None:
        header += "deleted file mode 100644\n"
    elif old is None:
        header += "new file mode 100644\n"
    lines = list(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile="/dev/null" if old is None and new is not None else f"a/{relpath}",
            tofile="/dev/null" if new is None else f"b/{relpath}",
        )
    )
    if not lines and new is not None:
        return ""
    body = "".join(
        line if line.endswith("\n") else line + "\n" + _NO_NEWLINE for line in lines
    )
    return header + body


def tree_diff(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> str:
    return "".join(
        file_diff(relpath, before.get(relpath), after[relpath])
        for relpath in sorted(after)
    )


def combined_diff(root: Path, after: Mapping[str, str | None]) -> str:
    return tree_diff({path: read_exact(root / path) for path in after}, after)


class WriteError(OSError):
    """A file of the tree could not be written; nothing was changed."""


def _inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def _target(root: Path, relpath: str) -> Path:
    """Where ``relpath`` is written: through a link (kept) only where it stays
    in the tree."""
    path = root / relpath
    if not _inside(root, path.parent) or (
        path.is_symlink() and not _inside(root, path)
    ):
        raise WriteError(f"{relpath} leads out of {root} through a symbolic link")
    return path.resolve() if path.is_symlink() else path


def _refusals(root: Path, changes: Mapping[str, str | None]) -> list[str]:
    """Why each change cannot be made, checked before anything is written."""
    refused = []
    for relpath in sorted(changes):
        try:
            path = _target(root, relpath)
        except WriteError as error:
            refused.append(str(error))
            continue
        if path.exists():
            # A file with no write bit is refused even where this user (an
            # administrator) could still write it.
            writable = os.access(path, os.W_OK) and path.stat().st_mode & 0o222
            if not writable or not os.access(path.parent, os.W_OK):
                refused.append(f"{relpath} is read-only")
        elif changes[relpath] is not None:
            existing = next((p for p in path.parents if p.exists()), None)
            if existing is not None and not os.access(existing, os.W_OK):
                shown = (
                    existing.relative_to(root) if _inside(root, existing) else existing
                )
                refused.append(f"{shown} is read-only")
    return refused


def apply_changes(
    root: Path, changes: Mapping[str, str | None], directories: Iterable[str] = ()
) -> list[str]:
    """Write (or, for None, delete) every changed file, all or none: a failure
    midway restores what was done. Each written file keeps its mode;
    ``directories`` left empty afterwards are removed."""
    refused = _refusals(root, changes)
    if refused:
        raise WriteError("; ".join(refused))
    staged: list[tuple[Path | None, Path, str | None]] = []
    made_dirs: list[Path] = []
    try:
        for relpath, text in sorted(changes.items()):
            target = _target(root, relpath)
            original = read_exact(target) if target.exists() else None
            if text is None:
                staged.append((None, target, original))
                continue
            missing = [p for p in reversed(target.parents) if not p.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            made_dirs += missing
            temporary = target.with_name(f".{target.name}.graphsafe-tmp")
            temporary.write_text(text, encoding="utf-8", newline="")
            if target.exists():
                os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))
            staged.append((temporary, target, original))
    except OSError as error:
        _discard(staged)
        for made in reversed(made_dirs):
            with contextlib.suppress(OSError):
                made.rmdir()
        raise WriteError(f"cannot write into {root}: {error}") from error
    done: list[tuple[Path, str | None]] = []
    try:
        for staged_file, destination, before in staged:
            if staged_file is None:
                destination.unlink(missing_ok=True)
            else:
                os.replace(staged_file, destination)
            done.append((destination, before))
    except OSError as error:
        for destination, before in reversed(done):
            if before is None:
                destination.unlink(missing_ok=True)
            else:
                destination.write_text(before, encoding="utf-8", newline="")
        _discard(staged)
        raise WriteError(f"cannot write into {root}: {error}") from error
    for directory in directories:
        with contextlib.suppress(OSError):
            (root / directory).rmdir()  # only where it is empty
    return sorted(changes)


def _discard(staged: list[tuple[Path | None, Path, str | None]]) -> None:
    for temporary, _, _ in staged:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(" ".join(text.split()), 72))


def commit_message(outcome: Outcome, version: str) -> str:
    fix = fixes.get(outcome.fix_id)
    assert outcome.plan is not None
    test_path = written_test_path(outcome.fix_id)
    names = ", ".join(outcome.plan.names)
    upstream = "\n".join(f"- {reference}" for reference in fix.upstream)
    sections = [
        fix.commit_subject,
        "What:\n" + _wrap(fix.what),
        "Why:\n" + _wrap(fix.why),
        "Upstream references:\n" + upstream,
        _wrap(f"Layout: {outcome.plan.layout}. New names: {names}."),
        "Testing:\n"
        + _wrap(
            f"CPU tests in {test_path} exercise the edited code directly, with "
            "no GPU, model or plugin. Run them from the tree's root with:"
        )
        + f"\n\n    PYTHONPATH=. pytest {test_path} \\\n"
        f"        --confcutdir={Path(test_path).parent}\n\n"
        + _wrap(
            f"vllm-graphsafe {version} generated this edit from this tree's own "
            "code and checked that its code-based detection reads the edited "
            "tree as having the fix natively. Its CI applies the same edit to "
            "copies of the vLLM releases it tests and checks that these tests "
            "pass after the edit and fail before it, that its regression suite "
            "for this fix passes on the edited copy with the plugin disabled, "
            "and that ruff with vLLM's rules finds nothing new."
        ),
    ]
    return "\n\n".join(sections) + "\n"


def format_patch(result: Backport, outdir: Path, version: str) -> list[Path]:
    needed = result.needed()
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    date = email.utils.formatdate(localtime=False)
    for number, outcome in enumerate(needed, start=1):
        assert outcome.plan is not None
        after = {**outcome.plan.texts, **outcome.plan.tests}
        diff = tree_diff(outcome.before, after)
        message = commit_message(outcome, version)
        subject, _, body = message.partition("\n\n")
        text = (
            "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: {AUTHOR}\n"
            f"Date: {date}\n"
            f"Subject: [PATCH {number}/{len(needed)}] {subject}\n"
            "\n"
            f"{body}"
            "---\n"
            "\n"
            f"{diff}"
            "-- \n"
            f"vllm-graphsafe {version}\n"
            "\n"
        )
        path = outdir / f"{number:04d}-{outcome.fix_id}.patch"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
