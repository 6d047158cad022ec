"""Files only this user can read, created without ever following a link.

Every file is first created at an unpredictable temporary name, exclusively
and without following a link (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600), then
renamed over its final name only when that name is absent or one of this
user's regular files. A link planted at either name is neither followed nor
replaced.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

#: Temporary names tried before giving up (each is 16 random hex digits).
_NAME_TRIES = 4

Filled = TypeVar("Filled")


class UnsafeTargetError(OSError):
    """A file's name is taken by something that is not our regular file."""


def temporary_name(pid: int) -> str:
    return f".{pid}.{secrets.token_hex(8)}.tmp"


@contextlib.contextmanager
def _opened_directory(directory: str | os.PathLike[str]) -> Iterator[int]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def check_replaceable(directory_fd: int, name: str) -> None:
    """Raise :class:`UnsafeTargetError` unless ``name`` is absent or ours, regular."""
    try:
        info = os.lstat(name, dir_fd=directory_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        raise UnsafeTargetError(
            f"{name} is a link or another user's file; it is left as it is"
        )


def replace_staged(directory_fd: int, staging: str, name: str) -> None:
    """Rename ``staging`` over ``name`` where that is safe; else remove it and raise."""
    try:
        check_replaceable(directory_fd, name)
        os.replace(staging, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging, dir_fd=directory_fd)
        raise


def create_private_file(
    directory: str | os.PathLike[str], name: str, fill: Callable[[int], Filled]
) -> Filled:
    """Create ``directory/name`` (mode 0600) with what ``fill(fd)`` puts in the
    open, empty file; ``fill``'s result is returned once the file is in place."""
    with _opened_directory(directory) as directory_fd:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(_NAME_TRIES):
            staging = temporary_name(os.getpid())
            try:
                fd = os.open(staging, flags, 0o600, dir_fd=directory_fd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name in {directory}")
        try:
            filled = fill(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staging, dir_fd=directory_fd)
            raise
        finally:
            os.close(fd)
        replace_staged(directory_fd, staging, name)
    return filled


def write_private_file(
    directory: str | os.PathLike[str], name: str, data: bytes
) -> None:
    """Put ``data`` at ``directory/name`` with mode 0600, never through a link."""

    def write(fd: int) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    create_private_file(directory, name, write)


def link_private_file(source: Path, directory: Path, name: str) -> None:
    """Make ``directory/name`` a hard link to ``source/name``, never through a link."""
    with (
        _opened_directory(source) as source_fd,
        _opened_directory(directory) as directory_fd,
    ):
        staging = temporary_name(os.getpid())
        os.link(
            name,
            staging,
            src_dir_fd=source_fd,
            dst_dir_fd=directory_fd,
            follow_symlinks=False,
        )
        replace_staged(directory_fd, staging, name)


def remove_private_file(directory: Path, name: str) -> None:
    """Unlink ``directory/name`` where it is a regular file of ours."""
    with contextlib.suppress(OSError), _opened_directory(directory) as directory_fd:
        check_replaceable(directory_fd, name)
        os.unlink(name, dir_fd=directory_fd)


def make_private_directory(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def writable_by_others(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def is_private_directory(path: Path) -> bool:
    """A real directory of this user that nobody else can enter."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & 0o077
    )
