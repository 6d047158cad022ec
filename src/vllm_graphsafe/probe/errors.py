"""The probe's exit statuses and the error that ends a probe early."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_ARGUMENT = 2
EXIT_UNREACHABLE = 3
EXIT_NO_TOKENIZE = 4
EXIT_MODEL_MISMATCH = 5
EXIT_HTTP_ERROR = 6
EXIT_TIMEOUT = 7
EXIT_REQUEST_BUDGET = 8
EXIT_BAD_RESPONSE = 9
EXIT_API_KEY = 10
# 11-13 are the demo's own statuses; the demo returns the probe's, so none is reused.
EXIT_INCOMPLETE = 14
EXIT_INTERRUPTED = 130

#: Every exit status and what it means, for ``--help`` and the README.
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "every check ran and passed"),
    (EXIT_CHECK_FAILED, "a check failed: the server answered wrongly"),
    (EXIT_BAD_ARGUMENT, "bad argument, or no boundary length fits the model"),
    (EXIT_UNREACHABLE, "the server cannot be reached or dropped the connection"),
    (EXIT_NO_TOKENIZE, "the server has no /tokenize endpoint"),
    (EXIT_MODEL_MISMATCH, "the server does not serve the --model asked for"),
    (EXIT_HTTP_ERROR, "the server answered with an HTTP error"),
    (EXIT_TIMEOUT, "a request got no complete answer within --timeout"),
    (EXIT_REQUEST_BUDGET, "the probe needs more requests than --max-requests"),
    (EXIT_BAD_RESPONSE, "the server does not answer like vLLM (not a vLLM server)"),
    (EXIT_API_KEY, "the server wants an API key, or refused the one given"),
    (
        EXIT_INCOMPLETE,
        "no check failed, but a check could not run (it says which, why)",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
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
