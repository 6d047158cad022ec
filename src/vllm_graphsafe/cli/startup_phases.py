"""What a starting vLLM server is doing, read from its log.

The latest line that starts a stage of vLLM's start-up names the phase the
server is in; the demo shows that phase and how long it has lasted, never a raw
log line. The markers are the words of vLLM's own messages, as vLLM 0.27 to
0.33 log them.
"""

from __future__ import annotations

STARTING = "starting Python and importing vLLM"

#: Each phase and the fragments of the log lines that start it.
STARTUP_PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reading the model's configuration", ("non-default args:",)),
    (
        "starting the engine process",
        ("Resolved architecture:", "Using max model len"),
    ),
    ("starting the engine's workers", ("Initializing a V1 LLM engine",)),
    (
        "loading the model",
        (
            "Starting to load model",
            "Loading model from scratch",
            "Loading safetensors checkpoint shards",
            "Loading weights took",
            "Loading drafter model",
            "Model loading took",
        ),
    ),
    (
        "compiling the model (torch.compile)",
        (
            "Starting torch.compile",
            "Dynamo bytecode transform time",
            "Compiling a graph for",
        ),
    ),
    (
        "measuring memory and sizing the KV cache",
        (
            "torch.compile took",
            "Memory profiling takes",
            "Available KV cache memory",
            "for KV cache",
            "KV cache size:",
        ),
    ),
    ("capturing CUDA graphs", ("Capturing CUDA graphs",)),
    ("warming up", ("Graph capturing finished",)),
    (
        "starting the HTTP server",
        (
            "init engine (profile, create kv cache, warmup model) took",
            "Starting vLLM server on",
            "Starting vLLM API server",
            "Available routes are",
        ),
    ),
    ("up, waiting for its first health check", ("Application startup complete",)),
)


def line_phase(line: str) -> str | None:
    """The phase a log line starts, if it is one vLLM logs at such a step."""
    for phase, fragments in STARTUP_PHASES:
        if any(fragment in line for fragment in fragments):
            return phase
    return None


def startup_phase(log_text: str) -> str:
    """The phase named by the latest recognisable line of a server's log."""
    phase = STARTING
    for line in log_text.splitlines():
        phase = line_phase(line) or phase
    return phase


def progress_line(elapsed_s: float, phase: str, in_phase_s: float | None) -> str:
    """Time since the demo began, the phase, and how long the server has been
    in it when that is not the first mention."""
    line = f"{elapsed_s:5.0f} s  {phase}"
    if in_phase_s is not None:
        line += f" (for {in_phase_s:.0f} s)"
    return line
