"""``vllm-graphsafe demo`` on bad inputs: one sentence, a documented status."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.cli import demo
from vllm_graphsafe.cli.main import build_parser
from vllm_graphsafe.probe import errors as probe_errors

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
    assert "exit status:" in text and "143  stopped by SIGTERM" in text
    # The demo returns the probe's status, the one for a check not run included.
    not_run = rf"^ +{probe_errors.EXIT_INCOMPLETE} +the probe: .*could not run"
    assert re.search(not_run, text, flags=re.MULTILINE), text
    # The probe's hints name these; the demo must have them too.
    assert "--decode-tokens" in text


def test_the_printed_server_command_pasted_into_a_shell_runs_the_same(
    tmp_path: Path,
) -> None:
    from vllm_graphsafe.local_engine.launcher import server_environment, start_server

    dump = "import json, os, sys; print(json.dumps(dict(os.environ)))"
    caller = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GONE": "x"}
    env = {
        **server_environment({"GRAPHSAFE_STATS_DIR": str(tmp_path / "it's here")}),
        "PATH": os.environ["PATH"],
    }
    for name in ("GONE", "PWD", "SHLVL", "_", "OLDPWD"):  # the shell sets these
        env.pop(name, None)
    server = start_server(
        tmp_path / "model", env=env, log_path=tmp_path / "log", port=1
    )
    server.process.kill()
    server.stop()
    line = server.command_line(caller)
    # What the server was given, as the demo prints it: the CPU settings too.
    assert "VLLM_CPU_KVCACHE_SPACE=1" in line
    # Pasted into a shell whose environment is the caller's, the same command
    # gets the same environment (the command swapped for one that shows it).
    python = re.escape(sys.executable)
    pasted = re.sub(rf"{python} -m \S+.*$", f"{sys.executable} -c '{dump}'", line)
    shown = subprocess.run(
        ["bash", "-c", pasted], env=caller, capture_output=True, text=True, check=True
    )
    got = json.loads(shown.stdout)
    for name in ("PWD", "SHLVL", "_", "OLDPWD"):
        got.pop(name, None)
    assert got == env


def test_the_module_form_of_the_server_is_explained_where_it_is_shown() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    demo_section = readme.split("## The demo", 1)[1].split("\n## ", 1)[0]
    known_issues = readme.split("## Known issues", 1)[1].split("\n## ", 1)[0]
    assert "vllm serve MODEL" in demo_section
    assert f"python -m {vllm_layout.OPENAI_API_SERVER}" in demo_section
    assert 'importlib.metadata.version("vllm")' in known_issues
    # The demo says why next to the command it prints.
    assert "`vllm serve`" in demo.MODULE_FORM_NOTE
    assert "vllm-cpu" in demo.MODULE_FORM_NOTE


def test_the_demo_keeps_the_fixes_verdicts_in_its_own_cache_directory(
    tmp_path: Path,
) -> None:
    args = argparse.Namespace(without_plugin=False, no_hazard=False)
    cache = tmp_path / "cache"
    # Not in the user's ~/.cache: the demo's one directory holds what it keeps.
    overrides = demo.server_overrides(
        args, cache, tmp_path / "stats", tmp_path / "tmp", environ={}
    )
    assert overrides["GRAPHSAFE_CACHE_DIR"] == str(cache / "verdicts")
    # A user's own setting is theirs.
    mine = str(tmp_path / "mine")
    overrides = demo.server_overrides(
        args,
        cache,
        tmp_path / "stats",
        tmp_path / "tmp",
        environ={"GRAPHSAFE_CACHE_DIR": mine},
    )
    assert overrides["GRAPHSAFE_CACHE_DIR"] == mine
    # The README's demo section says where it all goes.
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    demo_section = readme.split("## The demo", 1)[1].split("\n## ", 1)[0]
    assert "./.cache/vllm-graphsafe" in demo_section
    assert "verdicts/" in demo_section and "GRAPHSAFE_CACHE_DIR" in demo_section


def test_the_demo_lets_vllm_stop_its_processes_in_order() -> None:
    # vLLM's default shutdown timeout (0) kills its engine processes at once and
    # logs it; the demo's servers are given time to end them in order.
    assert ("--shutdown-timeout", str(demo.SHUTDOWN_TIMEOUT_S)) == demo.STOP_CLEANLY
    assert 0 < demo.SHUTDOWN_TIMEOUT_S < demo.SERVING_STOP_WITHIN_S
