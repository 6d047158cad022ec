"""The ``vllm-graphsafe`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from vllm_graphsafe import __version__
    from vllm_graphsafe.cli import backport, demo, doctor, probe

    parser = argparse.ArgumentParser(
        prog="vllm-graphsafe",
        description="Phase-safe CUDA graph dispatch for vLLM: status, checks and demo.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
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
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
