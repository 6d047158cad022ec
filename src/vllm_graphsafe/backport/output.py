"""Render a backport: unified diffs, ``git am`` patch files, and in-place writes."""

from __future__ import annotations

import difflib
import email.utils
import os
from collections.abc import Mapping
from pathlib import Path

from vllm_graphsafe import fixes
from vllm_graphsafe.backport import Backport, Outcome
from vllm_graphsafe.backport.plan import written_test_path

AUTHOR = "vllm-graphsafe backport <backport@vllm-graphsafe.invalid>"
_NO_NEWLINE = "\\ No newline at end of file\n"


def file_diff(relpath: str, old: str | None, new: str) -> str:
    """A git-style unified diff of one file, with ``a/`` and ``b/`` paths."""
    old_lines = [] if old is None else old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    header = f"diff --git a/{relpath} b/{relpath}\n"
    if old is None:
        header += "new file mode 100644\n"
    lines = list(
        difflib.unified_diff(
            old_lines,
            new_lines,
            fromfile="/dev/null" if old is None else f"a/{relpath}",
            tofile=f"b/{relpath}",
        )
    )
    if not lines:
        return ""
    body = "".join(
        line if line.endswith("\n") else line + "\n" + _NO_NEWLINE for line in lines
    )
    return header + body


def tree_diff(before: Mapping[str, str | None], after: Mapping[str, str]) -> str:
    return "".join(
        file_diff(relpath, before.get(relpath), after[relpath])
        for relpath in sorted(after)
    )


def combined_diff(result: Backport) -> str:
    """Every needed fix, against the tree as it is on disk."""
    before = {path: _read(result.root / path) for path in result.edited}
    return tree_diff(before, result.edited)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


class WriteError(OSError):
    """A file of the tree could not be written; nothing was left changed."""


def write_tree(result: Backport) -> list[str]:
    """Write every edited file, all or none: a failure restores what was written."""
    staged: list[tuple[Path, Path, str | None]] = []
    try:
        for relpath, text in sorted(result.edited.items()):
            target = result.root / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.graphsafe-tmp")
            temporary.write_text(text, encoding="utf-8")
            if target.exists():
                os.chmod(temporary, target.stat().st_mode)
            staged.append((temporary, target, _read(target)))
    except OSError as error:
        for temporary, _, _ in staged:
            temporary.unlink(missing_ok=True)
        raise WriteError(f"cannot write into {result.root}: {error}") from error
    done: list[tuple[Path, str | None]] = []
    try:
        for temporary, target, original in staged:
            os.replace(temporary, target)
            done.append((target, original))
    except OSError as error:
        for target, original in reversed(done):
            if original is None:
                target.unlink(missing_ok=True)
            else:
                target.write_text(original, encoding="utf-8")
        for temporary, _, _ in staged:
            temporary.unlink(missing_ok=True)
        raise WriteError(f"cannot write into {result.root}: {error}") from error
    return sorted(result.edited)


def _wrap(text: str, width: int = 72) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(" ".join(text.split()), width))


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
    """One ``git am``-able mbox file per needed fix, in edit order."""
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
