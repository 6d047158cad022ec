"""``vllm-graphsafe demo``: a real local vLLM server, the plugin at work, then gone."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from vllm_graphsafe.settings import STATS_DIR_ENV

EXIT_SERVER_FAILED = 3

CPU_NOTE = (
    "Note: a CPU runs no CUDA graphs. The statistics below are the decisions the "
    "runner hands to vLLM's CUDA graph dispatcher; on a GPU server those same "
    "decisions pick which graph is replayed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="where to build the tiny model and keep vLLM's caches "
        "(default: ./.cache/vllm-graphsafe)",
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for health",
    )
    parser.add_argument(
        "--num-speculative-tokens", type=int, default=3, help="ngram draft tokens (K)"
    )
    parser.add_argument(
        "--without-plugin",
        action="store_true",
        help="start the server with the plugin disabled, to compare",
    )
    parser.add_argument("--json", default=None, help="also write the probe report here")


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run(args: argparse.Namespace) -> int:
    from vllm_graphsafe.cli import doctor, probe
    from vllm_graphsafe.cli.main import build_parser
    from vllm_graphsafe.stats import read_stats_dir
    from vllm_graphsafe.testing.engine import BLOCK_SIZE
    from vllm_graphsafe.testing.server import (
        ServerStartError,
        server_environment,
        start_server,
    )
    from vllm_graphsafe.testing.tiny_model import build_tiny_model

    cache_dir = Path(args.cache_dir or Path.cwd() / ".cache" / "vllm-graphsafe")
    section("building the tiny model")
    started = time.monotonic()
    model_dir = build_tiny_model(cache_dir / "models", seed=0)
    print(f"{model_dir} ({time.monotonic() - started:.1f} s)")

    stats_dir = tempfile.mkdtemp(prefix="graphsafe-stats-")
    overrides = {STATS_DIR_ENV: stats_dir, "VLLM_CACHE_ROOT": str(cache_dir / "vllm")}
    if args.without_plugin:
        overrides["VLLM_GRAPHSAFE_DISABLE"] = "all"
    section("starting vLLM")
    server = start_server(
        model_dir,
        env=server_environment(overrides),
        log_path=cache_dir / "demo-server.log",
        port=args.port,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    base_url = server.base_url
    print(" ".join(map(str, server.process.args)))  # type: ignore[arg-type]
    print(f"server log: {server.log_path}")
    try:
        try:
            server.wait_until_healthy(args.startup_timeout)
        except ServerStartError as error:
            print(error, file=sys.stderr)
            return EXIT_SERVER_FAILED
        print(f"healthy at {base_url} after {time.monotonic() - started:.0f} s")

        section("doctor (this environment, and what the server's processes applied)")
        report = doctor.collect_report(import_modules=False, stats_dir=stats_dir)
        print(doctor.render_report(report))

        section("probe")
        probe_argv = [
            "probe",
            "--base-url",
            base_url,
            "--num-speculative-tokens",
            str(args.num_speculative_tokens),
            "--block-size",
            str(BLOCK_SIZE),
            "--stats-dir",
            stats_dir,
        ]
        if args.json:
            probe_argv += ["--json", args.json]
        probe_status = probe.run(build_parser().parse_args(probe_argv))

        section("dispatch statistics")
        time.sleep(1.5)
        print(CPU_NOTE)
        stats = read_stats_dir(stats_dir)
        print(json.dumps(stats["counts"], indent=2, sort_keys=True))
        kept_off = sum(
            events.get("prefill_kept_off_decode_graph", 0)
            for events in stats["counts"].values()
        )
        decode = sum(
            events.get("uniform_decode", 0) for events in stats["counts"].values()
        )
        if args.without_plugin:
            print(
                "The plugin was disabled: nothing kept prefill steps off decode graphs."
            )
        else:
            print(
                f"The plugin kept {kept_off} prefill step(s) off the decode graph; "
                f"{decode} genuine decode step(s) kept it."
            )
        return probe_status
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the server", file=sys.stderr)
        return 130
    finally:
        server.stop()
        print("server stopped", flush=True)
