"""The patch catalogue: each fix's facts and the release table, rendered for
doctor, and as the blocks between ``<!-- generated:NAME -->`` markers in the
docs and in each fix's hooks module (``--check``/``--write``)."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_graphsafe import exit_statuses
from vllm_graphsafe.fixes import Fix, all_fixes
from vllm_graphsafe.releases import ReleaseRow, release_table, verified_releases

EXIT_OK = 0
EXIT_STALE = 1
EXIT_BAD_INPUT = 2


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _verified_on(fix: Fix) -> str:
    return ", ".join(verified_releases(fix.id)) or "none yet"


def _wrapped(value: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        value.replace("`", ""),
        width=88,
        break_on_hyphens=False,
        initial_indent=first,
        subsequent_indent=rest,
    )


def render_patches_markdown() -> str:
    lines = [
        "| id | fixes | binds to | upstream | delete when | verified on |",
        "|---|---|---|---|---|---|",
    ]
    for patch in all_fixes():
        cells = (
            f"`{patch.id}`",
            f"**{patch.title}.** {patch.what}",
            patch.binds_to,
            ", ".join(patch.upstream),
            patch.delete_when,
            _verified_on(patch),
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def what_the_sweep_ran(row: ReleaseRow) -> str:
    if not row.raw.get("installed", True):
        return f"not installed: {row.raw.get('why_not', '')}"
    parts = []
    for label, key in (
        ("class tests", "class_tests"),
        ("negative controls", "negative_controls"),
        ("engine", "engine"),
    ):
        value = row.raw.get(key)
        # How the sweep records "every negative control failed its tests
        # without the fix".
        if key == "negative_controls" and value == "all failed":
            value = "each fails its tests without its fix"
        if value:
            parts.append(f"{label}: {value}")
    if row.raw.get("why_not"):
        parts.append(f"why this build: {row.raw['why_not']}")
    return "; ".join(parts)


def render_support_markdown() -> str:
    """CI's rows are re-verified on every CI run (the backport too); the others
    say what the sweep ran, when."""
    ids = [patch.id for patch in all_fixes()]
    lines = [
        "| vLLM release | verified | what ran | " + " | ".join(ids) + " | backport |",
        "|---|---|---|" + "---|" * len(ids) + "---|",
    ]
    for row in release_table():
        states = [row.patches.get(patch_id, "not recorded") for patch_id in ids]
        if row.ci:
            verified = "every CI run"
            ran = "class-level tests, negative controls, engine tests"
            if str(row.raw.get("engine", "")).startswith("not run"):
                ran = "class-level tests and negative controls only (no engine: no GPU)"
            backport = "verified (every CI run)"
        else:
            verified = f"release sweep {row.raw.get('date', '')}".strip()
            ran = what_the_sweep_ran(row)
            backport = str(row.raw.get("backport", "not run"))
        build = " (CUDA build)" if row.distribution == "vllm" else ""
        release = f"`{row.distribution}` {row.version}{build}"
        cells = (release, verified, ran, *states, backport)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def render_text() -> str:
    blocks = []
    for patch in all_fixes():
        lines = [f"{patch.id}: {patch.title}"]
        for label, value in (
            ("what", patch.what),
            ("why", patch.why),
            ("binds to", patch.binds_to),
            ("upstream", ", ".join(patch.upstream)),
            ("delete when", patch.delete_when),
            ("verified on", _verified_on(patch)),
        ):
            lines += _wrapped(value, f"  {label + ':':<13}", " " * 15)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def render_hooks_header(fix: Fix) -> str:
    lines = [f"# {fix.id}: {fix.title}."]
    for label, value in (
        ("What", fix.what),
        ("Why", fix.why),
        ("Binds to", fix.binds_to),
        ("Upstream", ", ".join(fix.upstream) or "none"),
        ("Delete when", fix.delete_when),
    ):
        lines += _wrapped(value, f"# {label}: ", "#   ")
    lines += [
        "# (made from the facts in this folder's __init__.py by",
        "# `python -m vllm_graphsafe.catalogue --write`: edit those, not this)",
    ]
    return "\n".join(lines)


def blocks() -> dict[str, Callable[[], str]]:
    """Every block generated here: marker name -> renderer."""
    found: dict[str, Callable[[], str]] = {
        "patches": render_patches_markdown,
        "support": render_support_markdown,
        exit_statuses.BLOCK: exit_statuses.markdown,
    }
    for fix in all_fixes():
        found[f"facts:{fix.id}"] = functools.partial(render_hooks_header, fix)
    return found


def hooks_modules() -> list[Path]:
    files = []
    for fix in all_fixes():
        spec = importlib.util.find_spec(f"{fix.package}.hooks")
        if spec is not None and spec.origin is not None:
            files.append(Path(spec.origin))
    return files


class MarkerError(ValueError):
    """The document lacks a block's markers."""


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"


def _span(text: str, name: str) -> tuple[int, int]:
    """The whole lines between the line of the block's start marker and the
    line of its end marker (a marker may sit in a comment: ``# <!-- ... -->``)."""
    start_marker, end_marker = markers(name)
    start = text.find(start_marker)
    end = text.find(end_marker)
    if start < 0 or end < start or "\n" not in text[start:end]:
        raise MarkerError(f"the document has no {start_marker} ... {end_marker} block")
    return text.index("\n", start) + 1, text.rindex("\n", 0, end) + 1


def holds_block(text: str, name: str) -> bool:
    start_marker, end_marker = markers(name)
    return 0 <= text.find(start_marker) < text.find(end_marker)


def replace_block(text: str, name: str, content: str) -> str:
    """The one splicer of generated blocks: the benchmark table uses it too."""
    start, end = _span(text, name)
    return text[:start] + content + "\n" + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_graphsafe.catalogue",
        description="Print the patch catalogue, or check/regenerate the blocks "
        "rendered from it (README.md: the support and exit-status tables; "
        "docs/fixes.md: the patch table; docs/commands.md: the exit statuses; "
        "each fix's hooks.py: its heading; no DOC: the hooks modules). "
        "Exit status: 0 current, 1 stale, 2 bad input.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", metavar="DOC", type=Path, nargs="*")
    action.add_argument("--write", metavar="DOC", type=Path, nargs="*")
    action.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.check is None and args.write is None:
        if args.markdown:
            print(render_patches_markdown() + "\n\n" + render_support_markdown())
        else:
            print(render_text())
        return EXIT_OK
    documents: list[Path] = args.check or args.write or hooks_modules()
    status = EXIT_OK
    for path in documents:
        status = max(status, _check_or_write(path, write=args.write is not None))
    return status


def _check_or_write(path: Path, write: bool) -> int:
    try:
        text = path.read_text(encoding="utf-8")
        generated = blocks()
        held = {n: render for n, render in generated.items() if holds_block(text, n)}
        if not held:  # a document holding none of the blocks is bad input
            _span(text, next(iter(generated)))
        if write:
            for name, render in held.items():
                text = replace_block(text, name, render())
            path.write_text(text, encoding="utf-8")
            return EXIT_OK
        stale = []
        for name, render in held.items():
            start, end = _span(text, name)
            if text[start:end].strip() != render().strip():
                stale.append(name)
    except (OSError, MarkerError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if stale:
        print(
            f"{path}: the generated {', '.join(stale)} table(s) are stale; run "
            f"`python -m vllm_graphsafe.catalogue --write {path}`.",
            file=sys.stderr,
        )
        return EXIT_STALE
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
