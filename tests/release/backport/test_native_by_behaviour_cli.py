"""What a maintainer and an operator see for a rewrite and a look-alike of each fix.

``backport --check`` on a tree holding only Python files (no compiled
libraries: it is never imported) and ``doctor`` on an installed release whose
source carries the variant (a copy first on ``PYTHONPATH``) name how each
verdict was reached: ``native (behaviour: N/N cases)``, or ``needed
(behaviour: <the case it got wrong> ...)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backport_trees import REPO
from tests.release.classes.test_native_by_behaviour import release_root, tree_kind
from tests.release.native_variants import ALL_VARIANTS, Variant
from tests.support.backport_checks import copy_package
from vllm_graphsafe.cli.main import main


def pick(fix: str, native: bool, kind: str) -> Variant:
    return next(
        v
        for v in ALL_VARIANTS
        if v.fix == fix and v.native is native and v.tree in (None, kind)
    )


def picked() -> list[Variant]:
    kind = tree_kind(release_root())
    return [
        pick(fix, native, kind)
        for fix in dict.fromkeys(v.fix for v in ALL_VARIANTS)
        for native in (True, False)
    ]


def expected_line(variant: Variant) -> re.Pattern[str]:
    if variant.native:
        return re.compile(
            rf"^{variant.fix}: native \(behaviour: (\d+)/\1 cases[,)]", re.MULTILINE
        )
    return re.compile(
        rf"^{variant.fix}: needed \(behaviour: .+ (got|ran|staged|left|replayed) ",
        re.MULTILINE,
    )


@pytest.fixture(scope="module")
def python_only_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's ``vllm/`` with its Python files only."""
    root = tmp_path_factory.mktemp("python-only")
    shutil.copytree(
        release_root() / "vllm",
        root / "vllm",
        ignore=lambda directory, names: [
            n
            for n in names
            if not n.endswith(".py") and not (Path(directory) / n).is_dir()
        ],
    )
    assert not list(root.rglob("*.so"))
    return root


@pytest.mark.parametrize("variant", picked(), ids=lambda v: v.id)
def test_backport_check_names_the_evidence(
    variant: Variant,
    python_only_tree: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "tree"
    shutil.copytree(python_only_tree, root)
    for relpath, text in variant.edit(root).items():
        (root / relpath).write_text(text, encoding="utf-8")

    main(["backport", "--tree", str(root), "--fix", variant.fix, "--check"])

    said = capsys.readouterr().err
    assert expected_line(variant).search(said), said


def doctor(package_root: Path, *flags: str) -> dict[str, dict[str, object]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(package_root), str(REPO / "src")]),
        "GRAPHSAFE_CACHE_DIR": "off",
    }
    done = subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.cli.main", "doctor", "--json", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert Path(report["vllm_source"]).is_relative_to(package_root), report[
        "vllm_source"
    ]
    return {patch["id"]: patch for patch in report["patches"]}


@pytest.fixture(scope="module")
def installed_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the installed release, compiled libraries included."""
    root = tmp_path_factory.mktemp("installed")
    copy_package(release_root() / "vllm", root)
    return root


@pytest.mark.parametrize("variant", picked(), ids=lambda v: v.id)
def test_doctor_names_the_evidence(variant: Variant, installed_copy: Path) -> None:
    edited = variant.edit(installed_copy)
    originals = {p: (installed_copy / p).read_text(encoding="utf-8") for p in edited}
    try:
        for relpath, text in edited.items():
            (installed_copy / relpath).write_text(text, encoding="utf-8")
        patch = doctor(installed_copy)[variant.fix]
    finally:
        for relpath, text in originals.items():
            (installed_copy / relpath).write_text(text, encoding="utf-8")
    finding = str(patch["finding"])
    assert finding.startswith(
        "native (behaviour:" if variant.native else "needed (behaviour:"
    ), finding
    # A look-alike is needed: the plugin applies its fix, or says why it cannot.
    assert patch["state"] in (("native",) if variant.native else ("applied", "failed"))


def test_doctor_import_runs_the_cases_on_the_imported_classes(
    installed_copy: Path,
) -> None:
    """A look-alike of the V1 fix: the imported runner class fails the same case."""
    variant = pick("v1-phase-dispatch", False, tree_kind(release_root()))
    edited = variant.edit(installed_copy)
    originals = {p: (installed_copy / p).read_text(encoding="utf-8") for p in edited}
    try:
        for relpath, text in edited.items():
            (installed_copy / relpath).write_text(text, encoding="utf-8")
        patch = doctor(installed_copy, "--import")[variant.fix]
    finally:
        for relpath, text in originals.items():
            (installed_copy / relpath).write_text(text, encoding="utf-8")
    live = patch["live_evidence"]
    source = patch["evidence"]
    assert isinstance(live, dict) and isinstance(source, dict), patch
    assert live["how"] == "behaviour" and live["failed"], live
    assert live["failed"] == source["failed"], (live, source)
