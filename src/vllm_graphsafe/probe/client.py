"""JSON and server-sent events over one ``httpx.Client``, within a request budget.
httpx is imported when a client is made, so that importing the probe (or the
plugin) never imports it."""

from __future__ import annotations

import functools
import ipaddress
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from vllm_graphsafe.probe import errors
from vllm_graphsafe.probe.answers import error_detail
from vllm_graphsafe.probe.errors import HttpStatusError, ProbeError

if TYPE_CHECKING:
    import httpx
    from tqdm import tqdm


class RequestBudget:
    """A hard, thread-safe bound on the number of HTTP requests."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            if self.used >= self.limit:
                raise ProbeError(
                    errors.EXIT_REQUEST_BUDGET,
                    f"The probe needed more than --max-requests {self.limit} requests "
                    f"(answers without token ids cost extra tokenize requests).",
                )
            self.used += 1


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_failure(error: BaseException) -> str:
    """Why a connection could not be made, in a few words."""
    text = str(error)
    lowered = text.lower()
    if "refused" in lowered:
        return "connection refused"
    if any(
        words in lowered
        for words in ("name or service", "nodename", "name resolution", "getaddrinfo")
    ):
        return "its host name does not resolve"
    if "certificate" in lowered:
        return "its TLS certificate is not trusted"
    if "unreachable" in lowered:
        return "the network is unreachable"
    return text or type(error).__name__


@functools.cache
def tls_context(trust_env: bool) -> ssl.SSLContext:
    """The certificate store httpx would load for each client (0.1 s), once."""
    import httpx

    return httpx.create_ssl_context(trust_env=trust_env)


class ServerClient:
    """One connection pool to the server, one timeout per request, one budget."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        budget: RequestBudget,
        progress: tqdm,
        api_key: str | None,
    ) -> None:
        import httpx

        self.base_url = base_url
        self.timeout = timeout
        self.budget = budget
        self.progress = progress
        self.sent_key = bool(api_key)
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # A proxy from the environment can never serve a loopback address.
        trust_env = not is_loopback(base_url)
        self._http = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=timeout,
            trust_env=trust_env,
            verify=tls_context(trust_env),
        )

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.close()

    def request_json(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        """The JSON answer to a GET, or to a POST of ``payload`` when given."""
        import httpx

        method = "GET" if payload is None else "POST"
        self.budget.take()
        try:
            response = self._http.request(method, path, json=payload)
        except httpx.HTTPError as error:
            raise self._translate(error, method, path) from None
        finally:
            self.progress.update()
        self._raise_for_status(response, method, path)
        return self._decode(response.content, method, path)

    def post_stream(
        self, path: str, payload: dict[str, Any], limit_s: float
    ) -> Generator[Any, None, None]:
        """The JSON events of a server-sent event stream, until ``[DONE]``, within
        ``limit_s``; closing the generator early ends the request on the server."""
        import httpx

        self.budget.take()
        deadline = time.monotonic() + limit_s
        try:
            with self._http.stream("POST", path, json=payload) as response:
                if not response.is_success:
                    response.read()
                    self._raise_for_status(response, "POST", path)
                for line in response.iter_lines():
                    if time.monotonic() > deadline:
                        raise self._timeout("POST", path, limit_s)
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    yield self._decode(data.encode(), "POST", path)
        except httpx.HTTPError as error:
            raise self._translate(error, "POST", path) from None
        finally:
            self.progress.update()

    def _raise_for_status(
        self, response: httpx.Response, method: str, path: str
    ) -> None:
        if response.is_success:
            return
        if response.status_code == 401:
            if self.sent_key:
                raise ProbeError(
                    errors.EXIT_API_KEY,
                    "The server refused the API key the probe sent (HTTP 401): "
                    "set VLLM_API_KEY to the key the server was started with.",
                )
            raise ProbeError(
                errors.EXIT_API_KEY, "The server wants an API key: set VLLM_API_KEY."
            )
        detail = error_detail(response.content)
        raise HttpStatusError(response.status_code, method, path, detail)

    def _translate(self, error: Exception, method: str, path: str) -> ProbeError:
        import httpx

        if isinstance(error, httpx.TimeoutException):
            return self._timeout(method, path, self.timeout)
        if isinstance(error, httpx.ConnectError):
            return ProbeError(
                errors.EXIT_UNREACHABLE,
                f"Cannot reach the server at {self.base_url} "
                f"({connect_failure(error)}).",
            )
        if isinstance(error, httpx.ProxyError):
            return ProbeError(
                errors.EXIT_UNREACHABLE,
                f"Cannot reach the server at {self.base_url} through the proxy "
                f"set in the environment ({error}).",
            )
        if isinstance(error, httpx.DecodingError):
            return ProbeError(
                errors.EXIT_BAD_RESPONSE,
                f"The server's answer to {method} {path} cannot be decoded.",
            )
        return ProbeError(
            errors.EXIT_UNREACHABLE,
            f"The server at {self.base_url} dropped the connection during "
            f"{method} {path} ({type(error).__name__}).",
        )

    def _timeout(self, method: str, path: str, limit_s: float) -> ProbeError:
        return ProbeError(
            errors.EXIT_TIMEOUT,
            f"{method} {path} got no complete answer within {limit_s:g} seconds, "
            f"so the server may be hung.",
        )

    def _decode(self, body: bytes, method: str, path: str) -> Any:
        try:
            return json.loads(body)
        except ValueError:
            raise ProbeError(
                errors.EXIT_BAD_RESPONSE,
                f"The server answered {method} {path} with something that is not JSON.",
            ) from None
