"""The probe's exit statuses and the error that ends a probe early."""

from __future__ import annotations

from vllm_graphsafe import exit_statuses

EXIT_OK = exit_statuses.PROBE_OK
EXIT_CHECK_FAILED = exit_statuses.PROBE_CHECK_FAILED
EXIT_BAD_ARGUMENT = exit_statuses.PROBE_BAD_ARGUMENT
EXIT_UNREACHABLE = exit_statuses.PROBE_UNREACHABLE
EXIT_NO_TOKENIZE = exit_statuses.PROBE_NO_TOKENIZE
EXIT_MODEL_MISMATCH = exit_statuses.PROBE_MODEL_MISMATCH
EXIT_HTTP_ERROR = exit_statuses.PROBE_HTTP_ERROR
EXIT_TIMEOUT = exit_statuses.PROBE_TIMEOUT
EXIT_REQUEST_BUDGET = exit_statuses.PROBE_REQUEST_BUDGET
EXIT_BAD_RESPONSE = exit_statuses.PROBE_BAD_RESPONSE
EXIT_API_KEY = exit_statuses.PROBE_API_KEY
EXIT_INCOMPLETE = exit_statuses.PROBE_INCOMPLETE
EXIT_INTERRUPTED = exit_statuses.PROBE_INTERRUPTED

EXIT_STATUSES: tuple[tuple[int, str], ...] = tuple(
    (status.code, status.meaning) for status in exit_statuses.PROBE
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
