"""Keeping the API key out of everything a probe returns.

A server may quote the key back (an error page that echoes the request's
headers), so every string of a probe's result is searched for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar, cast

REDACTED = "<api key>"

_Value = TypeVar("_Value")


def redact(value: _Value, secret: str | None) -> _Value:
    """``value`` with every occurrence of ``secret`` in its strings replaced.

    Strings are searched inside mappings, lists, tuples and dataclasses, to any
    depth; a redacted copy is returned and ``value`` is left as it was.
    """
    if not secret:
        return value
    return cast(_Value, _redacted(value, secret))


def _redacted(value: Any, secret: str) -> Any:
    if isinstance(value, str):
        return value.replace(secret, REDACTED)
    if isinstance(value, Mapping):
        return {key: _redacted(item, secret) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item, secret) for item in value]
    if isinstance(value, tuple):
        return tuple(_redacted(item, secret) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            field.name: _redacted(getattr(value, field.name), secret)
            for field in dataclasses.fields(value)
            if field.init
        }
        return dataclasses.replace(value, **changes)
    return value
