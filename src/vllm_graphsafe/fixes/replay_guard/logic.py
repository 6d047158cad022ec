"""Which KV-cache groups of a step's attention metadata hold a prefill row.

Every layer of an attention group shares one metadata object; builders that run
prefill rows differently count them in a host integer (``num_prefills``, no GPU
synchronisation), others (FlashAttention's varlen, CPU attention) are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

AttentionMetadata = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


def counting_layers(per_layer: Mapping[str, Any]) -> tuple[str, ...]:
    """One layer name per distinct metadata object with an int ``num_prefills``."""
    seen: set[int] = set()
    layers: list[str] = []
    for name, metadata in per_layer.items():
        if id(metadata) in seen:
            continue
        seen.add(id(metadata))
        if type(getattr(metadata, "num_prefills", None)) is int:
            layers.append(name)
    return tuple(layers)


class GroupPrefills:
    def __init__(self) -> None:
        self._layers: tuple[str, ...] = ()
        #: The size of the mapping the layers were learned from (-1: none yet).
        self._size = -1

    def holds_prefill(self, metadata: AttentionMetadata) -> bool:
        if type(metadata) is dict:
            return self._in(metadata)
        if metadata is None:
            return False
        if isinstance(metadata, Mapping):
            return self._in(metadata)
        return any(self._in(per_layer) for per_layer in metadata)

    def _in(self, per_layer: Mapping[str, Any]) -> bool:
        if len(per_layer) != self._size:
            self._learn(per_layer)
        try:
            for name in self._layers:
                if per_layer[name].num_prefills:
                    return True
        except (KeyError, AttributeError):
            # Other layers than the ones learned (another model's metadata of
            # the same size): learn this mapping's and read again.
            self._learn(per_layer)
            return any(per_layer[name].num_prefills for name in self._layers)
        return False

    def _learn(self, per_layer: Mapping[str, Any]) -> None:
        self._layers = counting_layers(per_layer)
        self._size = len(per_layer)

    def prefill_counts(self, metadata: AttentionMetadata) -> dict[str, int]:
        """For the warning: each counting group's prefill rows, by its first layer."""
        if metadata is None:
            return {}
        mappings = [metadata] if isinstance(metadata, Mapping) else list(metadata)
        found: dict[str, int] = {}
        for per_layer in mappings:
            for name in counting_layers(per_layer):
                prefills = per_layer[name].num_prefills
                if prefills:
                    found[name] = found.get(name, 0) + int(prefills)
        return found


def describe_step(
    num_tokens: int | None, num_reqs: int | None, prefills: Mapping[str, int]
) -> str:
    groups = ", ".join(f"{layer}: {count}" for layer, count in prefills.items())
    return (
        f"num_tokens={num_tokens}, num_reqs={num_reqs}, prefill rows per "
        f"KV-cache group, named by its first layer: {groups or 'none'}"
    )
