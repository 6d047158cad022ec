"""``vllm-graphsafe backport``: the fixes as in-place edits to a vLLM source tree."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from vllm_graphsafe import __version__, exit_statuses, recognition

if TYPE_CHECKING:
    from vllm_graphsafe.backport import Backport, Outcome
    from vllm_graphsafe.backport.tree_tests import FixTests

EXIT_OK = exit_statuses.BACKPORT_OK
EXIT_FIXES_NEEDED = exit_statuses.BACKPORT_FIXES_NEEDED
EXIT_CANNOT_BIND = exit_statuses.BACKPORT_CANNOT_BIND
EXIT_BAD_INPUT = exit_statuses.BACKPORT_BAD_INPUT
EXIT_WRITE_FAILED = exit_statuses.BACKPORT_WRITE_FAILED
EXIT_VERIFY_FAILED = exit_statuses.BACKPORT_VERIFY_FAILED
EXIT_OURS_CHANGED = exit_statuses.BACKPORT_OURS_CHANGED
EXIT_CONFLICTS = exit_statuses.BACKPORT_CONFLICTS

#: The schema every ``--json`` report follows (docs/backport-in-a-fork.md).
JSON_SCHEMA = "vllm-graphsafe.backport/1"

EPILOG = f"""\
states (one line per fix on stderr; --json: the same as data):
  needed          the bug is there and no fix: --write adds ours
  ours            our edit is in, as written, and the tree still needs it
  ours, changed   our edit is in, but a merge or a person changed our own
                  lines: each hunk that differs is shown
  native          the tree fixes it itself (upstream's or the fork's own fix)
  both            our edit is in beside a fix of the tree's own: --drop ours
  not applicable  the tree has no code this fix is about
  target gone     the file, or the function, our edit was in is gone (a merge
                  removed it): --drop takes out what is left of ours
Native is judged by running the fix's cases on the tree's code ("behaviour:
40/40 cases"); where they cannot run, by reading it, and then never native.

{exit_statuses.help_text("backport")}
  (An option unknown to every subcommand is refused by vllm-graphsafe's own
  argument parser before anything is read, with argparse's status 2.)

The tree is never imported. --diff prints a unified diff that `git apply`
accepts at DIR's root; --format-patch writes one `git am`-able patch per fix.
Each edit also writes CPU tests and a record of the edit under
DIR/tests/v1/worker/; --verify runs the tests against DIR (first on
PYTHONPATH, the plugin disabled) with --python; --drop reverses our edits
byte for byte (--drop --diff previews it).
"""


def _fix_ids() -> tuple[str, ...]:
    from vllm_graphsafe.fixes import fix_ids

    return tuple(fix_ids())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "--tree",
        required=True,
        metavar="DIR",
        help="directory holding the vllm/ package (a checkout or a copied release)",
    )
    parser.add_argument(
        "--fix",
        action="append",
        metavar="ID",
        help=f"only this fix (repeatable); one of: {', '.join(_fix_ids())}",
    )
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--check",
        action="store_true",
        help="say where the tree stands for each fix; change nothing",
    )
    modes.add_argument("--write", action="store_true", help="make our edits in place")
    modes.add_argument(
        "--format-patch",
        metavar="OUTDIR",
        help="write one git-am patch per needed fix into OUTDIR",
    )
    modes.add_argument(
        "--verify",
        action="store_true",
        help="run the tests the backport wrote (or would write) against the tree",
    )
    modes.add_argument(
        "--drop",
        action="store_true",
        help="remove our edits, their tests and records (with --diff: preview)",
    )
    parser.add_argument(
        "--diff",
        action="store_true",
        help="print the edits (or, with --drop, the removal) as a unified diff",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --drop: remove what is still ours where a merge changed the rest",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print a JSON report ({JSON_SCHEMA}) on stdout instead of the lines",
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="interpreter --verify runs the tests with (default: this one)",
    )
    # Collected here so that an unknown option is status 3 too (see run()).
    parser.add_argument("unexpected", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    # One sentence and status 3 for a bad command line, not argparse's 2,
    # which this command uses for a fix that cannot bind.
    setattr(parser, "error", lambda message: _usage_error(parser, message))  # noqa: B010


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    print(f"{parser.prog}: {message}.", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def describe(outcome: Outcome) -> str:
    """One line per fix: where the tree stands, how that was found, what follows."""
    from vllm_graphsafe.backport import Status

    found = None if outcome.evidence is None else outcome.evidence.text()
    reason = outcome.reason
    if found is None:
        return f"{outcome.fix_id}: {outcome.status.value} ({reason})"
    said = {
        Status.NATIVE: f"native ({found})",
        Status.CANNOT_BIND: f"needed ({found}); the edit cannot be made here: {reason}",
        Status.NEEDED: f"needed ({found}); edit: {reason}",
        Status.OURS: f"ours ({reason}; without it: needed, {found})",
        Status.BOTH: f"both (without ours: native, {found}); {reason}",
        Status.TARGET_GONE: f"target gone ({reason})",
        Status.OURS_CHANGED: f"ours, changed ({reason}); see below",
    }
    return f"{outcome.fix_id}: {said[outcome.status]}"


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def _fix_report(outcome: Outcome) -> dict[str, Any]:
    return {
        "id": outcome.fix_id,
        "state": outcome.status.value,
        "reason": outcome.reason,
        "evidence": None if outcome.evidence is None else outcome.evidence.to_json(),
        "files": outcome.files,
        "tests": outcome.tests,
        "changed": [{"file": c.relpath, "diff": c.diff} for c in outcome.changed],
        "gone": [{"file": gone.relpath, "what": gone.what} for gone in outcome.gone],
        "verify": None,
    }


def _report(mode: str, root: Path, outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
        "mode": mode,
        "tree": str(root),
        "exit_status": None,  # set by _finish
        "fixes": [_fix_report(outcome) for outcome in outcomes],
        "conflicts": [],
        "written": [],
        "removed": [],
        "left": [],
        "diff": None,
        "patches": [],
    }


def _mode(args: argparse.Namespace) -> str | None:
    for mode in ("check", "write", "verify", "drop"):
        if getattr(args, mode):
            return mode
    if args.format_patch:
        return "format-patch"
    return "diff" if args.diff else None


def _problem(args: argparse.Namespace, mode: str | None) -> str | None:
    """The command line's first problem, in one sentence; None: it is usable."""
    if args.unexpected:
        return f"Unexpected argument {args.unexpected[0]}; see --help."
    if mode is None:
        return (
            "Choose one of --check, --diff, --write, --format-patch OUTDIR, "
            "--verify or --drop."
        )
    if args.diff and mode not in ("diff", "drop"):
        return "--diff goes alone (the edits) or with --drop (the removal)."
    if args.force and mode != "drop":
        return "--force is used only with --drop."
    if args.python is not None and mode != "verify":
        return "--python is used only with --verify."
    python = sys.executable if args.python is None else args.python
    if mode == "verify" and not Path(python).is_file():
        return f"{python} is not an interpreter (no such file)."
    unknown = sorted(set(args.fix or ()) - set(_fix_ids()))
    if unknown:
        return f"Unknown fix id {unknown[0]}; known: {', '.join(_fix_ids())}."
    outdir = Path(args.format_patch).expanduser() if args.format_patch else None
    if outdir is not None and outdir.exists() and not outdir.is_dir():
        return f"{outdir} exists and is not a directory."
    return None


def run(args: argparse.Namespace) -> int:
    from vllm_graphsafe.backport import ConflictError, NotAVllmTreeError

    mode = _mode(args)
    problem = _problem(args, mode)
    if problem is not None:
        _say(problem)
        return EXIT_BAD_INPUT
    assert mode is not None
    root = Path(args.tree).expanduser()
    try:
        with recognition.parses_kept():
            if mode == "drop":
                return _drop(args, root)
            return _edit(args, mode, root)
    except NotAVllmTreeError as error:
        _say(f"{error}.")
        return EXIT_BAD_INPUT
    except ConflictError as error:
        _say(f"{str(error)[:1].upper()}{str(error)[1:]}.")
        report = _report(mode, root, [])
        report["conflicts"] = error.files
        return _finish(report, EXIT_CONFLICTS, args.json)


def _check_status(result: Backport) -> int:
    from vllm_graphsafe.backport import Status

    states = {outcome.status for outcome in result.outcomes}
    if Status.OURS_CHANGED in states:
        return EXIT_OURS_CHANGED
    if Status.CANNOT_BIND in states:
        return EXIT_CANNOT_BIND
    if states & {Status.NEEDED, Status.BOTH, Status.TARGET_GONE}:
        return EXIT_FIXES_NEEDED
    return EXIT_OK


def _show_changed(outcomes: list[Outcome]) -> None:
    for outcome in outcomes:
        for changed in outcome.changed:
            _say(f"{outcome.fix_id}: not as written in {changed.relpath}:")
            _say(changed.diff.rstrip("\n"))


def _edit(args: argparse.Namespace, mode: str, root: Path) -> int:
    from vllm_graphsafe.backport import backport, output

    result = backport(root, args.fix)
    if not args.json:
        for outcome in result.outcomes:
            _say(describe(outcome))
        _show_changed(result.outcomes)
    status = EXIT_CANNOT_BIND if result.unbound() else EXIT_OK
    report = _report(mode, root, result.outcomes)
    if mode == "check":
        status = _check_status(result)
    elif mode == "verify":
        python = sys.executable if args.python is None else args.python
        status = _verify(result, python, report, args.json)
    elif mode == "diff":
        diff = output.combined_diff(root, result.edited)
        report["diff"] = diff
        if not args.json:
            sys.stdout.write(diff)
    elif mode == "write":
        try:
            written = output.apply_changes(root, result.edited)
        except output.WriteError as error:
            _say(f"{error}; nothing was changed.")
            status = EXIT_WRITE_FAILED
            written = []
        report["written"] = written
        if not args.json:
            for relpath in written:
                _say(f"wrote {relpath}")
            if written:
                _say(
                    f"Run the written tests with: vllm-graphsafe backport --tree "
                    f"{args.tree} --verify [--python PATH]"
                )
    else:
        outdir = Path(args.format_patch).expanduser()
        try:
            patches = output.format_patch(result, outdir, __version__)
        except OSError as error:
            _say(f"Cannot write patches into {outdir}: {error.strerror or error}.")
            return EXIT_BAD_INPUT
        report["patches"] = [str(path) for path in patches]
        if not args.json:
            for path in patches:
                _say(f"wrote {path}")
            if not patches and not result.unbound():
                assert not result.needed()
                _say("No patch written: the tree needs none of the fixes.")
    return _finish(report, status, args.json)


def _finish(report: dict[str, Any], status: int, as_json: bool) -> int:
    """``status``, with the report (``--json``) printed on stdout."""
    report["exit_status"] = status
    if as_json:
        print(json.dumps(report, indent=2))
    return status


def _drop(args: argparse.Namespace, root: Path) -> int:
    from vllm_graphsafe.backport import Status, drop, output

    dropping = drop(root, args.fix, force=args.force)
    report = _report("drop", root, dropping.outcomes)
    refused = [o for o in dropping.outcomes if o.status is Status.OURS_CHANGED]
    if not args.json:
        for outcome in dropping.outcomes:
            _say(describe(outcome))
    if refused and not args.force:
        if not args.json:
            _show_changed(refused)
            _say(
                "Nothing was dropped: our edit was changed since it was written "
                "(above). Resolve it, or drop what is still ours with --force."
            )
        return _finish(report, EXIT_OURS_CHANGED, args.json)
    if dropping.entangled:
        for entangled in dropping.entangled:
            _say(f"Not dropped: {entangled}.")
        return _finish(report, EXIT_OURS_CHANGED, args.json)
    written = sorted(p for p, t in dropping.changes.items() if t is not None)
    removed = sorted(p for p, t in dropping.changes.items() if t is None)
    if args.diff:
        diff = output.combined_diff(root, dropping.changes)
        report["diff"] = diff
        if not args.json:
            sys.stdout.write(diff)
    else:
        try:
            output.apply_changes(root, dropping.changes, dropping.directories)
        except output.WriteError as error:
            _say(f"{error}; nothing was changed.")
            return _finish(report, EXIT_WRITE_FAILED, args.json)
        report["written"] = written
        report["removed"] = removed
        if not args.json:
            for relpath in written:
                _say(f"restored {relpath}")
            for relpath in removed:
                _say(f"removed {relpath}")
    report["left"] = [{"file": c.relpath, "diff": c.diff} for c in dropping.left]
    if dropping.left and not args.json:
        _say("Left in place (changed since it was written):")
        for changed in dropping.left:
            _say(changed.diff.rstrip("\n"))
    if not dropping.changes and not args.json:
        _say("Nothing to drop: the tree carries none of our edits.")
    return _finish(report, EXIT_OK, args.json)


def _verify_report(line: FixTests) -> dict[str, Any]:
    counts = line.counts
    return {
        "ok": line.ok,
        "passed": None if counts is None else counts.passed,
        "failed": None if counts is None else counts.failures,
        "errors": None if counts is None else counts.errors,
        "skipped": None if counts is None else counts.skipped,
        "could_not_run": line.could_not_run,
        "rerun": line.rerun,
        "line": line.line,
    }


def _verify(result: Backport, python: str, report: dict[str, Any], quiet: bool) -> int:
    from vllm_graphsafe.backport.tree_tests import verify_tree

    lines = verify_tree(result, python)
    fixes = {fix["id"]: fix for fix in report["fixes"]}
    for line in lines:
        if not quiet:
            _say(f"{line.fix_id} tests: {line.line}")
        fixes[line.fix_id]["verify"] = _verify_report(line)
    return EXIT_OK if all(line.ok for line in lines) else EXIT_VERIFY_FAILED
