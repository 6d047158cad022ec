"""Per-process dispatch decision counters, readable from outside the process.

A count is one cell's increment; once a directory is configured it is also
stored in the process's counts page there, and a thread writes its record.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from vllm_graphsafe.counts.page import CountsPage, page_name
from vllm_graphsafe.counts.records import process_record, write_record
from vllm_graphsafe.counts.writer import RecordWriter, install_exit_hooks
from vllm_graphsafe.private_files import link_private_file, remove_private_file

#: A cell's slot before any page holds its name, and where none has room.
UNASSIGNED = -1
NO_ROOM = -2


class DispatchStats:
    def __init__(self) -> None:
        #: Per patch, per event, one cell: ``[count, slot in the pages]`` (slot
        #: ``UNASSIGNED`` until a page holds the name, ``NO_ROOM`` where none can).
        #: A count reads one cell, and stores into the first page directly.
        self._cells: dict[str, dict[str, list[int]]] = defaultdict(dict)
        #: Returns this process's patch states, written beside the counters.
        self.describe_patches: Callable[[], dict[str, str]] = dict
        #: Returns the ids of the patches whose wrappers are in place here.
        self.wrapped_patches: Callable[[], list[str]] = list
        self._directories: list[Path] = []
        self._write_lock = threading.RLock()
        self._writer = self._new_writer()
        self._last_written: dict[Path, bytes] = {}
        self._exit_hooks_installed = False
        self.on_write_error: Callable[[Path, OSError], None] = lambda *_: None
        self._pages: list[CountsPage] = []
        self._page_in: dict[Path, CountsPage] = {}
        #: The first page's counts (None: no page), and the other pages', as
        #: 8-byte integers by slot. Mutated in place only: counters hold them.
        self._first_values: list[memoryview | None] = [None]
        self._more_values: list[memoryview] = []
        #: Each event's slot in every page, by patch; -1 where the pages are full.
        self._slots: dict[str, dict[str, int]] = defaultdict(dict)
        self._page_lock = threading.Lock()

    def _new_writer(self) -> RecordWriter:
        return RecordWriter(
            functools.partial(self.flush, only_if_changed=True), self.total
        )

    def count(self, patch_id: str, event: str) -> None:
        self.counter(patch_id)(event)

    def counter(self, patch_id: str) -> Callable[[str], None]:
        """``count`` bound to one patch, for the per-step path."""
        cells = self._cells[patch_id]
        first_values = self._first_values
        more_values = self._more_values
        new_cell = functools.partial(self._new_cell, patch_id)
        page_slot = functools.partial(self._page_slot, patch_id)

        def count(event: str) -> None:
            try:
                cell = cells[event]
            except KeyError:
                cell = new_cell(event)
            value = cell[0] + 1
            cell[0] = value
            values = first_values[0]
            if values is not None:
                slot = cell[1]
                if slot < 0:
                    slot = page_slot(event, cell)
                    if slot < 0:
                        return
                values[slot] = value
                if more_values:
                    for other in more_values:
                        other[slot] = value

        return count

    def _new_cell(self, patch_id: str, event: str) -> list[int]:
        cells = self._cells[patch_id]
        with self._page_lock:
            cell = cells.get(event)
            if cell is None:
                cell = [0, self._slots[patch_id].get(event, UNASSIGNED)]
                cells[event] = cell
            return cell

    def _page_slot(self, patch_id: str, event: str, cell: list[int]) -> int:
        """The name's slot in the pages (``NO_ROOM``: none), assigned now."""
        if cell[1] != UNASSIGNED:
            return cell[1]
        with self._page_lock:
            slot = self._slots[patch_id].get(event)
            if slot is None:
                added = {page.add_slot(patch_id, event) for page in self._pages}
                slot = added.pop() if len(added) == 1 else None
                slot = NO_ROOM if slot is None else slot
                self._slots[patch_id][event] = slot
        cell[1] = slot
        return slot

    def _store_all(self) -> None:
        """Put every in-memory count into every page."""
        for patch_id, cells in list(self._cells.items()):
            for event, cell in list(cells.items()):
                slot = self._page_slot(patch_id, event, cell)
                if slot >= 0:
                    for page in self._pages:
                        page.values[slot] = cell[0]

    def _link_values(self) -> None:
        """Point the per-step path at the pages as they are now."""
        self._more_values[:] = [page.values for page in self._pages[1:]]
        self._first_values[0] = self._pages[0].values if self._pages else None

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Every count made since the last reset, by patch and event."""
        return {
            patch: {event: cell[0] for event, cell in list(cells.items())}
            for patch, cells in list(self._cells.items())
            if cells
        }

    def total(self) -> int:
        return sum(
            cell[0]
            for cells in list(self._cells.values())
            for cell in list(cells.values())
        )

    def reset(self) -> None:
        # Counters handed out by counter() keep their dictionaries.
        for cells in self._cells.values():
            cells.clear()
        for slots in self._slots.values():
            for slot in slots.values():
                if slot >= 0:
                    for page in self._pages:
                        page.values[slot] = 0

    @property
    def directories(self) -> list[Path]:
        return list(self._directories)

    @property
    def distinct_pages(self) -> int:
        """How many counts pages each count is stored into."""
        return len(self._pages)

    def configure(self, *directories: str | os.PathLike[str] | None) -> None:
        """Write this process's record into each directory from now on."""
        for directory in directories:
            if directory and Path(directory) not in self._directories:
                self._directories.append(Path(directory))
                self._map_page(Path(directory))
        if self._directories:
            self._start_writer()
            self._install_exit_hooks()

    def stop_writing(self, *directories: str | os.PathLike[str]) -> None:
        """Write nothing more into these directories, and remove this process's
        counts page there (its record stays). Returns once no write into them
        is under way, so that the caller may then remove them."""
        with self._write_lock:
            for directory in map(Path, directories):
                if directory in self._directories:
                    self._directories.remove(directory)
                    self._last_written.pop(directory, None)
                    self._drop_page(directory)

    def _map_page(self, directory: Path) -> None:
        """Add a counts page in ``directory``, holding every count made so far:
        a link to this process's first page where the file system allows."""
        with self._page_lock:
            pid = os.getpid()
            for linked_from, first in list(self._page_in.items())[:1]:
                try:
                    link_private_file(linked_from, directory, page_name(pid))
                except OSError:  # another file system among them
                    break
                self._page_in[directory] = first
                return
            try:
                page = CountsPage.create(directory, pid)
            except (OSError, ValueError):
                return  # the record still carries the counts
            named = sorted(
                (slot, patch_id, event)
                for patch_id, slots in self._slots.items()
                for event, slot in slots.items()
                if slot >= 0
            )
            for slot, patch_id, event in named:
                if page.add_slot(patch_id, event) != slot:
                    page.close()
                    return
            self._pages.append(page)
            self._page_in[directory] = page
        self._store_all()
        with self._page_lock:
            self._link_values()

    def _drop_page(self, directory: Path) -> None:
        """Stop storing into ``directory``'s page and remove it. The mapping is
        left to the garbage collector: the step thread may be storing into it."""
        with self._page_lock:
            page = self._page_in.pop(directory, None)
            if page is None:
                return
            if page not in self._page_in.values():  # no other name for it
                self._pages.remove(page)
                self._link_values()
        # Unlinked only where it is a regular file of ours.
        remove_private_file(directory, page_name(os.getpid()))

    def flush(self, *, only_if_changed: bool = False) -> None:
        """Write this process's record into every configured directory now."""
        with self._write_lock:
            if not self._directories:
                return
            record = process_record(
                self.describe_patches(), self.wrapped_patches(), self.snapshot()
            )
            key = json.dumps({**record, "written_at": 0}, sort_keys=True).encode()
            data = json.dumps(record, sort_keys=True).encode()
            for directory in list(self._directories):
                if only_if_changed and self._last_written.get(directory) == key:
                    continue
                try:
                    write_record(directory, os.getpid(), data)
                except OSError as error:
                    self._directories.remove(directory)
                    self._drop_page(directory)
                    self.on_write_error(directory, error)
                    continue
                self._last_written[directory] = key

    def announce(self, target: logging.Logger, message: str) -> None:
        self._writer.announce(target, message)

    def _start_writer(self) -> None:
        self._writer.start()

    def _install_exit_hooks(self) -> None:
        if self._exit_hooks_installed:
            return
        self._exit_hooks_installed = True
        install_exit_hooks(self.flush)

    def after_fork_in_child(self) -> None:
        """A forked child starts with no writer, directories or counts of its own."""
        self._writer = self._new_writer()
        self._write_lock = threading.RLock()
        self._directories = []
        self._last_written = {}
        self._exit_hooks_installed = False
        # The parent's mappings are shared: unmap them here, never store into them.
        pages = list(self._pages)
        self._pages.clear()
        self._link_values()
        for page in pages:
            with contextlib.suppress(BufferError, ValueError):
                page.close()
        self._page_in.clear()
        for slots in self._slots.values():
            slots.clear()
        self._page_lock = threading.Lock()
        for cells in self._cells.values():
            cells.clear()


STATS = DispatchStats()
os.register_at_fork(after_in_child=STATS.after_fork_in_child)
