"""A process's counters in a shared file mapping, on disk the moment they change.

``<pid>.counts``, mapped ``MAP_SHARED`` beside ``<pid>.json``: a store into it
is in the kernel's page cache at once and outlives the process, even the SIGKILL
vLLM 0.32 sends its engine processes (docs/architecture.md, "How the counts
reach /metrics"). One page, native byte order: ``MAGIC``; at ``LAYOUT_AT`` a
4-byte length and the JSON list of ``[patch, event]`` names, one per slot, which
only grows; at ``VALUES_AT`` one 8-byte count per slot.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from pathlib import Path

from vllm_graphsafe.private_files import create_private_file

MAGIC = b"graphsafe-counts-1\n\0"
LAYOUT_AT = 32
VALUES_AT = 2048
PAGE_SIZE = 4096
SLOTS = (PAGE_SIZE - VALUES_AT) // 8
SUFFIX = ".counts"
_LENGTH = struct.Struct("=I")


def page_name(pid: int) -> str:
    return f"{pid}{SUFFIX}"


class CountsPage:
    """``<pid>.counts`` in one directory, mapped into this process."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._mapping = mapping
        #: The counts by slot; a store here is the whole cost of counting.
        self.values = memoryview(mapping)[VALUES_AT:PAGE_SIZE].cast("Q")
        self._names: list[list[str]] = []

    @classmethod
    def create(cls, directory: Path, pid: int) -> CountsPage:
        """Map a fresh, zeroed page at ``directory/<pid>.counts``, a private file."""

        def map_page(fd: int) -> mmap.mmap:
            os.ftruncate(fd, PAGE_SIZE)
            mapping = mmap.mmap(fd, PAGE_SIZE, mmap.MAP_SHARED)
            mapping[: len(MAGIC)] = MAGIC
            return mapping

        return cls(create_private_file(directory, page_name(pid), map_page))

    def add_slot(self, patch_id: str, event: str) -> int | None:
        """The slot for a new name, or None when the page is full."""
        names = [*self._names, [patch_id, event]]
        layout = json.dumps(names, separators=(",", ":")).encode()
        if len(names) > SLOTS or LAYOUT_AT + 4 + len(layout) > VALUES_AT:
            return None
        start = LAYOUT_AT + 4
        self._mapping[start : start + len(layout)] = layout
        self._mapping[LAYOUT_AT:start] = _LENGTH.pack(len(layout))
        self._names = names
        return len(names) - 1

    def close(self) -> None:
        """Unmap this process's view, where no thread can be storing (a forked
        child's copy); the file and its counts stay."""
        self.values.release()
        self._mapping.close()


def read_counts_page(path: Path) -> dict[str, dict[str, int]] | None:
    """The counts stored in the page at ``path``; None when it is absent or not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.read(fd, PAGE_SIZE)
        finally:
            os.close(fd)
    except OSError:
        return None
    return parse_counts_page(data)


def parse_counts_page(data: bytes) -> dict[str, dict[str, int]] | None:
    if len(data) != PAGE_SIZE or not data.startswith(MAGIC):
        return None
    (length,) = _LENGTH.unpack_from(data, LAYOUT_AT)
    start = LAYOUT_AT + 4
    if start + length > VALUES_AT:
        return None
    try:
        names = json.loads(data[start : start + length] or b"[]")
    except ValueError:  # being written: the record's counts stand alone
        return None
    if not isinstance(names, list) or not all(
        isinstance(name, list)
        and len(name) == 2
        and all(isinstance(part, str) for part in name)
        for name in names
    ):
        return None
    values = memoryview(data)[VALUES_AT:PAGE_SIZE].cast("Q")
    counts: dict[str, dict[str, int]] = {}
    for slot, (patch_id, event) in enumerate(names):
        counts.setdefault(patch_id, {})[event] = int(values[slot])
    return counts


def merged_counts(
    recorded: Mapping[str, Mapping[str, int]],
    stored: Mapping[str, Mapping[str, int]] | None,
) -> dict[str, dict[str, int]]:
    """The record's counts, raised to what the page holds (counts only grow)."""
    merged = {patch: dict(events) for patch, events in recorded.items()}
    for patch, events in (stored or {}).items():
        for event, value in events.items():
            if value:
                mine = merged.setdefault(patch, {})
                mine[event] = max(mine.get(event, 0), value)
    return merged
