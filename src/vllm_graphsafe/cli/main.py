"""The ``vllm-graphsafe`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is its own error,
    shown with its own usage (argparse would hand it back to the top-level
    parser, which shows the top-level usage)."""

    #: Left False for a command that collects what it does not know itself.
    rejects_unknown = True

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown and self.rejects_unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


def build_parser() -> argparse.ArgumentParser:
    from vllm_graphsafe import __version__
    from vllm_graphsafe.cli import backport, demo, doctor, probe

    parser = argparse.ArgumentParser(
        prog="vllm-graphsafe",
        description="Phase-safe CUDA graph dispatch for vLLM: status, checks and demo.",
        epilog="Each command's --help lists its exit statuses.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=CommandParser
    )
    for name, module, summary in (
        ("doctor", doctor, "show what this vLLM needs and what the plugin applied"),
        (
            "probe",
            probe,
            "check a running OpenAI-compatible vLLM server for corruption",
        ),
        (
            "demo",
            demo,
            "start a local vLLM server with a tiny model and show the fixes",
        ),
        ("backport", backport, "edit a vLLM source tree to carry the fixes"),
    ):
        sub = commands.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=getattr(module, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        # backport keeps its own answer to arguments it does not know (its
        # statuses: src/vllm_graphsafe/cli/backport.py).
        sub.rejects_unknown = name != "backport"
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
