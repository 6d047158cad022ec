"""vLLM's live classes, run on fakes: the installed release's own code.

:func:`live_instance` makes an object of a subclass of a live vLLM class whose
methods are vLLM's own functions, each copied with its module's globals and
the names in ``overrides`` replaced (a fake collective, say); any attribute
not in ``state`` is a :class:`~.stand_in.StandIn`. Nothing of vLLM is changed.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Mapping
from typing import Any

from vllm_graphsafe.behaviour.stand_in import StandIn


def _with_globals(
    function: Any, overrides: Mapping[str, Any], cache: dict[int, Any]
) -> Any:
    if not isinstance(function, types.FunctionType):
        return function
    module_globals = function.__globals__
    if not overrides.keys() & module_globals.keys():
        return function
    key = id(module_globals)
    if key not in cache:
        cache[key] = {**module_globals, **overrides}
    copied = types.FunctionType(
        function.__code__,
        cache[key],
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copied.__kwdefaults__ = function.__kwdefaults__
    copied.__qualname__ = function.__qualname__
    return copied


def _rebound(
    attribute: Any, overrides: Mapping[str, Any], cache: dict[int, Any]
) -> Any:
    if isinstance(attribute, staticmethod | classmethod):
        return type(attribute)(_with_globals(attribute.__func__, overrides, cache))
    if isinstance(attribute, property):
        return property(
            _with_globals(attribute.fget, overrides, cache),
            _with_globals(attribute.fset, overrides, cache),
        )
    return _with_globals(attribute, overrides, cache)


def live_instance(
    cls: type, state: Mapping[str, Any], overrides: Mapping[str, Any]
) -> Any:
    cache: dict[int, Any] = {}
    namespace: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, attribute in vars(klass).items():
            if name.startswith("__") and name.endswith("__"):
                continue
            namespace[name] = _rebound(attribute, overrides, cache)

    def __getattr__(instance: Any, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        return StandIn(f"{cls.__name__}.{attribute}")

    namespace["__getattr__"] = __getattr__
    namespace["__module__"] = cls.__module__
    obj: Any = object.__new__(type(cls.__name__, (cls,), namespace))
    obj.__dict__.update(state)
    return obj


def live_runner(
    cls: type, overrides: Mapping[str, Any]
) -> tuple[Callable[[Mapping[str, Any]], Any], Any, Any]:
    """How a fix's cases make a :func:`live_instance` of ``cls``, and the
    ``CUDAGraphMode`` and ``BatchDescriptor`` its module binds."""
    names = vars(importlib.import_module(cls.__module__))
    return (
        lambda state: live_instance(cls, state, overrides),
        names.get("CUDAGraphMode"),
        names.get("BatchDescriptor"),
    )
