"""Every command's exit statuses, declared once: ``--help`` and the docs render them.

Within one command a number has one meaning. The demo runs the probe and
returns the probe's status, so the demo's own statuses use numbers the probe
does not. The documents' table is one of the blocks
``python -m vllm_graphsafe.catalogue --write`` makes (:func:`markdown`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitStatus:
    code: int
    meaning: str


# Users' scripts read these numbers: they never change meaning.
PROBE_OK = 0
PROBE_CHECK_FAILED = 1
PROBE_BAD_ARGUMENT = 2
PROBE_UNREACHABLE = 3
PROBE_NO_TOKENIZE = 4
PROBE_MODEL_MISMATCH = 5
PROBE_HTTP_ERROR = 6
PROBE_TIMEOUT = 7
PROBE_REQUEST_BUDGET = 8
PROBE_BAD_RESPONSE = 9
PROBE_API_KEY = 10
PROBE_INCOMPLETE = 14
PROBE_INTERRUPTED = 130

PROBE: tuple[ExitStatus, ...] = (
    ExitStatus(PROBE_OK, "every check ran and passed"),
    ExitStatus(PROBE_CHECK_FAILED, "a check failed: the server answered wrongly"),
    ExitStatus(
        PROBE_BAD_ARGUMENT,
        "bad command line or argument, or no boundary length fits the model",
    ),
    ExitStatus(
        PROBE_UNREACHABLE, "the server cannot be reached, or dropped the connection"
    ),
    ExitStatus(PROBE_NO_TOKENIZE, "the server has no /tokenize endpoint"),
    ExitStatus(PROBE_MODEL_MISMATCH, "the server does not serve the --model asked for"),
    ExitStatus(PROBE_HTTP_ERROR, "the server answered with an HTTP error"),
    ExitStatus(PROBE_TIMEOUT, "a request got no complete answer within --timeout"),
    ExitStatus(
        PROBE_REQUEST_BUDGET, "the plan needs more requests than --max-requests"
    ),
    ExitStatus(PROBE_BAD_RESPONSE, "the server does not answer like vLLM"),
    ExitStatus(PROBE_API_KEY, "the server wants an API key, or refused the one given"),
    ExitStatus(
        PROBE_INCOMPLETE,
        "no check failed, but a check could not run (it says which, and why): "
        'never "passed"',
    ),
    ExitStatus(PROBE_INTERRUPTED, "interrupted (Ctrl-C)"),
)

DOCTOR_OK = 0
DOCTOR_FIX_MISSING = 1
DOCTOR_BAD_COMMAND_LINE = 2
DOCTOR_NO_VLLM = 3
DOCTOR_BAD_STATS_DIR = 4
DOCTOR_BAD_SETTING = 5

DOCTOR: tuple[ExitStatus, ...] = (
    ExitStatus(
        DOCTOR_OK,
        "every fix this vLLM needs is active (applied, native or not applicable)",
    ),
    ExitStatus(
        DOCTOR_FIX_MISSING,
        "a fix this vLLM needs is not active (failed, or disabled by "
        "GRAPHSAFE_DISABLE)",
    ),
    ExitStatus(DOCTOR_BAD_COMMAND_LINE, "bad command line"),
    ExitStatus(DOCTOR_NO_VLLM, "vLLM is not installed in this Python environment"),
    ExitStatus(
        DOCTOR_BAD_STATS_DIR,
        "the statistics directory cannot be read: not a directory, unreadable, or "
        "holding files that are not the plugin's (one not created yet is not an "
        "error)",
    ),
    ExitStatus(
        DOCTOR_BAD_SETTING,
        "a GRAPHSAFE_* variable has a value that is ignored (the report names it)",
    ),
)

DEMO_OK = 0
DEMO_NO_VLLM = 11
DEMO_PORT_IN_USE = 12
DEMO_HAZARD_NOT_SHOWN = 13
DEMO_SERVER_NOT_HEALTHY = 15
#: Returned by scripts/demo.sh, which prepares the demo's virtual environment.
DEMO_INSTALL_FAILED = 16
DEMO_HANGUP = 129
DEMO_INTERRUPTED = 130
DEMO_TERMINATED = 143

DEMO: tuple[ExitStatus, ...] = tuple(
    sorted(
        (
            ExitStatus(
                DEMO_OK,
                "the probe passed, and the emulated bug showed: garbage without "
                "the plugin, clean with it",
            ),
            ExitStatus(
                PROBE_BAD_ARGUMENT,
                "bad command line or argument (the demo's, or one it passes to the "
                "probe)",
            ),
            # The probe's statuses the demo passes through, as the probe means them.
            *(
                ExitStatus(status.code, f"the probe: {status.meaning}")
                for status in PROBE
                if status.code not in (PROBE_OK, PROBE_BAD_ARGUMENT, PROBE_INTERRUPTED)
            ),
            ExitStatus(
                DEMO_NO_VLLM, "vLLM is not installed in this Python environment"
            ),
            ExitStatus(DEMO_PORT_IN_USE, "--port is in use"),
            ExitStatus(
                DEMO_HAZARD_NOT_SHOWN,
                "the emulated bug did not show as garbage without the plugin, then "
                "clean with it",
            ),
            ExitStatus(DEMO_SERVER_NOT_HEALTHY, "a vLLM server did not become healthy"),
            ExitStatus(
                DEMO_INSTALL_FAILED,
                "scripts/demo.sh could not prepare its virtual environment (no "
                "Python 3.11, or pip could not install a package: it names the "
                "package and the index)",
            ),
            ExitStatus(DEMO_HANGUP, "stopped by SIGHUP (the terminal closed)"),
            ExitStatus(DEMO_INTERRUPTED, "interrupted (Ctrl-C)"),
            ExitStatus(DEMO_TERMINATED, "stopped by SIGTERM"),
        ),
        key=lambda status: status.code,
    )
)

# As src/vllm_graphsafe/cli/backport.py returns them (its EXIT_* constants).
BACKPORT_OK = 0
BACKPORT_FIXES_NEEDED = 1
BACKPORT_CANNOT_BIND = 2
BACKPORT_BAD_INPUT = 3
BACKPORT_WRITE_FAILED = 4
BACKPORT_VERIFY_FAILED = 5
BACKPORT_OURS_CHANGED = 6
BACKPORT_CONFLICTS = 7

BACKPORT: tuple[ExitStatus, ...] = (
    ExitStatus(
        BACKPORT_OK,
        "all settled (--check: every fix ours, native or not applicable), or the "
        "diff, edits, drop or patches were produced",
    ),
    ExitStatus(
        BACKPORT_FIXES_NEEDED,
        "--check: something to do: a fix is needed, both ours and the tree's own "
        "fix are in (drop ours), or the code our edit was in is gone (drop what "
        "is left)",
    ),
    ExitStatus(
        BACKPORT_CANNOT_BIND,
        "a fix is needed but the tree lacks what our edit changes (named on "
        "stderr); nothing of that fix is changed, the others are still produced",
    ),
    ExitStatus(
        BACKPORT_BAD_INPUT,
        "bad input: DIR holds no vllm/ package, an unknown fix id, no mode, an "
        "unusable OUTDIR, --force without --drop",
    ),
    ExitStatus(
        BACKPORT_WRITE_FAILED,
        "writing failed, or a file is read-only or leads out of the tree; every "
        "file was left as it was",
    ),
    ExitStatus(
        BACKPORT_VERIFY_FAILED,
        "--verify: a fix's written tests failed or could not run (the first error "
        "pytest printed, and the command to rerun them)",
    ),
    ExitStatus(
        BACKPORT_OURS_CHANGED,
        "our edit was changed since it was written (--check shows each region; "
        "--drop changes nothing without --force)",
    ),
    ExitStatus(
        BACKPORT_CONFLICTS,
        "the tree holds unresolved merge conflicts (each file named); nothing read",
    ),
)

#: Each command's statuses, in the order the docs list the commands.
COMMANDS: dict[str, tuple[ExitStatus, ...]] = {
    "demo": DEMO,
    "doctor": DOCTOR,
    "probe": PROBE,
    "backport": BACKPORT,
}

BLOCK = "exit-statuses"


def help_text(command: str) -> str:
    """The ``exit status:`` section of ``command``'s ``--help``."""
    statuses = COMMANDS[command]
    width = max(len(str(status.code)) for status in statuses)
    lines = ["exit status:"]
    for status in statuses:
        lead = f"  {status.code:>{width}}  "
        lines += textwrap.wrap(
            status.meaning,
            width=79,
            initial_indent=lead,
            subsequent_indent=" " * len(lead),
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def markdown() -> str:
    """One table: every command's statuses (the docs' and the README's block)."""
    lines = ["| command | exit | meaning |", "|---|--:|---|"]
    for command, statuses in COMMANDS.items():
        for status in statuses:
            meaning = status.meaning.replace("|", "\\|")
            lines.append(f"| `{command}` | {status.code} | {meaning} |")
    return "\n".join(lines)
