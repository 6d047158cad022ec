"""``vllm-graphsafe demo`` on bad inputs: one sentence, a documented status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe.cli import demo
from vllm_graphsafe.cli.main import build_parser

HIDE_VLLM = "import sys; sys.modules['vllm'] = None"


def run_demo(
    cwd: Path, *args: str, prelude: str = "pass"
) -> subprocess.CompletedProcess[str]:
    code = (
        f"{prelude}\nimport sys\nfrom vllm_graphsafe.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "demo", *args],
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_vllm_one_sentence_and_no_cache_created(tmp_path: Path) -> None:
    # vLLM is hidden from the import system, as in an environment without it.
    result = run_demo(tmp_path, prelude=HIDE_VLLM)
    assert result.returncode == demo.EXIT_NO_VLLM
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "scripts/demo.sh" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no ./.cache, no temporary directory


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_termination_signals_unwind_the_demo(signum: int) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(demo.Stopped) as stopped, demo.stop_on_signals():
        os.kill(os.getpid(), signum)
    assert stopped.value.signum == signum
    assert signal.getsignal(signum) is before


def test_help_lists_the_exit_statuses_and_only_real_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    text = capsys.readouterr().out
    assert "exit status:" in text and "143 SIGTERM" in text
    # The probe's hints name these; the demo must have them too.
    assert "--decode-tokens" in text
