"""Statistics files: private, never through a link, off the step path, never lost.

Every scenario that installs signal handlers or exit hooks runs in a child
Python process, so that the test process keeps its own.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_graphsafe import counts, private_files
from vllm_graphsafe.counts import (
    DispatchStats,
    StatsDirError,
    read_stats_dir,
    render_stats,
)
from vllm_graphsafe.fixes import phase_events, v1_dummy_staging

SECRET = "sk-graphsafe-test-secret-4f1a"


def child(
    code: str, env: dict[str, str], *args: str, wait: bool = True
) -> subprocess.Popen[str]:
    """A Python child running ``code`` with the project's package and ``env``."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if wait:
        process.wait(timeout=120)
    return process


def only_record(directory: Path) -> dict[str, object]:
    files = list(directory.glob("*.json"))
    assert len(files) == 1, files
    record: dict[str, object] = json.loads(files[0].read_text())
    return record


COUNT_THEN_WAIT = """
    import sys, time
    from vllm_graphsafe import counts, plugin
    from vllm_graphsafe.fixes import phase_events
    plugin.configure_counts()
    count = counts.STATS.counter("v1-phase-dispatch")
    for _ in range(int(sys.argv[1])):
        count(phase_events.KEPT_OFF_DECODE)
    print("counted", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def wait_for_line(process: subprocess.Popen[str], expected: str) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == expected, line + (
        process.stderr.read() if process.stderr else ""
    )


def wait_or_show_where_it_hangs(process: subprocess.Popen[str], timeout: float) -> None:
    """Wait for ``process``; past ``timeout``, fail with its threads' stacks."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler prints every thread
        _, stderr = process.communicate(timeout=30)
        pytest.fail(f"the child outlived {timeout} s after the signal:\n{stderr}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_counts_are_flushed_when_the_process_is_signalled(
    tmp_path: Path, signum: int
) -> None:
    stats_dir = tmp_path / "stats"
    process = child(
        COUNT_THEN_WAIT,
        {"GRAPHSAFE_STATS_DIR": str(stats_dir)},
        "1234",
        "60",
        wait=False,
    )
    wait_for_line(process, "counted")
    process.send_signal(signum)
    wait_or_show_where_it_hangs(process, 60)
    # Python's own handling of the signal still happens after the flush.
    assert process.returncode in (-signum, 1), process.stderr
    if signum == signal.SIGINT:
        assert (
            process.stderr is not None and "KeyboardInterrupt" in process.stderr.read()
        )
    record = only_record(stats_dir)
    assert record["counts"] == {"v1-phase-dispatch": {KEPT: 1234}}


KEPT = phase_events.KEPT_OFF_DECODE


def test_a_handler_installed_before_is_still_called(tmp_path: Path) -> None:
    stats_dir = tmp_path / "stats"
    code = textwrap.dedent(
        """
        import signal, sys
        def previous(signum, frame):
            print("previous handler ran", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, previous)
        """
    ) + textwrap.dedent(COUNT_THEN_WAIT)
    process = child(
        code, {"GRAPHSAFE_STATS_DIR": str(stats_dir)}, "5", "60", wait=False
    )
    wait_for_line(process, "counted")
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 7
    assert "previous handler ran" in out
    assert only_record(stats_dir)["counts"] == {"v1-phase-dispatch": {KEPT: 5}}


def test_counts_reach_the_directory_within_a_second_without_exiting(
    tmp_path: Path,
) -> None:
    stats_dir = tmp_path / "stats"
    process = child(
        COUNT_THEN_WAIT, {"GRAPHSAFE_STATS_DIR": str(stats_dir)}, "42", "60", wait=False
    )
    try:
        wait_for_line(process, "counted")
        counted_at = time.monotonic()
        record: dict[str, object] = {}
        while time.monotonic() - counted_at < 3.0:
            files = list(stats_dir.glob("*.json"))
            if files:
                record = json.loads(files[0].read_text())
                if record["counts"]:
                    break
            time.sleep(0.05)
        # 1 s is the promise; the margin is for a loaded CI machine.
        assert time.monotonic() - counted_at < 3.0
        assert record["counts"] == {"v1-phase-dispatch": {KEPT: 42}}
    finally:
        process.kill()
        process.wait()


def test_counting_writes_nothing_on_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writers: list[str] = []
    real_write = private_files.write_private_file

    def recording_write(directory: Path, name: str, data: bytes) -> None:
        import threading

        real_write(directory, name, data)
        writers.append(threading.current_thread().name)

    monkeypatch.setattr(private_files, "write_private_file", recording_write)
    counters = DispatchStats()
    monkeypatch.setattr(counters, "_install_exit_hooks", lambda: None)
    counters.configure(tmp_path)
    count = counters.counter("v1-phase-dispatch")
    for _ in range(10_000):
        count(phase_events.UNIFORM_DECODE)
    counters.count("v1-dummy-staging", v1_dummy_staging.STAGED_DUMMY)
    expected = {
        "v1-phase-dispatch": {phase_events.UNIFORM_DECODE: 10_000},
        "v1-dummy-staging": {v1_dummy_staging.STAGED_DUMMY: 1},
    }
    # The writer may first write while the loop is still counting.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if writers and only_record(tmp_path)["counts"] == expected:
            break
        time.sleep(0.05)
    assert writers and set(writers) == {"graphsafe-stats-writer"}
    assert only_record(tmp_path)["counts"] == expected


def test_records_identify_the_process_and_nothing_of_its_command_line(
    tmp_path: Path,
) -> None:
    stats_dir = tmp_path / "stats"
    code = """
        from vllm_graphsafe import plugin
        plugin.configure_counts()
    """
    process = child(code, {"GRAPHSAFE_STATS_DIR": str(stats_dir)}, "--api-key", SECRET)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    raw = b"".join(path.read_bytes() for path in stats_dir.iterdir())
    assert SECRET.encode() not in raw
    record = only_record(stats_dir)
    assert record["pid"] == process.pid
    assert record["ppid"] == os.getpid()
    assert record["role"] == "main"
    assert record["dp_rank"] is None
    assert "argv" not in record


def test_files_are_0600_and_a_created_directory_is_0700(tmp_path: Path) -> None:
    stats_dir = tmp_path / "made" / "stats"
    code = """
        from vllm_graphsafe import plugin
        plugin.configure_counts()
    """
    process = child(code, {"GRAPHSAFE_STATS_DIR": str(stats_dir)})
    assert process.returncode == 0
    assert stat.S_IMODE(stats_dir.stat().st_mode) == 0o700
    files = sorted(file.name for file in stats_dir.iterdir())
    assert files == [f"{process.pid}.counts", f"{process.pid}.json"]
    for file in stats_dir.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("planted", "refused"),
    [(".planted.tmp", False), ("{pid}.json", True)],
    ids=["temporary-name", "final-name"],
)
def test_a_planted_link_is_neither_followed_nor_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str, refused: bool
) -> None:
    """At the temporary name the record goes to a fresh one; at the final name
    the write is refused, reported once, and that directory is dropped."""
    target = tmp_path / "target"
    target.write_text("untouched")
    directory = tmp_path / "stats"
    directory.mkdir(mode=0o700)
    final = directory / f"{os.getpid()}.json"
    link = directory / planted.format(pid=os.getpid())
    link.symlink_to(target)
    names = iter([".planted.tmp", ".fresh.tmp", ".planted.tmp", ".fresh-2.tmp"])
    monkeypatch.setattr(private_files, "temporary_name", lambda pid: next(names))
    errors: list[OSError] = []
    counters = DispatchStats()
    monkeypatch.setattr(counters, "_install_exit_hooks", lambda: None)
    monkeypatch.setattr(counters, "_start_writer", lambda: None)
    counters.on_write_error = lambda _, error: errors.append(error)
    counters.configure(directory)
    counters.count("v1-phase-dispatch", phase_events.UNIFORM_DECODE)

    counters.flush()

    assert target.read_text() == "untouched"
    assert link.is_symlink()
    if refused:
        assert len(errors) == 1 and isinstance(errors[0], counts.UnsafeTargetError)
        # No temporary, and no counts page: nothing of it is left there.
        assert [p.name for p in directory.iterdir()] == [link.name]
        assert counters.directories == []  # it stops writing there
    else:
        assert errors == []
        page = final.with_suffix(".counts")
        assert sorted(p.name for p in directory.iterdir()) == sorted(
            [link.name, final.name, page.name]
        )
        assert not final.is_symlink()
        assert stat.S_IMODE(final.stat().st_mode) == 0o600
        record = json.loads(final.read_text())
        assert record["counts"]["v1-phase-dispatch"][phase_events.UNIFORM_DECODE] == 1
        assert counters.directories == [directory]


def test_a_link_at_the_pages_name_is_left_and_the_record_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counts page is refused there as the record would be; the record,
    which carries the counts too, is written beside the link."""
    target = tmp_path / "target"
    target.write_text("untouched")
    directory = tmp_path / "stats"
    directory.mkdir(mode=0o700)
    link = directory / f"{os.getpid()}.counts"
    link.symlink_to(target)
    errors: list[OSError] = []
    counters = DispatchStats()
    monkeypatch.setattr(counters, "_install_exit_hooks", lambda: None)
    monkeypatch.setattr(counters, "_start_writer", lambda: None)
    counters.on_write_error = lambda _, error: errors.append(error)
    counters.configure(directory)
    counters.count("v1-phase-dispatch", phase_events.UNIFORM_DECODE)

    counters.flush()

    assert target.read_text() == "untouched"
    assert link.is_symlink()
    assert errors == []
    assert counters.distinct_pages == 0
    record_file = directory / f"{os.getpid()}.json"
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [link.name, record_file.name]
    )
    record = json.loads(record_file.read_text())
    assert record["counts"]["v1-phase-dispatch"][phase_events.UNIFORM_DECODE] == 1
    assert read_stats_dir(directory)["counts"] == {
        "v1-phase-dispatch": {phase_events.UNIFORM_DECODE: 1}
    }


def run_configure(env: dict[str, str]) -> subprocess.Popen[str]:
    return child(
        """
        import logging
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        from vllm_graphsafe import plugin
        plugin.configure_counts()
        print("served", flush=True)
        """,
        env,
    )


def test_a_directory_others_can_write_gets_one_warning(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    process = run_configure({"GRAPHSAFE_STATS_DIR": str(shared)})
    err = process.stderr.read() if process.stderr else ""
    assert process.returncode == 0
    assert err.count("can be written by other users") == 1, err
    assert list(shared.glob("*.json"))


def test_an_unwritable_directory_gets_one_warning_and_the_process_goes_on(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    process = run_configure({"GRAPHSAFE_STATS_DIR": str(blocked / "stats")})
    out = process.stdout.read() if process.stdout else ""
    err = process.stderr.read() if process.stderr else ""
    assert process.returncode == 0 and "served" in out
    assert err.count("cannot write dispatch statistics") == 1, err
    assert "Traceback" not in err


def write(directory: Path, name: str, text: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text)


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda d: None, "No vLLM process has written statistics to"),
        (lambda d: d.write_text("x"), "is not a directory"),
        (lambda d: write(d, "1.json", "{not json"), "is not valid JSON"),
        (lambda d: write(d, "1.json", "[1, 2]"), "not a JSON object"),
        (
            lambda d: write(d, "1.json", '{"pid": 1, "counts": {"p": 3}}'),
            "counts are not a map",
        ),
        (lambda d: write(d, "1.json", '{"name": "other"}'), "no integer pid"),
    ],
    ids=["missing", "a-file", "corrupt", "a-list", "bad-counts", "other-shape"],
)
def test_an_unreadable_directory_is_one_sentence(
    tmp_path: Path, setup: Callable[[Path], object], expected: str
) -> None:
    directory = tmp_path / "stats"
    setup(directory)
    with pytest.raises(StatsDirError) as raised:
        read_stats_dir(directory)
    message = str(raised.value)
    assert expected in message and message.endswith(".") and "\n" not in message


def test_records_are_summed_across_processes(tmp_path: Path) -> None:
    for pid, kept in ((11, 2), (12, 3)):
        record = {
            "pid": pid,
            "patches": {"v1-phase-dispatch": "applied"},
            "counts": {"v1-phase-dispatch": {KEPT: kept}},
        }
        write(tmp_path, f"{pid}.json", json.dumps(record))
    summary = read_stats_dir(tmp_path)
    assert summary["processes"] == 2
    assert summary["counts"] == {"v1-phase-dispatch": {KEPT: 5}}
    assert summary["patch_states"] == {"v1-phase-dispatch": {"applied": 2}}


def test_a_multiprocessing_child_flushes_when_it_returns(tmp_path: Path) -> None:
    # vLLM's engine core and workers are multiprocessing children: they end with
    # os._exit, where atexit handlers never run.
    stats_dir = tmp_path / "stats"
    code = """
        import multiprocessing
        from vllm_graphsafe import counts, plugin
        from vllm_graphsafe.fixes import phase_events
        from vllm_graphsafe.counts import writer

        def engine_process():
            writer.WRITE_INTERVAL_S = 3600  # no periodic write: only the exit one
            plugin.configure_counts()
            count = counts.STATS.counter("v1-phase-dispatch")
            for _ in range(7):
                count(phase_events.KEPT_OFF_DECODE)

        child = multiprocessing.get_context("fork").Process(
            target=engine_process, name="VllmWorker-0"
        )
        child.start()
        child.join()
        print(child.pid, child.exitcode)
    """
    process = child(code, {"GRAPHSAFE_STATS_DIR": str(stats_dir)})
    out = process.stdout.read() if process.stdout else ""
    worker_pid, exitcode = out.split()
    assert exitcode == "0"
    record = json.loads((stats_dir / f"{worker_pid}.json").read_text())
    assert record["role"] == "worker"
    assert record["counts"] == {"v1-phase-dispatch": {KEPT: 7}}


def test_a_directory_without_records_is_said_to_hold_none(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("unrelated")
    lines = render_stats(read_stats_dir(tmp_path))
    assert lines == [
        f"{tmp_path} holds no vllm-graphsafe statistics: no vLLM process has "
        "written there (is it the directory GRAPHSAFE_STATS_DIR names?)."
    ]


def test_a_process_under_a_server_that_does_not_serve_writes_no_statistics(
    tmp_path: Path,
) -> None:
    # vLLM's model-inspection subprocess inherits both directories from the API
    # server; /metrics leaves it out, so the statistics must too.
    stats_dir = tmp_path / "stats"
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir(mode=0o700)
    code = """
        from vllm_graphsafe import plugin
        plugin.configure_counts()
    """
    env = {
        "GRAPHSAFE_STATS_DIR": str(stats_dir),
        "GRAPHSAFE_METRICS_DIR": str(metrics_dir),
    }
    process = child(code, env)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    assert not stats_dir.exists() or list(stats_dir.glob("*.json")) == []
    assert list(metrics_dir.iterdir()) == []
