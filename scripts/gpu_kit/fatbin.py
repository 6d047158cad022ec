"""Cut the CUDA fat binaries of a compiled extension down to one GPU architecture.

A CUDA extension keeps its GPU code in the ELF section ``.nv_fatbin``: fat-binary
containers laid back to back, each a 16-byte header (magic, version, header size,
size of what follows) and entries, each an entry header (kind: 1 PTX, 2 ELF
cubin; the architecture at byte 28; its own header size) and a payload. The host
code registers each container by its address, so a container may shrink but not
move: each keeps its offset, its cubins for the wanted architecture move to its
front, its size field says so, and the bytes freed are zeroed (an archive
compresses them to nothing). A container with no cubin for that architecture
gets the section's smallest cubin of another architecture in their place: the
CUDA runtime then reports "no kernel image" if, and only if, one of its kernels
is launched, as for any extension built without that architecture (the kernels
lost so are the ones built only for other GPUs, or as PTX alone, such as
Marlin's quantized matrix products: none runs in an unquantized model). PTX is
dropped everywhere.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

SECTION = ".nv_fatbin"
CONTAINER_MAGIC = 0xBA55ED50
CONTAINER_HEADER = struct.Struct("<IHHQ")
ENTRY_HEADER = struct.Struct("<HHIQ")
ENTRY_ARCH = struct.Struct("<I")
ENTRY_ARCH_OFFSET = 28
KIND_PTX, KIND_ELF = 1, 2
CONTAINER_ALIGNMENT = 8


class FatbinError(ValueError):
    """A section that is not a sequence of fat-binary containers; one sentence."""


class Entry(NamedTuple):
    kind: int
    arch: int
    start: int
    end: int


class Container(NamedTuple):
    start: int
    header_size: int
    end: int
    entries: tuple[Entry, ...]


class CutSummary(NamedTuple):
    containers: int
    kept: int
    dropped: int
    fallbacks: int
    bytes_before: int
    bytes_after: int


def _entries(section: bytes, start: int, end: int) -> Iterator[Entry]:
    position = start
    while position < end:
        if position + ENTRY_ARCH_OFFSET + ENTRY_ARCH.size > end:
            raise FatbinError(f"a fat-binary entry at byte {position} is truncated")
        kind, _version, header_size, payload = ENTRY_HEADER.unpack_from(
            section, position
        )
        (arch,) = ENTRY_ARCH.unpack_from(section, position + ENTRY_ARCH_OFFSET)
        entry_end = position + header_size + payload
        if header_size < ENTRY_ARCH_OFFSET + ENTRY_ARCH.size or entry_end > end:
            raise FatbinError(f"a fat-binary entry at byte {position} overruns")
        yield Entry(kind, arch, position, entry_end)
        position = entry_end


def containers(section: bytes) -> list[Container]:
    """The containers of a ``.nv_fatbin`` section, in order."""
    found = []
    position = 0
    while position < len(section):
        if position + CONTAINER_HEADER.size > len(section):
            raise FatbinError(f"a fat-binary container at byte {position} is truncated")
        magic, _version, header_size, size = CONTAINER_HEADER.unpack_from(
            section, position
        )
        if magic != CONTAINER_MAGIC:
            raise FatbinError(f"no fat-binary container at byte {position}")
        body = position + header_size
        end = body + size
        if end > len(section):
            raise FatbinError(f"the fat-binary container at byte {position} overruns")
        found.append(
            Container(position, header_size, end, tuple(_entries(section, body, end)))
        )
        position = _next_container(section, end)
    return found


def _next_container(section: bytes, end: int) -> int:
    """Where the next container starts: the next aligned magic past zero padding."""
    position = -(-end // CONTAINER_ALIGNMENT) * CONTAINER_ALIGNMENT
    while position < len(section) and not any(
        section[position : position + CONTAINER_ALIGNMENT]
    ):
        position += CONTAINER_ALIGNMENT
    if any(section[end:position]):
        raise FatbinError(f"unexpected bytes between containers at byte {end}")
    return position


def smallest_foreign_cubin(parsed: list[Container], arch: int) -> Entry | None:
    """The section's smallest cubin for an architecture other than ``arch``."""
    foreign = [
        e for c in parsed for e in c.entries if e.kind == KIND_ELF and e.arch != arch
    ]
    return min(foreign, key=lambda e: e.end - e.start, default=None)


def cut_section(section: bytes, arch: int) -> tuple[bytes, CutSummary]:
    """``section`` with only ``arch``'s cubins in each container (same length)."""
    out = bytearray(len(section))
    kept_total = dropped = fallbacks = after = 0
    parsed = containers(section)
    stand_in = smallest_foreign_cubin(parsed, arch)
    for container in parsed:
        kept = tuple(
            e for e in container.entries if e.kind == KIND_ELF and e.arch == arch
        )
        fell_back = not kept and stand_in is not None
        if fell_back:
            assert stand_in is not None
            kept = (stand_in,)
        body = b"".join(section[e.start : e.end] for e in kept)
        magic, version, header_size, _size = CONTAINER_HEADER.unpack_from(
            section, container.start
        )
        out[container.start : container.start + header_size] = section[
            container.start : container.start + header_size
        ]
        CONTAINER_HEADER.pack_into(
            out, container.start, magic, version, header_size, len(body)
        )
        body_start = container.start + header_size
        out[body_start : body_start + len(body)] = body
        kept_total += len(kept)
        dropped += len(container.entries) - len(kept)
        fallbacks += fell_back
        after += header_size + len(body)
    summary = CutSummary(
        len(parsed), kept_total, dropped, fallbacks, len(section), after
    )
    return bytes(out), summary


def section_span(path: Path) -> tuple[int, int] | None:
    """The file offset and size of ``path``'s ``.nv_fatbin``; None if it has none."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as file:
            section = ELFFile(file).get_section_by_name(SECTION)
            if section is None:
                return None
            return int(section["sh_offset"]), int(section["sh_size"])
    except ELFError as error:
        raise FatbinError(
            f"{path.name} is not an ELF shared object ({error})"
        ) from None


def cut_file(path: Path, arch: int) -> CutSummary | None:
    """Cut ``path``'s fat binaries to ``arch`` in place; None if it holds none."""
    span = section_span(path)
    if span is None:
        return None
    offset, size = span
    with path.open("r+b") as file:
        file.seek(offset)
        section = file.read(size)
        cut, summary = cut_section(section, arch)
        file.seek(offset)
        file.write(cut)
    return summary


def architectures(section: bytes) -> dict[str, int]:
    """How many entries of each kind and architecture (``elf90``, ``ptx80``)."""
    tally: dict[str, int] = {}
    for container in containers(section):
        for entry in container.entries:
            name = ("ptx" if entry.kind == KIND_PTX else "elf") + str(entry.arch)
            tally[name] = tally.get(name, 0) + 1
    return tally
