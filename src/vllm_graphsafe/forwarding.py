"""Per-step method wrappers generated with the method's own parameters, as
``dataclasses`` generates ``__init__``: ``(self, *args, **kwargs)`` costs about
0.4 µs per step (bench/dispatch_cost.py), a sixth of the MRV2 per-step budget.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import linecache
from collections.abc import Callable
from typing import Any

from vllm_graphsafe.hook_points import OnFailure

_PREFIX = "_graphsafe_"
_FORWARDABLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)

_SERIAL = itertools.count()


def _report_nothing(error: BaseException, reading: str) -> None:
    raise error


def publishing_method(
    method: Callable[..., Any],
    published: tuple[str, ...],
    publish: Callable[[tuple[Any, ...]], Any],
    withdraw: Callable[[Any], Any],
    on_failure: OnFailure = _report_nothing,
) -> Callable[..., Any] | None:
    """``method`` wrapped to ``publish`` the values of ``published`` around each
    call (``on_failure`` told, ``method`` run unpublished, should it raise) and
    ``withdraw`` what it returned. ``None`` for positional-only or variadic
    parameters, or without one of ``published``."""
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return None
    names = [parameter.name for parameter in parameters]
    if (
        any(parameter.kind not in _FORWARDABLE for parameter in parameters)
        or any(name.startswith(_PREFIX) for name in names)
        or not set(published) <= set(names)
    ):
        return None

    namespace: dict[str, Any] = {
        f"{_PREFIX}method": method,
        f"{_PREFIX}publish": publish,
        f"{_PREFIX}withdraw": withdraw,
        f"{_PREFIX}on_failure": on_failure,
    }
    declared: list[str] = []
    forwarded: list[str] = []
    for parameter in parameters:
        keyword_only = parameter.kind is parameter.KEYWORD_ONLY
        if keyword_only and "*" not in declared:
            declared.append("*")
        if parameter.default is parameter.empty:
            declared.append(parameter.name)
        else:
            default = f"{_PREFIX}default_{len(namespace)}"
            namespace[default] = parameter.default
            declared.append(f"{parameter.name}={default}")
        forwarded.append(
            f"{parameter.name}={parameter.name}" if keyword_only else parameter.name
        )
    call = f"{_PREFIX}method({', '.join(forwarded)})"
    source = (
        f"def {_PREFIX}publishing({', '.join(declared)}):\n"
        "    try:\n"
        f"        {_PREFIX}token = {_PREFIX}publish(({', '.join(published)},))\n"
        f"    except Exception as {_PREFIX}error:\n"
        f"        {_PREFIX}on_failure({_PREFIX}error, {', '.join(published)!r})\n"
        f"        return {call}\n"
        "    try:\n"
        f"        return {call}\n"
        "    finally:\n"
        f"        {_PREFIX}withdraw({_PREFIX}token)\n"
    )
    qualname = getattr(method, "__qualname__", "method")
    filename = f"<vllm-graphsafe publisher #{next(_SERIAL)}: {qualname}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec"), namespace)
    return functools.wraps(method)(namespace[f"{_PREFIX}publishing"])
