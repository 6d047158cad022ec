"""Counts pages: every count outlives SIGKILL, stays this process's own, and a
page that cannot be read leaves the record's counts standing.

The scenarios that count and die run in a child Python process whose writer
thread never wakes (``WRITE_INTERVAL_S`` of an hour): its record is written once,
by hand, before any count, so whatever the readers find beyond it came from the
page.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from vllm_graphsafe import counts
from vllm_graphsafe.counts import page, read_stats_dir, writer
from vllm_graphsafe.fixes.phase_events import KEPT_OFF_DECODE, UNIFORM_DECODE

PATCH = "v1-phase-dispatch"

COUNT_THEN_SIGKILL = """
    import os, signal, sys
    from vllm_graphsafe import counts, plugin
    from vllm_graphsafe.fixes import phase_events
    from vllm_graphsafe.counts import writer
    writer.WRITE_INTERVAL_S = 3600.0
    plugin.configure_counts()
    counts.STATS.flush()  # the record, with no counts yet
    count = counts.STATS.counter("v1-phase-dispatch")
    for _ in range(int(sys.argv[1])):
        count(phase_events.UNIFORM_DECODE)
    for _ in range(int(sys.argv[2])):
        count(phase_events.KEPT_OFF_DECODE)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def run_child(
    code: str, stats_dir: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env={**os.environ, "GRAPHSAFE_STATS_DIR": str(stats_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_counts_made_just_before_a_sigkill_are_all_read(tmp_path: Path) -> None:
    stats_dir = tmp_path / "stats"
    done = run_child(COUNT_THEN_SIGKILL, stats_dir, "1000", "7")
    assert done.returncode == -signal.SIGKILL, done.stderr
    (record_file,) = stats_dir.glob("*.json")
    assert json.loads(record_file.read_text())["counts"] == {}  # written before
    totals = read_stats_dir(stats_dir)
    assert totals["processes"] == 1
    assert totals["counts"] == {PATCH: {UNIFORM_DECODE: 1000, KEPT_OFF_DECODE: 7}}


def test_a_forked_child_counts_apart_from_its_parent(tmp_path: Path) -> None:
    stats_dir = tmp_path / "stats"
    code = """
        import os, sys
        from vllm_graphsafe import counts, plugin
        from vllm_graphsafe.fixes import phase_events
        from vllm_graphsafe.counts import writer
        writer.WRITE_INTERVAL_S = 3600.0
        plugin.configure_counts()
        count = counts.STATS.counter("v1-phase-dispatch")
        for _ in range(3):
            count(phase_events.KEPT_OFF_DECODE)
        pid = os.fork()
        if pid == 0:
            plugin.configure_counts()
            counts.STATS.flush()
            for _ in range(5):
                count(phase_events.KEPT_OFF_DECODE)
            os._exit(0)
        os.waitpid(pid, 0)
        counts.STATS.flush()
        print(os.getpid(), pid)
    """
    done = run_child(code, stats_dir)
    assert done.returncode == 0, done.stderr
    parent_pid, child_pid = (int(word) for word in done.stdout.split())
    kept_off = {
        record["pid"]: record["counts"][PATCH][KEPT_OFF_DECODE]
        for record in counts.read_process_files(stats_dir)
    }
    assert kept_off == {parent_pid: 3, child_pid: 5}


def page_bytes(names: list[list[str]], values: list[int]) -> bytearray:
    data = bytearray(page.PAGE_SIZE)
    data[: len(page.MAGIC)] = page.MAGIC
    layout = json.dumps(names).encode()
    start = page.LAYOUT_AT
    data[start : start + 4] = struct.pack("=I", len(layout))
    data[start + 4 : start + 4 + len(layout)] = layout
    for slot, value in enumerate(values):
        struct.pack_into("=Q", data, page.VALUES_AT + 8 * slot, value)
    return data


def test_a_page_is_read_by_its_own_names() -> None:
    data = page_bytes([[PATCH, UNIFORM_DECODE], ["other", "dummy"]], [12, 3])
    assert page.parse_counts_page(bytes(data)) == {
        PATCH: {UNIFORM_DECODE: 12},
        "other": {"dummy": 3},
    }


def test_a_page_being_written_or_foreign_is_not_read() -> None:
    # A second name written after the length was read: the old length cuts
    # the new list short.
    torn = page_bytes([[PATCH, UNIFORM_DECODE], [PATCH, "dummy"]], [12, 1])
    old_length = len(json.dumps([[PATCH, UNIFORM_DECODE]]))
    struct.pack_into("=I", torn, page.LAYOUT_AT, old_length)
    foreign = bytearray(page.PAGE_SIZE)
    too_long = page_bytes([], [])
    struct.pack_into("=I", too_long, page.LAYOUT_AT, page.VALUES_AT)
    for data in (torn, foreign, too_long, bytearray(b"short")):
        assert page.parse_counts_page(bytes(data)) is None


def test_the_records_counts_stand_where_the_page_is_unreadable(tmp_path: Path) -> None:
    record = {"pid": 41, "patches": {}, "counts": {PATCH: {UNIFORM_DECODE: 9}}}
    (tmp_path / "41.json").write_text(json.dumps(record))
    (tmp_path / "41.counts").write_bytes(b"not a page")
    (tmp_path / "42.json").write_text(json.dumps({**record, "pid": 42}))
    (tmp_path / "42.counts").write_bytes(
        bytes(page_bytes([[PATCH, UNIFORM_DECODE], [PATCH, "dummy"]], [11, 2]))
    )
    assert read_stats_dir(tmp_path)["counts"] == {
        PATCH: {UNIFORM_DECODE: 20, "dummy": 2}
    }
    scraped = counts.read_records_leniently(tmp_path)
    assert sorted(r["counts"][PATCH][UNIFORM_DECODE] for r in scraped) == [9, 11]


def test_a_link_at_the_pages_name_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(bytes(page_bytes([[PATCH, UNIFORM_DECODE]], [500])))
    directory = tmp_path / "stats"
    directory.mkdir()
    record = {"pid": 41, "patches": {}, "counts": {PATCH: {UNIFORM_DECODE: 9}}}
    (directory / "41.json").write_text(json.dumps(record))
    (directory / "41.counts").symlink_to(elsewhere)
    assert read_stats_dir(directory)["counts"] == {PATCH: {UNIFORM_DECODE: 9}}


def test_two_directories_on_one_file_system_share_one_page(tmp_path: Path) -> None:
    metrics_dir, stats_dir = tmp_path / "metrics", tmp_path / "stats"
    for directory in (metrics_dir, stats_dir):
        directory.mkdir(mode=0o700)
    counters = counts.DispatchStats()
    counters._install_exit_hooks = lambda: None  # type: ignore[method-assign]
    counters._start_writer = lambda: None  # type: ignore[method-assign]
    count = counters.counter(PATCH)
    count(KEPT_OFF_DECODE)
    counters.configure(metrics_dir, stats_dir)
    count(KEPT_OFF_DECODE)
    name = f"{os.getpid()}.counts"
    assert (metrics_dir / name).stat().st_ino == (stats_dir / name).stat().st_ino
    assert counters.distinct_pages == 1
    for directory in (metrics_dir, stats_dir):
        assert page.read_counts_page(directory / name) == {PATCH: {KEPT_OFF_DECODE: 2}}
    # One directory given up (its record could not be written): the other's
    # name for the page stays, and counting goes on there.
    counters._drop_page(metrics_dir)
    count(KEPT_OFF_DECODE)
    assert not (metrics_dir / name).exists()
    assert page.read_counts_page(stats_dir / name) == {PATCH: {KEPT_OFF_DECODE: 3}}


def test_directories_given_back_are_never_written_again(tmp_path: Path) -> None:
    """A caller that gave its directories back (``stop_writing``) may remove
    them at once: the writer thread, still running, writes nothing more there
    and reports no error, while counting goes on."""
    import shutil
    import time

    directories = [tmp_path / "metrics", tmp_path / "stats"]
    for directory in directories:
        directory.mkdir(mode=0o700)
    errors: list[Path] = []
    counters = counts.DispatchStats()
    counters._install_exit_hooks = lambda: None  # type: ignore[method-assign]
    counters.on_write_error = lambda directory, error: errors.append(directory)
    count = counters.counter(PATCH)
    counters.configure(*directories)
    count(KEPT_OFF_DECODE)
    counters.flush()
    assert all((d / f"{os.getpid()}.json").exists() for d in directories)
    counters.stop_writing(*directories)
    for directory in directories:
        shutil.rmtree(directory)
    deadline = time.monotonic() + 4 * writer.WRITE_INTERVAL_S
    while time.monotonic() < deadline:
        count(KEPT_OFF_DECODE)
        time.sleep(writer.WRITE_INTERVAL_S / 4)
    counters.flush()
    assert not any(directory.exists() for directory in directories)
    assert errors == []
    assert counters.snapshot()[PATCH][KEPT_OFF_DECODE] > 2
    assert counters.directories == []
