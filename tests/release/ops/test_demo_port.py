"""``vllm-graphsafe demo`` on a port in use: one sentence, a documented status.

The demo checks that vLLM is installed before it checks the port, so this
runs against the installed release (no engine starts: the port is taken).
"""

from __future__ import annotations

import socket
from contextlib import closing
from pathlib import Path

from tests.unit.ops.test_demo_cli import run_demo
from vllm_graphsafe.cli import demo


def test_a_port_in_use_is_one_sentence(tmp_path: Path) -> None:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_demo(tmp_path, "--port", str(port))
    assert result.returncode == demo.EXIT_PORT_IN_USE
    assert result.stderr.strip() == (
        f"Port {port} on 127.0.0.1 is in use; choose another with --port "
        "(0 picks a free one)."
    )
    assert list(tmp_path.iterdir()) == []
