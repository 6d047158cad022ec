"""What a probe is asked to do: typed, frozen settings and their validation."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_graphsafe.probe.errors import bad_argument

DEFAULT_NUM_SPECULATIVE_TOKENS = 3
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_TOKENS = 24
DEFAULT_DECODE_TOKENS = 256
DEFAULT_TIMEOUT = 60.0
#: One day: far beyond any answer, and still a timeout every socket accepts.
MAX_TIMEOUT = 86400.0
DEFAULT_MAX_REQUESTS = 200
DEFAULT_CONCURRENCY = 2
REPETITION_THRESHOLD = 12

#: Where the key is looked for when ``--api-key`` is not given, in this order
#: (the variables vLLM's server and OpenAI's clients read).
API_KEY_VARIABLES = ("VLLM_API_KEY", "OPENAI_API_KEY")

_HOST_NAME = re.compile(r"[\w-]+(\.[\w-]+)*\.?")
_USER_INFO = re.compile(r"//[^/@]*@")


@dataclass(frozen=True)
class ProbeSettings:
    """A probe of one server. ``api_key`` is sent as is and never shown;
    ``json_path`` is where the caller writes the JSON report (``-``: stdout)."""

    base_url: str
    model: str | None = None
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    block_size: int = DEFAULT_BLOCK_SIZE
    chunk_size: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    decode_tokens: int = DEFAULT_DECODE_TOKENS
    timeout: float = DEFAULT_TIMEOUT
    max_requests: int = DEFAULT_MAX_REQUESTS
    concurrency: int = DEFAULT_CONCURRENCY
    vocab_size: int | None = None
    api_key: str | None = field(default=None, repr=False)
    json_path: str | None = None
    stats_dir: str | None = None
    long_prompts: bool = True
    progress: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "num_speculative_tokens": self.num_speculative_tokens,
            "block_size": self.block_size,
            "chunk_size": self.chunk_size,
            "max_tokens": self.max_tokens,
            "decode_tokens": self.decode_tokens,
            "timeout": self.timeout,
            "max_requests": self.max_requests,
            "concurrency": self.concurrency,
            "repetition_threshold": REPETITION_THRESHOLD,
            "long_prompts": self.long_prompts,
            "api_key_sent": bool(self.api_key),
        }


def api_key_from(option: str | None, environ: Mapping[str, str]) -> str | None:
    """``--api-key`` if given, else the first non-empty of ``API_KEY_VARIABLES``."""
    found = (environ.get(name, "").strip() for name in API_KEY_VARIABLES)
    return option or next((value for value in found if value), None)


def normalize_base_url(url: str) -> str:
    return url.strip().rstrip("/").removesuffix("/v1")


def parse_base_url(url: str) -> str:
    """The normalized base URL; a ``ProbeError`` says in one sentence what is wrong."""
    # Credentials typed into the URL are not echoed back.
    shown = _USER_INFO.sub("//...@", url)

    def invalid(reason: str) -> Exception:
        sentence = f"The base URL {shown!r} is not valid: {reason} (--base-url)."
        return bad_argument(sentence)

    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        if "IPv6" in str(error):
            raise invalid("its IPv6 address has no closing ']'") from None
        raise invalid("the port must be a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https"):
        raise invalid("it must start with http:// or https://")
    host = parts.hostname
    if not host:
        raise invalid("it names no host")
    if port == 0:
        raise invalid("the port must be a number from 1 to 65535")
    if parts.username is not None or parts.password is not None:
        raise invalid("credentials do not belong in it; set VLLM_API_KEY instead")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if _HOST_NAME.fullmatch(host) is None:
            raise invalid(f"{host!r} is not a host name or an IP address") from None
    if parts.query or parts.fragment:
        raise invalid("it must not carry a query or a fragment")
    return normalize_base_url(url)


def check_numbers(settings: ProbeSettings) -> None:
    """Raise a ``ProbeError`` naming the first number out of range."""
    at_least: dict[str, tuple[int | None, int]] = {
        "--num-speculative-tokens": (settings.num_speculative_tokens, 1),
        "--block-size": (settings.block_size, 1),
        "--chunk-size": (settings.chunk_size, 1),
        "--max-tokens": (settings.max_tokens, 1),
        "--decode-tokens": (settings.decode_tokens, 1),
        "--max-requests": (settings.max_requests, 1),
        "--concurrency": (settings.concurrency, 2),
        "--vocab-size": (settings.vocab_size, 1),
    }
    for option, (value, minimum) in at_least.items():
        if value is not None and value < minimum:
            raise bad_argument(f"{option} must be at least {minimum}, not {value}.")
    timeout = settings.timeout
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise bad_argument(
            f"--timeout must be a number of seconds above 0 and at most "
            f"{MAX_TIMEOUT:g}, not {timeout:g}."
        )


def check_report_path(path: str) -> None:
    """Raise a ``ProbeError`` now if the JSON report could not be written there."""
    if path == "-":
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        reason = "it is a directory"
    elif not folder.is_dir():
        reason = f"the directory {str(folder)!r} does not exist"
    elif target.exists() and not os.access(target, os.W_OK):
        reason = "the file is not writable"
    elif not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        reason = f"the directory {str(folder)!r} is not writable"
    else:
        return
    raise bad_argument(f"Cannot write the JSON report to {path}: {reason} (--json).")


def read_dispatch_stats(directory: str) -> dict[str, Any]:
    """The summed statistics the server's processes wrote, or a ``ProbeError``."""
    # The plugin's statistics module loads only when a directory is given.
    from vllm_graphsafe.counts import StatsDirError, read_stats_dir

    try:
        return read_stats_dir(directory)
    except StatsDirError as error:
        raise bad_argument(str(error)) from None
    except (AttributeError, KeyError, TypeError, ValueError):
        raise bad_argument(
            f"The statistics directory {directory} holds JSON files that are not "
            f"the plugin's statistics (--stats-dir)."
        ) from None


def check_settings(settings: ProbeSettings) -> str:
    """The normalized base URL; a ``ProbeError`` before any request otherwise.
    The statistics are read again after the requests, so that they count those."""
    base_url = parse_base_url(settings.base_url)
    check_numbers(settings)
    if settings.json_path:
        check_report_path(settings.json_path)
    if settings.stats_dir:
        read_dispatch_stats(settings.stats_dir)
    return base_url
