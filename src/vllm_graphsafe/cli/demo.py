"""``vllm-graphsafe demo``: a real local vLLM server, the plugin at work, then gone."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import closing
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


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_health(
    base_url: str, server: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"the vLLM server exited with status {server.returncode}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the vLLM server was not healthy after {timeout:.0f} s")


def stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGINT)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run(args: argparse.Namespace) -> int:
    from vllm_graphsafe.cli import doctor, probe
    from vllm_graphsafe.cli.main import build_parser
    from vllm_graphsafe.stats import read_stats_dir
    from vllm_graphsafe.testing.engine import BLOCK_SIZE, CPU_ENV, server_command
    from vllm_graphsafe.testing.tiny_model import build_tiny_model

    cache_dir = Path(args.cache_dir or Path.cwd() / ".cache" / "vllm-graphsafe")
    section("building the tiny model")
    started = time.monotonic()
    model_dir = build_tiny_model(cache_dir / "models", seed=0)
    print(f"{model_dir} ({time.monotonic() - started:.1f} s)")

    port = args.port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    stats_dir = tempfile.mkdtemp(prefix="graphsafe-stats-")
    env = {
        **CPU_ENV,
        **os.environ,
        STATS_DIR_ENV: stats_dir,
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
    }
    if args.without_plugin:
        env["VLLM_GRAPHSAFE_DISABLE"] = "all"
    log_path = cache_dir / "demo-server.log"
    command = server_command(
        model_dir, port=port, num_speculative_tokens=args.num_speculative_tokens
    )
    section("starting vLLM")
    print(" ".join(command))
    print(f"server log: {log_path}")
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            wait_for_health(base_url, server, args.startup_timeout)
        except RuntimeError as error:
            print(f"{error}; the last lines of its log:", file=sys.stderr)
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
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
        stop_server(server)
        print("server stopped", flush=True)
