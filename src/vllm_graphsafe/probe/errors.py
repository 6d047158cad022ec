"""The probe's exit statuses and the error that ends a probe early."""

from __future__ import annotations

from vllm_graphsafe.exit_statuses import (
    PROBE,
    PROBE_API_KEY,
    PROBE_BAD_ARGUMENT,
    PROBE_BAD_RESPONSE,
    PROBE_CHECK_FAILED,
    PROBE_HTTP_ERROR,
    PROBE_INCOMPLETE,
    PROBE_INTERRUPTED,
    PROBE_MODEL_MISMATCH,
    PROBE_NO_TOKENIZE,
    PROBE_OK,
    PROBE_REQUEST_BUDGET,
    PROBE_TIMEOUT,
    PROBE_UNREACHABLE,
)

# The probe's statuses, declared in vllm_graphsafe.exit_statuses.
EXIT_OK = PROBE_OK
EXIT_CHECK_FAILED = PROBE_CHECK_FAILED
EXIT_BAD_ARGUMENT = PROBE_BAD_ARGUMENT
EXIT_UNREACHABLE = PROBE_UNREACHABLE
EXIT_NO_TOKENIZE = PROBE_NO_TOKENIZE
EXIT_MODEL_MISMATCH = PROBE_MODEL_MISMATCH
EXIT_HTTP_ERROR = PROBE_HTTP_ERROR
EXIT_TIMEOUT = PROBE_TIMEOUT
EXIT_REQUEST_BUDGET = PROBE_REQUEST_BUDGET
EXIT_BAD_RESPONSE = PROBE_BAD_RESPONSE
EXIT_API_KEY = PROBE_API_KEY
EXIT_INCOMPLETE = PROBE_INCOMPLETE
EXIT_INTERRUPTED = PROBE_INTERRUPTED

#: Every exit status and what it means, for ``--help`` and the README.
EXIT_STATUSES: tuple[tuple[int, str], ...] = tuple(
    (status.code, status.meaning) for status in PROBE
)


class ProbeError(Exception):
    """A condition that ends the probe early: one sentence and its exit status."""

    def __init__(self, exit_status: int, message: str) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.message = message


class HttpStatusError(ProbeError):
    """The server answered a request with an HTTP error status."""

    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        sentence = f"The server answered HTTP {status} to {method} {path}"
        if detail:
            sentence += f": {detail}"
        super().__init__(EXIT_HTTP_ERROR, sentence.rstrip(". ") + ".")
        self.status = status
        self.detail = detail


def bad_argument(sentence: str) -> ProbeError:
    return ProbeError(EXIT_BAD_ARGUMENT, sentence)
