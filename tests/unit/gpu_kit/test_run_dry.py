"""The GPU kit's run script without a GPU: its plan, its table, its bad input."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.gpu_kit.kit_modules import KIT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(KIT / "run.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_dry_run_prints_every_configuration_as_not_run() -> None:
    done = run("--dry-run", "--ks", "3", "--block-size", "272")

    assert done.returncode == 0, done.stderr
    assert "block_tail_k_plus_1/0                  276 tokens" in done.stdout
    assert "prefix_tail/k_plus_1" in done.stdout and "272 cached" in done.stdout
    assert done.stdout.count("| not run |") == 4


def test_a_bad_speculative_width_is_refused_in_one_sentence() -> None:
    done = run("--dry-run", "--ks", "3,x")

    assert done.returncode == 2
    assert "--ks takes numbers and commas, not '3,x'" in done.stderr
    assert "Traceback" not in done.stderr
