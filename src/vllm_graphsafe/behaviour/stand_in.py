"""What a fake runner does not provide: a value that absorbs every use.

A fake sets what the judgement is about and nothing else; everything else a
vLLM method touches (a logger, an environment flag, a config) is a
:class:`StandIn`. Code that goes down an unusual branch because of it either
still answers the judgement's question, or fails, and a failure sends the
judgement back to reading the code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class StandIn:
    """Stands in for ``name``: false, zero, empty, and absorbs every use."""

    def __init__(self, name: str = "?") -> None:
        object.__setattr__(self, "_stand_in_name", name)

    def __repr__(self) -> str:
        return f"<stand-in for {object.__getattribute__(self, '_stand_in_name')}>"

    def _child(self, suffix: str) -> StandIn:
        return StandIn(object.__getattribute__(self, "_stand_in_name") + suffix)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._child(f".{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> StandIn:
        return self._child("()")

    def __getitem__(self, key: Any) -> StandIn:
        return self._child("[]")

    def _nothing(self, *args: Any) -> None:
        return None

    __setitem__ = __delitem__ = __exit__ = _nothing

    def _false(self, *other: Any) -> bool:
        return False

    __bool__ = __contains__ = __lt__ = __le__ = __gt__ = __ge__ = _false

    def _zero(self) -> int:
        return 0

    __len__ = __int__ = __index__ = _zero

    def __float__(self) -> float:
        return 0.0

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __enter__(self) -> StandIn:
        return self

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def _absorb(self, *other: Any) -> StandIn:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _absorb
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _absorb
    __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = _absorb
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _absorb
    __invert__ = __abs__ = _absorb
