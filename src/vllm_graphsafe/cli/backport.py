"""``vllm-graphsafe backport``: the fixes as in-place edits to a vLLM source tree."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from vllm_graphsafe import __version__

EXIT_OK = 0
EXIT_FIXES_NEEDED = 1
EXIT_CANNOT_BIND = 2
EXIT_BAD_INPUT = 3
EXIT_WRITE_FAILED = 4
EXIT_VERIFY_FAILED = 5

EPILOG = """\
exit status:
  0  nothing to do (--check), or the diff/edits/patches were produced
  1  --check only: the tree lacks at least one fix that can be applied
  2  a fix cannot bind: the tree lacks what it must edit (named on stderr);
     nothing is changed for that fix, the others are still produced
  3  bad input: DIR holds no vllm/ package, an unknown fix id, no mode or an
     unusable OUTDIR
  4  writing the tree failed; every file was left as it was
  5  --verify only: a fix's written tests failed or could not run (one
     sentence per fix on stderr)
  (An option unknown to every subcommand is refused by vllm-graphsafe's own
  argument parser before anything is read, with argparse's status 2.)

The tree is never imported. --diff prints a unified diff that `git apply`
accepts at DIR's root; --format-patch writes one `git am`-able patch per fix.
Each edit also writes CPU tests under DIR/tests/v1/worker/; --verify runs
them against DIR (first on PYTHONPATH, the plugin disabled) with --python.
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
        help="say which fixes the tree needs; change nothing",
    )
    modes.add_argument(
        "--diff", action="store_true", help="print the edits as a unified diff"
    )
    modes.add_argument("--write", action="store_true", help="edit the files in place")
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


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from vllm_graphsafe.backport import NotAVllmTreeError, Status, backport
    from vllm_graphsafe.backport.output import (
        WriteError,
        combined_diff,
        format_patch,
        write_tree,
    )

    if args.unexpected:
        _say(f"Unexpected argument {args.unexpected[0]}; see --help.")
        return EXIT_BAD_INPUT
    if not (args.check or args.diff or args.write or args.format_patch or args.verify):
        _say(
            "Choose one of --check, --diff, --write, --format-patch OUTDIR or --verify."
        )
        return EXIT_BAD_INPUT
    if args.python is not None and not args.verify:
        _say("--python is used only with --verify.")
        return EXIT_BAD_INPUT
    python = sys.executable if args.python is None else args.python
    if args.verify and not Path(python).is_file():
        _say(f"{python} is not an interpreter (no such file).")
        return EXIT_BAD_INPUT
    unknown = sorted(set(args.fix or ()) - set(_fix_ids()))
    if unknown:
        _say(f"Unknown fix id {unknown[0]}; known: {', '.join(_fix_ids())}.")
        return EXIT_BAD_INPUT
    root = Path(args.tree).expanduser()
    outdir = Path(args.format_patch).expanduser() if args.format_patch else None
    if outdir is not None and outdir.exists() and not outdir.is_dir():
        _say(f"{outdir} exists and is not a directory.")
        return EXIT_BAD_INPUT
    try:
        result = backport(root, args.fix)
    except NotAVllmTreeError as error:
        _say(f"{error}.")
        return EXIT_BAD_INPUT

    for outcome in result.outcomes:
        _say(f"{outcome.fix_id}: {outcome.status.value} ({outcome.reason})")
    status = EXIT_CANNOT_BIND if result.unbound() else EXIT_OK

    if args.check:
        if result.unbound():
            return EXIT_CANNOT_BIND
        return EXIT_FIXES_NEEDED if result.needed() else EXIT_OK
    if args.verify:
        return _verify(result, python)
    if args.diff:
        sys.stdout.write(combined_diff(result))
        return status
    if args.write:
        try:
            written = write_tree(result)
        except WriteError as error:
            _say(f"{error}; nothing was changed.")
            return EXIT_WRITE_FAILED
        for relpath in written:
            _say(f"wrote {relpath}")
        if written:
            _say(
                f"Run the written tests with: vllm-graphsafe backport --tree "
                f"{args.tree} --verify [--python PATH]"
            )
        return status
    assert outdir is not None
    try:
        patches = format_patch(result, outdir, __version__)
    except OSError as error:
        _say(f"Cannot write patches into {outdir}: {error.strerror or error}.")
        return EXIT_BAD_INPUT
    for path in patches:
        _say(f"wrote {path}")
    if not patches and not result.unbound():
        needed = [o for o in result.outcomes if o.status is Status.NEEDED]
        assert not needed
        _say("No patch written: the tree needs none of the fixes.")
    return status


def _verify(result: object, python: str) -> int:
    from vllm_graphsafe.backport import Backport
    from vllm_graphsafe.backport.tree_tests import verify_tree

    assert isinstance(result, Backport)
    lines = verify_tree(result, python)
    for line in lines:
        _say(f"{line.fix_id} tests: {line.line}")
    return EXIT_OK if all(line.ok for line in lines) else EXIT_VERIFY_FAILED
