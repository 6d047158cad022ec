"""Installing from a checkout leaves the checkout as it was (no `build/`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGED = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "src")


def _snapshot(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*")}


def test_building_a_wheel_from_a_checkout_writes_nothing_into_it(
    tmp_path: Path,
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in PACKAGED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, checkout / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(source, checkout / name)
    before = _snapshot(checkout)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            # The backend pyproject.toml names, from the test extra: the same
            # build as pip's isolated one, without installing it each time.
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(checkout),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert _snapshot(checkout) - before == set()

    (wheel,) = (tmp_path / "dist").glob("vllm_graphsafe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "vllm_graphsafe/py.typed",
        "vllm_graphsafe/data/releases.json",
        "vllm_graphsafe/local_engine/launcher.py",
        # Read by the backport: a folder of files, not a Python package.
        "vllm_graphsafe/fixes/replay_guard/written/wrapper.py",
    } <= names
    assert any(name.endswith("dist-info/entry_points.txt") for name in names)
    # Only the product: the package and its metadata, none of the modules
    # that serve the tests and benchmarks (tests/support), and no module of
    # the package reaches for them.
    assert {name.split("/", 1)[0] for name in names} == {
        "vllm_graphsafe",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    support = ROOT / "tests" / "support"
    test_only = [
        path.relative_to(support).as_posix()
        for path in support.rglob("*.py")
        if path.parent != support or path.name != "__init__.py"
    ]
    assert test_only
    assert [n for n in names for t in test_only if n.endswith("/" + t)] == []
    package = zipfile.ZipFile(wheel)
    assert [
        n for n in names if n.endswith(".py") and b"tests.support" in package.read(n)
    ] == []


def _sdist_includes() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.hatch.build.targets.sdist]", 1)[1]
    match = re.search(r"include = \[([^\]]*)\]", section)
    assert match, "pyproject.toml names no sdist include list"
    return re.findall(r'"([^"]+)"', match.group(1))


def test_every_page_the_readme_links_to_exists_and_ships_in_the_sdist() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert "docs/fixes.md" in local
    included = _sdist_includes()
    for link in local:
        assert (ROOT / link).is_file(), f"README.md links to a missing {link}"
        assert link.split("/")[0] in included, f"the sdist leaves out {link}"


def test_every_link_between_the_docs_pages_resolves() -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        for link in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" not in link:
                assert (page.parent / link).is_file(), f"{page.name} links to {link}"


def test_version_prints_the_packages_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vllm_graphsafe.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    declared = re.search(
        r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert declared is not None
    assert capsys.readouterr().out.strip() == f"vllm-graphsafe {declared.group(1)}"
