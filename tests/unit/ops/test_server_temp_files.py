"""A server started by the launcher (demo, tests, benchmark) leaves no
temporary files: vLLM's IPC sockets and rendezvous files go to a folder of its
own, removed once the server has stopped."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_graphsafe.local_engine import launcher

#: Stands in for vLLM: a socket and a file in its temporary folder, then waits.
FAKE_SERVER = """
import json, os, socket, sys, tempfile, time, uuid
where = tempfile.gettempdir()
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(where, str(uuid.uuid4())))
open(os.path.join(where, "vllm_dist_" + uuid.uuid4().hex), "w").close()
print(json.dumps({"tmp": where,
                  "inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}), flush=True)
time.sleep(600)
"""


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's own temporary folder, short enough for socket names (made
    after pytest's ``tmp_path``, which is found through the same setting)."""
    root = Path(tempfile.mkdtemp(prefix="gs-t-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setattr(
        launcher,
        "server_command",
        lambda *args: [sys.executable, "-c", FAKE_SERVER],
    )
    yield root
    shutil.rmtree(root, ignore_errors=True)


def started(
    env: dict[str, str], log: Path
) -> tuple[launcher.LocalServer, dict[str, str]]:
    server = launcher.start_server("model", env=env, log_path=log, port=1)
    deadline = time.monotonic() + 30
    while not log.read_text().strip():
        assert time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.05)
    shown: dict[str, str] = json.loads(log.read_text().splitlines()[0])
    return server, shown


def test_a_stopped_server_leaves_nothing_in_the_temporary_folder(
    temp_root: Path, tmp_path: Path
) -> None:
    unset = ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    server, shown = started(env, tmp_path / "log")
    assert Path(shown["tmp"]).parent == temp_root
    assert len(list(Path(shown["tmp"]).iterdir())) == 2
    assert shown["inductor"] == str(temp_root / f"torchinductor_{launcher._user()}")
    server.stop()
    assert list(temp_root.iterdir()) == []
    assert "TMPDIR" not in server.command_line({}), "a removed folder was printed"


def test_a_folder_the_caller_chose_is_the_callers(
    temp_root: Path, tmp_path: Path
) -> None:
    # Beside the test's own folder, and as short: a socket's path has at most
    # 107 bytes.
    mine = Path(tempfile.mkdtemp(prefix="gs-m-", dir="/tmp"))
    try:
        server, shown = started({**os.environ, "TMPDIR": str(mine)}, tmp_path / "log")
        server.stop()
        assert shown["tmp"] == str(mine)
        assert len(list(mine.iterdir())) == 2, "the caller's folder was emptied"
    finally:
        shutil.rmtree(mine, ignore_errors=True)
    assert list(temp_root.iterdir()) == []


def test_a_caller_kernel_cache_is_kept(temp_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "kernels")}
    env.pop("TMPDIR", None)
    server, shown = started(env, tmp_path / "log")
    server.stop()
    assert shown["inductor"] == str(tmp_path / "kernels")


def test_where_socket_names_would_not_fit_the_server_keeps_vllms_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert launcher.private_temp_dir({}) is None
    assert list(deep.iterdir()) == []
