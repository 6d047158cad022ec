"""``vllm-graphsafe probe``: arguments to ``ProbeSettings``, and the result shown:
the table, statistics and sentences on the terminal, the JSON report in a file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_graphsafe import exit_statuses
from vllm_graphsafe.probe.checks import FAIL, PASS, SKIP, CheckResult, not_run_sentences
from vllm_graphsafe.probe.errors import EXIT_BAD_ARGUMENT, EXIT_INTERRUPTED, EXIT_OK
from vllm_graphsafe.probe.run import ProbeResult, run_probe
from vllm_graphsafe.probe.session import DECODE_PROMPT
from vllm_graphsafe.probe.settings import (
    API_KEY_VARIABLES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_DECODE_TOKENS,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_TIMEOUT,
    ProbeSettings,
    api_key_from,
)
from vllm_graphsafe.settings import STATS_DIR_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Probe a running vLLM OpenAI-compatible server for the speculative-decoding\n"
        "CUDA-graph dispatch bug: prompt chunks of exactly K+1 tokens (alone or\n"
        "after a block or chunk boundary) replayed through the decode graph.\n"
        "\n"
        "It compares boundary-length prompts with neighbouring lengths, cold with\n"
        "prefix-cached runs, concurrent with solo runs, and a long greedy decode\n"
        f"of {DECODE_PROMPT!r} with and without boundary prompts inserted.\n"
        "Where the model's context allows, long prompts join the plan\n"
        "(88,804 and 99,204 tokens for K=3 and 800-token blocks)."
    )
    parser.epilog = (
        f"{exit_statuses.help_text('probe')}\n\n"
        "API key: the probe sends --api-key, else $VLLM_API_KEY, else "
        "$OPENAI_API_KEY.\nThe environment is the safer place: a command-line value "
        "shows in the\nprocess list and the shell history. The key is never printed."
    )
    parser.add_argument(
        "--base-url", required=True, help="server URL, e.g. http://localhost:8000"
    )
    parser.add_argument(
        "--model", help="served model id to probe (default: the served one)"
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=DEFAULT_NUM_SPECULATIVE_TOKENS,
        metavar="K",
        help="speculative tokens the server uses; vLLM does not publish it "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="KV-cache block size; hybrid models often use a larger one "
        "(default: %(default)s)",
    )
    parser.add_argument("--chunk-size", type=int, help="prefill chunk size, if chunked")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="tokens generated per probe prompt (default: %(default)s)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=DEFAULT_DECODE_TOKENS,
        help="least tokens of the long decode; it runs on until every inserted "
        "prompt is answered, as far as the context allows (default: %(default)s)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="model vocabulary size (default: asked from the server by one request)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds each request may take (default: %(default)g)",
    )
    parser.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help="hard bound on HTTP requests (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="prompts sent together in each concurrent group "
        "(default: %(default)s, i.e. pairs)",
    )
    parser.add_argument(
        "--no-long-prompts",
        action="store_true",
        help="leave the long prompts out even where the context allows them",
    )
    parser.add_argument(
        "--api-key",
        help=f"bearer token, if the server wants one (default: ${API_KEY_VARIABLES[0]}"
        f", then ${API_KEY_VARIABLES[1]}; prefer those)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write a JSON report to PATH ('-' for stdout)"
    )
    parser.add_argument(
        "--stats-dir",
        default=None,
        help="also show the dispatch statistics the server's processes wrote there "
        f"(default: ${STATS_DIR_ENV})",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar; only the checks that failed or could not run, and "
        "the summary line",
    )


def run(args: argparse.Namespace) -> int:
    stats_dir = args.stats_dir
    if stats_dir is None:
        from vllm_graphsafe.settings import read_settings

        stats_dir = read_settings().stats_dir
    settings = ProbeSettings(
        base_url=args.base_url,
        model=args.model,
        num_speculative_tokens=args.num_speculative_tokens,
        block_size=args.block_size,
        chunk_size=args.chunk_size,
        max_tokens=args.max_tokens,
        decode_tokens=args.decode_tokens,
        timeout=args.timeout,
        max_requests=args.max_requests,
        concurrency=args.concurrency,
        vocab_size=args.vocab_size,
        api_key=api_key_from(args.api_key, os.environ),
        json_path=args.json,
        stats_dir=stats_dir or None,
        long_prompts=not args.no_long_prompts,
        progress=not (args.quiet or args.json),
    )
    try:
        result = run_probe(settings)
    except KeyboardInterrupt:
        print(
            "Interrupted: the probe stopped before its checks ended.", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    return show_result(result, settings.json_path, quiet=args.quiet)


STATUS_LABELS = {PASS: "PASS", FAIL: "FAIL", SKIP: "NOT RUN"}


def format_table(checks: Sequence[CheckResult]) -> str:
    rows = [("check", "length", "result", "detail")]
    rows += [
        (c.name, c.length_label, STATUS_LABELS[c.status], c.detail) for c in checks
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}"
        for row in rows
    ]
    return "\n".join(lines)


def summary_line(checks: Sequence[CheckResult]) -> str:
    """The verdict: "passed" only when every check ran and passed."""
    total = len(checks)
    failed = sum(c.status == FAIL for c in checks)
    not_run = sum(c.status == SKIP for c in checks)
    if failed:
        line = f"probe FAILED: {failed} of {total} checks failed"
        return line + (f", {not_run} could not run" if not_run else "")
    if not_run:
        return (
            f"probe INCOMPLETE: {not_run} of {total} checks could not run; none failed"
        )
    return f"probe passed: all {total} checks passed"


def show_result(result: ProbeResult, json_path: str | None, quiet: bool = False) -> int:
    """Show a probe's outcome and write its JSON report; return the exit status.

    The table goes to standard error when the JSON report goes to standard output.
    A report that cannot be written makes exit status 2 of a probe that passed.
    """
    if result.error is not None:
        print(result.error, file=sys.stderr)
    else:
        table_stream = sys.stderr if json_path == "-" else sys.stdout
        rows = [c for c in result.checks if not quiet or c.status != PASS]
        if rows:
            print(format_table(rows), file=table_stream)
        print(summary_line(result.checks), file=table_stream)
        for sentence in not_run_sentences(result.checks):
            print(sentence, file=sys.stderr)
    if result.dispatch_stats is not None:
        # The plugin's statistics module loads only when there are statistics.
        from vllm_graphsafe.counts import render_stats

        print("\n".join(render_stats(dict(result.dispatch_stats))), file=sys.stderr)
    late_errors = list(result.late_errors)
    if json_path and result.report:
        text = json.dumps(result.report, indent=2) + "\n"
        if json_path == "-":
            sys.stdout.write(text)
        else:
            try:
                Path(json_path).write_text(text, encoding="utf-8")
            except OSError as error:
                reason = error.strerror or type(error).__name__
                late_errors.append(
                    f"Cannot write the JSON report to {json_path}: {reason}."
                )
    for sentence in late_errors:
        print(sentence, file=sys.stderr)
    if late_errors and result.exit_code == EXIT_OK:
        return EXIT_BAD_ARGUMENT
    return result.exit_code
