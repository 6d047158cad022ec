"""Per-process dispatch decision counters, readable from outside the process.

Each process counts its decisions in memory: ``count(event)`` is one dictionary
increment, nothing more, until a directory is configured (``GRAPHSAFE_STATS_DIR``
for doctor and probe, and the private directory behind ``/metrics``). From then
on each count is also stored in the process's counts page there (one memory
write into a shared file mapping, see :mod:`vllm_graphsafe.counts_page`), which
outlives even SIGKILL; a daemon thread writes the process's record (identity,
patch states, counts) within a second of a change, and once more when the
process ends (normal exit, SIGTERM or SIGINT, after which vLLM's own handler
runs as before). Readers take each count from the page where it is ahead.

A record identifies its process by pid, parent pid, role and DP rank, never by
its command line (which can hold an API key). Files are created with mode 0600
through an exclusively created temporary file; a symbolic link is never followed
nor replaced.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import multiprocessing
import multiprocessing.util
import os
import re
import secrets
import signal
import stat
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.counts_page import (
    CountsPage,
    link_page,
    merged_counts,
    page_beside,
    read_counts_page,
    remove_page,
    replace_staged,
)
from vllm_graphsafe.counts_page import UnsafeTargetError as UnsafeTargetError
from vllm_graphsafe.settings import read_settings

logger = logging.getLogger("vllm.graphsafe")

#: Steps that replay a uniform-decode graph under the phase rule.
UNIFORM_DECODE = "uniform_decode"
#: Steps whose shape alone would have picked the decode graph, kept off by phase.
KEPT_OFF_DECODE = "prefill_kept_off_decode_graph"
#: Dummy, capture and profile runs, classified by shape as vLLM asks.
DUMMY = "dummy"
#: Real steps with a non-uniform shape, which skip the request-state scan.
NON_UNIFORM = "non_uniform"
#: Dummy runs whose metadata the staging patch made consistent.
STAGED_DUMMY = "staged_dummy"

#: How often the writer thread looks for new counts. The counts pages already
#: hold every count (vLLM 0.32 SIGKILLs its engine core and workers on SIGTERM,
#: with no time to write): the record is for patch states and for readers of the
#: record alone, so a look every quarter second is enough. A look costs a few
#: microseconds; a write happens only when a count changed.
WRITE_INTERVAL_S = 0.25
#: How often it also compares the whole record (patch states change rarely).
FULL_CHECK_INTERVAL_S = 0.5

ROLE_API_SERVER = "api_server"
#: A process that loaded vLLM without serving it (a script, a test, a tool).
ROLE_MAIN = "main"
ROLE_ENGINE_CORE = "engine_core"
ROLE_WORKER = "worker"

_DP_RANK_IN_NAME = re.compile(r"_DP(\d+)")
_FILE_MODE = 0o600


class StatsDirError(ValueError):
    """A statistics directory that cannot be read; ``str()`` is one sentence."""


_SERVER_MODULES = vllm_layout.SERVER_MODULES


def process_role(process_name: str) -> str:
    """The vLLM role of a process, from the name vLLM gives its processes."""
    if process_name.startswith(("EngineCore", "DPEngineCore")):
        return ROLE_ENGINE_CORE
    if "Worker" in process_name:
        return ROLE_WORKER
    return ROLE_API_SERVER if serves_http() else ROLE_MAIN


def serves_http() -> bool:
    """Whether this process runs vLLM's OpenAI-compatible server."""
    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    return main_name in _SERVER_MODULES or any(
        name in sys.modules for name in _SERVER_MODULES
    )


def dp_rank_of(process_name: str) -> int | None:
    """The data-parallel rank in an engine core's name (``EngineCore_DP1``)."""
    match = _DP_RANK_IN_NAME.search(process_name)
    return int(match.group(1)) if match else None


def temporary_name(pid: int) -> str:
    """A hidden name nobody can predict, for the record being written."""
    return f".{pid}.{secrets.token_hex(8)}.tmp"


def write_private_file(
    directory: str | os.PathLike[str], name: str, data: bytes
) -> None:
    """Put ``data`` at ``directory/name`` with mode 0600, never through a link.

    The data goes to an exclusively created temporary file first (``O_EXCL``
    and ``O_NOFOLLOW``: a link planted at its name is refused, never written
    through), then is renamed over ``name`` only when ``name`` is absent or
    one of our regular files. Raises ``OSError`` otherwise.
    """
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(4):
            staging = temporary_name(os.getpid())
            try:
                fd = os.open(staging, flags, _FILE_MODE, dir_fd=directory_fd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name in {directory}")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staging, dir_fd=directory_fd)
            raise
        replace_staged(directory_fd, staging, name)
    finally:
        os.close(directory_fd)


def make_private_directory(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700 where absent."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def writable_by_others(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


class DispatchStats:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        #: Returns this process's patch states, written beside the counters.
        self.describe_patches: Callable[[], dict[str, str]] = dict
        #: Returns the ids of the patches whose wrappers are in place here.
        self.wrapped_patches: Callable[[], list[str]] = list
        self._directories: list[Path] = []
        self._write_lock = threading.RLock()
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._last_written: dict[Path, bytes] = {}
        self._exit_hooks_installed = False
        self.on_write_error: Callable[[Path, OSError], None] = _ignore_write_error
        self._pending_announcement: tuple[logging.Logger, str] | None = None
        #: These three are mutated in place only: counters handed out hold them.
        self._pages: list[CountsPage] = []
        self._page_in: dict[Path, CountsPage] = {}
        #: Each page's counts, as 8-byte integers by slot.
        self._page_values: list[memoryview] = []
        #: Each event's slot in every page, by patch; -1 where the pages are full.
        self._slots: dict[str, dict[str, int]] = defaultdict(dict)
        self._page_lock = threading.Lock()

    # -- the per-step path: a dictionary increment, and a store into the page --

    def count(self, patch_id: str, event: str) -> None:
        self.counter(patch_id)(event)

    def counter(self, patch_id: str) -> Callable[[str], None]:
        """``count`` bound to one patch, for the per-step path."""
        events = self.counts[patch_id]
        page_values = self._page_values
        slots = self._slots[patch_id]
        add_slot = self._add_slot

        def count(event: str) -> None:
            value = events[event] + 1
            events[event] = value
            if page_values:
                slot = slots.get(event)
                if slot is None:
                    slot = add_slot(patch_id, event)
                if slot >= 0:
                    for values in page_values:
                        values[slot] = value

        return count

    def _add_slot(self, patch_id: str, event: str) -> int:
        with self._page_lock:
            slot = self._slots[patch_id].get(event)
            if slot is None:
                added = {page.add_slot(patch_id, event) for page in self._pages}
                slot = added.pop() if len(added) == 1 else None
                slot = -1 if slot is None else slot
                self._slots[patch_id][event] = slot
            return slot

    def _store_all(self) -> None:
        """Put every in-memory count into every page."""
        for patch_id, events in list(self.counts.items()):
            for event, value in list(events.items()):
                slot = self._slots[patch_id].get(event)
                if slot is None:
                    slot = self._add_slot(patch_id, event)
                if slot >= 0:
                    for values in self._page_values:
                        values[slot] = value

    # -- everything else ------------------------------------------------------

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {
            patch: dict(events) for patch, events in list(self.counts.items()) if events
        }

    def reset(self) -> None:
        # Counters handed out by counter() keep their dictionaries.
        for events in self.counts.values():
            events.clear()
        for slots in self._slots.values():
            for slot in slots.values():
                if slot >= 0:
                    for values in self._page_values:
                        values[slot] = 0

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

    def _map_page(self, directory: Path) -> None:
        """Add a counts page in ``directory``, holding every count made so far:
        a link to this process's first page where the file system allows."""
        with self._page_lock:
            pid = os.getpid()
            for linked_from, first in list(self._page_in.items())[:1]:
                try:
                    link_page(linked_from, directory, pid, lambda: temporary_name(pid))
                except OSError:
                    break
                self._page_in[directory] = first
                return
            try:
                page = CountsPage.create(directory, pid, lambda: temporary_name(pid))
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
            self._page_values.append(page.values)
            self._page_in[directory] = page
        self._store_all()

    def _drop_page(self, directory: Path) -> None:
        """Stop storing into ``directory``'s page and remove it.

        The mapping is left to the garbage collector: the step thread may be
        storing into it at this moment.
        """
        with self._page_lock:
            page = self._page_in.pop(directory, None)
            if page is None:
                return
            if page not in self._page_in.values():  # no other name for it
                self._pages.remove(page)
                self._page_values.remove(page.values)
        remove_page(directory, os.getpid())

    def record(self) -> dict[str, Any]:
        name = multiprocessing.current_process().name
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "role": process_role(name),
            "dp_rank": dp_rank_of(name),
            "process_name": name,
            "written_at": time.time(),
            "patches": self.describe_patches(),
            "wrapped": self.wrapped_patches(),
            "counts": self.snapshot(),
        }

    def flush(self, *, only_if_changed: bool = False) -> None:
        """Write this process's record into every configured directory now."""
        with self._write_lock:
            if not self._directories:
                return
            record = self.record()
            comparable = json.dumps({**record, "written_at": 0}, sort_keys=True)
            data = json.dumps(record, sort_keys=True).encode()
            for directory in list(self._directories):
                key = comparable.encode()
                if only_if_changed and self._last_written.get(directory) == key:
                    continue
                try:
                    write_private_file(directory, f"{os.getpid()}.json", data)
                except OSError as error:
                    self._directories.remove(directory)
                    self._drop_page(directory)
                    self.on_write_error(directory, error)
                    continue
                self._last_written[directory] = key

    def _start_writer(self) -> None:
        if self._writer is not None and self._writer.is_alive():
            return
        self._writer = threading.Thread(
            target=self._write_loop, name="graphsafe-stats-writer", daemon=True
        )
        self._writer.start()

    def announce(self, target: logging.Logger, message: str) -> None:
        """Log ``message`` at INFO now, or once vLLM has configured its logging.

        vLLM's API server configures logging from its arguments after it has
        loaded the plugins, so a line logged at load time there would be lost.
        """
        if _can_log_info(target) or self._writer is None:
            target.info("%s", message)
        else:
            self._pending_announcement = (target, message)

    def _write_loop(self) -> None:
        written_total = -1
        next_full_check = 0.0
        while True:
            self._wake.wait(WRITE_INTERVAL_S)
            self._wake.clear()
            try:
                # Counts only grow: a changed total is a changed count.
                total = self.total()
                now = time.monotonic()
                if total == written_total and now < next_full_check:
                    continue
                written_total, next_full_check = total, now + FULL_CHECK_INTERVAL_S
                self._announce_if_ready()
                self.flush(only_if_changed=True)
            except Exception:  # the writer must never take the process down
                continue

    def total(self) -> int:
        return sum(sum(events.values()) for events in list(self.counts.values()))

    def _announce_if_ready(self) -> None:
        pending = self._pending_announcement
        if pending is not None and _can_log_info(pending[0]):
            self._pending_announcement = None
            pending[0].info("%s", pending[1])

    def _install_exit_hooks(self) -> None:
        if self._exit_hooks_installed:
            return
        self._exit_hooks_installed = True
        atexit.register(self.flush)
        # vLLM's engine core and workers are multiprocessing children, which end
        # with os._exit: atexit never runs there, multiprocessing's finalizers do.
        multiprocessing.util.Finalize(None, self.flush, exitpriority=100)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                chain_signal_handler(signum, self.flush)

    def after_fork_in_child(self) -> None:
        """A forked child starts with no writer, directories or counts of its own."""
        self._writer = None
        self._write_lock = threading.RLock()
        self._wake = threading.Event()
        self._directories = []
        self._last_written = {}
        self._exit_hooks_installed = False
        self._pending_announcement = None
        # The parent's mappings are shared: unmap them here, never store into them.
        self._page_values.clear()
        for page in self._pages:
            with contextlib.suppress(BufferError, ValueError):
                page.close()
        self._pages.clear()
        self._page_in.clear()
        for slots in self._slots.values():
            slots.clear()
        self._page_lock = threading.Lock()
        for events in self.counts.values():
            events.clear()


def _can_log_info(target: logging.Logger) -> bool:
    return target.isEnabledFor(logging.INFO) and target.hasHandlers()


def _ignore_write_error(directory: Path, error: OSError) -> None:
    del directory, error


def chain_signal_handler(signum: int, before: Callable[[], None]) -> None:
    """Run ``before`` on ``signum``, then whatever handled it until now.

    vLLM's handler (or Python's default) is called exactly as it would have
    been; a default action is re-delivered with the default disposition.
    """
    previous = signal.getsignal(signum)
    if previous is None:  # installed outside Python: leave it alone
        return

    def handler(received: int, frame: FrameType | None) -> None:
        with contextlib.suppress(Exception):
            before()
        if callable(previous):
            previous(received, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(received, signal.SIG_DFL)
            os.kill(os.getpid(), received)

    try:
        signal.signal(signum, handler)
    except (ValueError, OSError):  # not the main thread, or not allowed here
        return


STATS = DispatchStats()
os.register_at_fork(after_in_child=STATS.after_fork_in_child)


def configure_from_environment() -> None:
    """Point the writer at the operator's statistics directory and ``/metrics``'s.

    Called by the plugin in every vLLM process once the patches are decided.
    Warnings come from the first process only (the one the operator started),
    not again from each engine process.
    """
    from vllm_graphsafe import metrics

    settings = read_settings()
    role = process_role(multiprocessing.current_process().name)
    speaks = role in (ROLE_API_SERVER, ROLE_MAIN) and settings.metrics_dir is None
    if speaks:
        from vllm_graphsafe.settings import warn_once

        warn_once(logger, settings)
    directories: list[Path] = []
    if settings.stats_dir:
        stats_dir = Path(settings.stats_dir)
        try:
            make_private_directory(stats_dir)
        except OSError as error:
            if speaks:
                _warn_unwritable(stats_dir, error)
        else:
            if speaks and writable_by_others(stats_dir):
                logger.warning(
                    "vllm-graphsafe: the statistics directory %s can be written by "
                    "other users; prefer a directory only you can write to.",
                    stats_dir,
                )
            directories.append(stats_dir)
    metrics_dir = metrics.prepare_metrics_directory()
    if metrics_dir is not None:
        directories.append(metrics_dir)
    STATS.on_write_error = _report_write_error(metrics_dir if speaks else None, speaks)
    STATS.configure(*directories)


def _warn_unwritable(directory: Path, error: OSError) -> None:
    reason = error.strerror or str(error)
    logger.warning(
        "vllm-graphsafe: cannot write dispatch statistics to %s (%s); vLLM serves "
        "as usual, without them.",
        directory,
        reason,
    )


def _report_write_error(
    metrics_dir: Path | None, speaks: bool
) -> Callable[[Path, OSError], None]:
    def report(directory: Path, error: OSError) -> None:
        if speaks and directory != metrics_dir:
            _warn_unwritable(directory, error)

    return report


# -- reading what the processes wrote -------------------------------------------


def _is_count_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(event, str) and isinstance(n, int) and not isinstance(n, bool)
        for event, n in value.items()
    )


def check_record(record: Any) -> str | None:
    """Why ``record`` is not a statistics record, or None when it is one."""
    if not isinstance(record, Mapping):
        return "it is not a JSON object"
    if not isinstance(record.get("pid"), int):
        return "it has no integer pid"
    patches = record.get("patches", {})
    if not isinstance(patches, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in patches.items()
    ):
        return "its patches are not a map of patch ids to states"
    counts = record.get("counts", {})
    if not isinstance(counts, Mapping) or not all(
        isinstance(k, str) and _is_count_map(v) for k, v in counts.items()
    ):
        return "its counts are not a map of patch ids to event counts"
    return None


def read_process_files(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every process's last written record, in pid order.

    Raises :class:`StatsDirError` (one sentence) when the directory or one of
    its records cannot be read.
    """
    path = Path(directory)
    if not path.exists():
        raise StatsDirError(f"The statistics directory {path} does not exist.")
    if not path.is_dir():
        raise StatsDirError(f"The statistics directory {path} is not a directory.")
    try:
        files = sorted(
            path.glob("*.json"), key=lambda file: (len(file.name), file.name)
        )
    except OSError as error:
        raise StatsDirError(
            f"The statistics directory {path} cannot be read "
            f"({error.strerror or error})."
        ) from None
    records = []
    for file in files:
        records.append(_read_record(file))
    return records


def _read_record(file: Path) -> dict[str, Any]:
    try:
        record = json.loads(file.read_bytes())
    except OSError as error:
        raise StatsDirError(
            f"The statistics file {file} cannot be read ({error.strerror or error})."
        ) from None
    except ValueError:
        raise StatsDirError(
            f"The statistics file {file} is not valid JSON; remove it or point "
            "--stats-dir at the directory vLLM writes."
        ) from None
    problem = check_record(record)
    if problem is not None:
        raise StatsDirError(
            f"The statistics file {file} is not a vllm-graphsafe statistics record "
            f"({problem})."
        )
    return with_page_counts(record, file)


def with_page_counts(record: Mapping[str, Any], file: Path) -> dict[str, Any]:
    """``record`` with each count raised to what its process's page holds."""
    stored = read_counts_page(page_beside(file))
    return {**record, "counts": merged_counts(record.get("counts", {}), stored)}


def read_records_leniently(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The readable records in ``directory``, skipping anything else (for scrapes)."""
    records = []
    try:
        files = list(Path(directory).glob("*.json"))
    except OSError:
        return []
    for file in files:
        try:
            record = json.loads(file.read_bytes())
        except (OSError, ValueError):
            continue
        if check_record(record) is None:
            records.append(with_page_counts(record, file))
    return records


def render_stats(stats: dict[str, Any]) -> list[str]:
    """Lines for a terminal: the summed counters of every process."""
    lines = [f"patch states in {stats['processes']} vLLM process(es):"]
    for patch_id, states in sorted(stats.get("patch_states", {}).items()):
        detail = ", ".join(f"{state} in {n}" for state, n in sorted(states.items()))
        lines.append(f"  {patch_id}: {detail}")
    lines.append("dispatch decisions:")
    for patch_id, events in sorted(stats["counts"].items()):
        detail = ", ".join(f"{event}={n}" for event, n in sorted(events.items()))
        lines.append(f"  {patch_id}: {detail}")
    if not stats["counts"]:
        lines.append("  no dispatch decisions recorded yet")
    return lines


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the counters of ``records``; count the processes in each patch state."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    patch_states: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for payload in records:
        for patch, state in payload.get("patches", {}).items():
            patch_states[patch][state] += 1
        for patch, events in payload.get("counts", {}).items():
            for event, value in events.items():
                totals[patch][event] += int(value)
    return {
        "processes": len(records),
        "patch_states": {patch: dict(states) for patch, states in patch_states.items()},
        "counts": {patch: dict(events) for patch, events in totals.items()},
    }


def read_stats_dir(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Sum the counters every process wrote into ``directory``.

    Raises :class:`StatsDirError` (one sentence) when it cannot be read.
    """
    return summarize(read_process_files(directory))
