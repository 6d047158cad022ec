"""How a fix hooks vLLM at each of its points: :class:`WrapHook` (a wrapt
``FunctionWrapper``) off the per-step path, :class:`ReplaceHook` on it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt

#: ``on_failure(error, reading)``: a hook's own code failed while reading ``reading``.
OnFailure = Callable[[BaseException, str], None]
#: ``wrapper(wrapped, instance, args, kwargs, on_failure)`` of a :class:`WrapHook`.
Wrapper = Callable[..., Any]
#: ``factory(original, on_failure) -> replacement`` of a :class:`ReplaceHook`.
Factory = Callable[[Any, OnFailure], Any]

#: Set on a replacement: True, and what it replaced.
REPLACEMENT_MARK = "__graphsafe_patch__"
ORIGINAL_MARK = "__graphsafe_original__"


def is_hooked(value: Any) -> bool:
    return isinstance(value, wrapt.FunctionWrapper) or hasattr(value, REPLACEMENT_MARK)


def original_of(value: Any) -> Any:
    while is_hooked(value):
        if isinstance(value, wrapt.FunctionWrapper):
            value = value.__wrapped__
        else:
            value = getattr(value, ORIGINAL_MARK)
    return value


def unhooked(cls: type) -> type:
    """``cls`` as vLLM defines it: a subclass with every hook on it or its bases
    replaced by what it replaced (``cls`` where there is none)."""
    originals = {
        name: original_of(value)
        for klass in reversed(cls.__mro__)
        for name, value in vars(klass).items()
        if is_hooked(value)
    }
    if not originals:
        return cls
    return type(cls.__name__, (cls,), {"__module__": cls.__module__, **originals})


@dataclass(frozen=True)
class _Located:
    module: str
    qualname: str

    @property
    def symbol(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True)
class WrapHook(_Located):
    wrapper: Wrapper

    def install(self, owner: Any, attribute: str, on_failure: OnFailure) -> Any:
        wrapper = functools.partial(self.wrapper, on_failure=on_failure)
        return wrapt.wrap_function_wrapper(owner, attribute, wrapper)


@dataclass(frozen=True)
class ReplaceHook(_Located):
    """The factory runs before anything is replaced, so one that raises (a
    signature it does not support) leaves ``owner`` untouched. A replacement is
    never stacked on another patch's (a subclass inherits its base's)."""

    factory: Factory

    def install(self, owner: Any, attribute: str, on_failure: OnFailure) -> Any:
        current = (
            vars(owner).get(attribute)
            if isinstance(owner, type)
            else getattr(owner, attribute, None)
        )
        if is_hooked(getattr(owner, attribute, None)) or is_hooked(current):
            raise ValueError(f"{self.symbol} already carries a patch's hook")
        original = current if current is not None else getattr(owner, attribute)
        replacement = self.factory(original, on_failure)
        setattr(replacement, REPLACEMENT_MARK, True)
        setattr(replacement, ORIGINAL_MARK, original)
        setattr(owner, attribute, replacement)
        return replacement


HookPoint = WrapHook | ReplaceHook
