"""The GPU kit's fat-binary cutter, on sections laid out here byte by byte."""

from __future__ import annotations

import struct

import pytest

from tests.unit.gpu_kit.kit_modules import load

fatbin = load("fatbin")

MAGIC = 0xBA55ED50
PTX, ELF = 1, 2


def entry(kind: int, arch: int, payload: bytes, header_size: int = 64) -> bytes:
    """One fat-binary entry: kind, version, header size, payload size, the
    architecture at byte 28, then the payload."""
    header = bytearray(header_size)
    struct.pack_into("<HHIQ", header, 0, kind, 0x0101, header_size, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def test_a_container_keeps_its_offset_and_only_its_sm90_cubins_in_front() -> None:
    sm90 = entry(ELF, 90, b"\x90" * 24)
    sm90a = entry(ELF, 90, b"\x9a" * 8, header_size=112)
    first = container(
        entry(ELF, 80, b"\x80" * 40), sm90, entry(PTX, 90, b"p" * 16), sm90a
    )
    second = container(entry(ELF, 75, b"\x75" * 32), entry(ELF, 90, b"\x91" * 16))
    section = first + second

    cut, summary = fatbin.cut_section(section, 90)

    assert len(cut) == len(section)
    assert cut[: 16 + len(sm90) + len(sm90a)] == container(sm90, sm90a)
    assert not any(cut[16 + len(sm90) + len(sm90a) : len(first)])
    assert cut[len(first) : len(first) + 16 + 80] == container(
        entry(ELF, 90, b"\x91" * 16)
    )
    assert not any(cut[len(first) + 16 + 80 :])
    assert (summary.containers, summary.kept, summary.dropped, summary.fallbacks) == (
        2,
        3,
        3,
        0,
    )
    assert fatbin.architectures(cut) == {"elf90": 3}


def test_a_container_without_sm90_gets_the_smallest_foreign_cubin() -> None:
    small = entry(ELF, 75, b"s" * 8)
    marlin = container(entry(ELF, 80, b"m" * 64), entry(PTX, 80, b"p" * 64))
    section = marlin + container(small, entry(ELF, 90, b"k" * 16))

    cut, summary = fatbin.cut_section(section, 90)

    assert cut[: 16 + len(small)] == container(small)
    assert summary.fallbacks == 1
    assert fatbin.architectures(cut) == {"elf75": 1, "elf90": 1}


def test_zero_padding_between_containers_is_skipped() -> None:
    first = container(entry(ELF, 90, b"a" * 4))  # 84 bytes: padded to 88
    section = first + bytes(4) + container(entry(ELF, 90, b"b" * 8))

    assert [c.start for c in fatbin.containers(section)] == [0, 88]


@pytest.mark.parametrize(
    "section",
    [
        b"not a fat binary at all",
        container(entry(ELF, 90, b"x" * 8))[:-4],
        container(entry(ELF, 90, b"x" * 8)) + b"\x01" * 8,
    ],
    ids=["no magic", "truncated entry", "stray bytes after"],
)
def test_a_section_that_is_not_fat_binaries_is_refused(section: bytes) -> None:
    with pytest.raises(fatbin.FatbinError):
        fatbin.cut_section(section, 90)
