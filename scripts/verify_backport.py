#!/usr/bin/env python3
"""Prove the backport on one installed release: what CI runs per release.

Usage: scripts/verify_backport.py VENV [--fork TARBALL] [--keep]

Copies VENV's installed ``vllm`` package into a temporary tree (the copy is
edited, never the venv), backports it, and checks, one line per check:
``--check`` on the pristine copy says what is needed; ``git apply --check``
accepts ``--diff`` on a pristine copy; ``--write`` then a second ``--check``
exits 0; doctor reports ``native`` for each backported fix when the edited copy
comes first on ``PYTHONPATH``; ruff with vLLM's rule set finds nothing new in
the edited files; the tests the backport wrote pass on the edited tree and fail
on the pristine one; and the project's regression tests of each backported fix
pass on the edited copy with the plugin disabled. Exit status 0 when every
check passed, 1 when one failed, 3 for a bad VENV or TARBALL. The temporary
tree is deleted unless ``--keep``.

With ``--fork TARBALL`` the tree is a fork's ``vllm/`` package (a tarball, as
in ``../shared/forks``) made importable with VENV's compiled libraries, and
three more checks run: ``backport --verify`` passes on the edited tree, the
project's regression tests of each fix fail on the pristine fork (negative
control), and ``--format-patch`` output applies with ``git am`` to a
git-initialised pristine copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "src")]

from tests.support.backport_checks import (  # noqa: E402
    copy_package,
    find_ruff,
    new_findings,
    ruff_findings,
)
from tests.support.fix_tests import plugin_form_only  # noqa: E402

PLUGIN_OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}


#: Selects the regression tests of the backported fixes (``regression(ID)``
#: markers), like ``--negative-control=ID`` but for several ids at once.
SELECTION_PLUGIN = """\
import os


def pytest_collection_modifyitems(config, items):
    wanted = set(os.environ["GRAPHSAFE_VERIFY_FIXES"].split(","))
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("regression")
        selected = marker is not None and wanted & set(marker.args)
        (keep if selected else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
"""


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def report(self, ok: bool, name: str, detail: str = "") -> bool:
        self.failed += not ok
        suffix = f": {detail}" if detail else ""
        print(f"{'PASS' if ok else 'FAIL'} {name}{suffix}", flush=True)
        return ok


def run(
    command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def installed_package(python: str) -> Path | None:
    found = run(
        [
            python,
            "-c",
            "import importlib.util as u; s = u.find_spec('vllm'); "
            "print(s.submodule_search_locations[0] if s else '')",
        ]
    )
    location = found.stdout.strip()
    return Path(location) if found.returncode == 0 and location else None


def unpack_fork(tarball: Path, package: Path, tree_root: Path) -> None:
    """The fork's ``vllm/`` under ``tree_root``, with ``package``'s compiled
    libraries and version file, so that its runner classes import."""
    tree_root.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(tree_root, filter="data")
    for library in package.rglob("*.so"):
        relative = library.relative_to(package)
        if "deep_gemm" in relative.parts:
            continue
        (tree_root / "vllm" / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, tree_root / "vllm" / relative)
    shutil.copy2(package / "_version.py", tree_root / "vllm" / "_version.py")


def verify(venv: Path, workdir: Path, fork: Path | None = None) -> Checks:
    checks = Checks()
    python = str((venv / "bin" / "python").absolute())
    package = installed_package(python)
    if package is None:
        checks.report(False, "locate vllm", f"{venv} has no importable vllm package")
        return checks
    pristine, edited = workdir / "pristine", workdir / "edited"
    for root in (pristine, edited):
        if fork is None:
            copy_package(package, root)
        else:
            unpack_fork(fork, package, root)
    cli = [python, "-m", "vllm_graphsafe.cli.main", "backport"]

    first = run([*cli, "--tree", str(pristine), "--check"])
    needed = [
        line.split(":", 1)[0]
        for line in first.stderr.splitlines()
        if ": needed (" in line
    ]
    checks.report(
        first.returncode == (1 if needed else 0),
        "--check on the pristine copy",
        f"exit {first.returncode}; needed: {', '.join(needed) or 'none'}",
    )
    if not needed:
        return checks

    diff = run([*cli, "--tree", str(pristine), "--diff"])
    patch_file = workdir / "backport.diff"
    patch_file.write_text(diff.stdout, encoding="utf-8")
    applied = run(["git", "apply", "--check", str(patch_file)], cwd=pristine)
    checks.report(
        diff.returncode == 0 and applied.returncode == 0,
        "git apply --check of --diff on a pristine copy",
        (applied.stderr.strip().splitlines() or [""])[0],
    )

    written = run([*cli, "--tree", str(edited), "--write"])
    second = run([*cli, "--tree", str(edited), "--check"])
    checks.report(
        written.returncode == 0 and second.returncode == 0,
        "--write, then a second --check exits 0",
        f"exits {written.returncode}, {second.returncode}",
    )

    doctor = run(
        [python, "-m", "vllm_graphsafe.cli.main", "doctor", "--no-import", "--json"],
        env={"PYTHONPATH": str(edited)},
    )
    states = _doctor_states(doctor.stdout)
    checks.report(
        all(states.get(fix) == "native" for fix in needed),
        "doctor reports native with the edited copy first on PYTHONPATH",
        ", ".join(f"{fix}={states.get(fix)}" for fix in needed),
    )

    changed = [
        line.removeprefix("+++ b/")
        for line in diff.stdout.splitlines()
        if line.startswith("+++ b/") and line.endswith(".py")
    ]
    ruff = find_ruff(REPO)
    if ruff is None:
        checks.report(False, "ruff with vLLM's rules", "no ruff executable found")
    else:
        added = new_findings(
            ruff_findings(ruff, pristine, changed), ruff_findings(ruff, edited, changed)
        )
        checks.report(
            not added, "ruff with vLLM's rules finds nothing new", "; ".join(added)
        )

    tests = [
        path
        for path in changed
        if path.startswith("tests/") and Path(path).name.startswith("test_")
    ]
    for path in tests:
        (pristine / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(edited / path, pristine / path)
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    on_edited = run(
        [*pytest, "--rootdir", str(edited), *tests],
        env={**PLUGIN_OFF, "PYTHONPATH": str(edited)},
        cwd=edited,
    )
    checks.report(
        on_edited.returncode == 0,
        "written tests pass on the edited tree",
        _summary(on_edited),
    )
    on_pristine = run(
        [*pytest, "-rA", "--rootdir", str(pristine), *tests],
        env={**PLUGIN_OFF, "PYTHONPATH": str(pristine)},
        cwd=pristine,
    )
    outcomes: dict[str, dict[str, list[str]]] = {}
    for line in on_pristine.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            test = rest.split(" - ")[0]
            by_word = outcomes.setdefault(test.split("::")[0], {})
            by_word.setdefault(word, []).append(test)
    for path in tests:
        passed = outcomes.get(path, {}).get("PASSED", [])
        failed = outcomes.get(path, {}).get("FAILED", [])
        checks.report(
            bool(failed) and not passed,
            f"every test of {Path(path).name} fails on the pristine tree",
            f"{len(failed)} failed, {len(passed)} passed"
            + (f" ({', '.join(passed[:3])})" if passed else ""),
        )

    selector = workdir / "graphsafe_verify_selection.py"
    selector.write_text(SELECTION_PLUGIN, encoding="utf-8")
    regression = run(
        [
            *pytest,
            "-p",
            "graphsafe_verify_selection",
            "tests/release/classes",
            *(f"--deselect={test}" for test in plugin_form_only()),
        ],
        env={
            **PLUGIN_OFF,
            "PYTHONPATH": os.pathsep.join([str(edited), str(workdir)]),
            "GRAPHSAFE_VERIFY_FIXES": ",".join(needed),
        },
        cwd=REPO,
    )
    checks.report(
        regression.returncode == 0,
        f"regression tests of {', '.join(needed)} pass on the edited copy, "
        "plugin disabled",
        _summary(regression),
    )
    if fork is not None:
        fork_checks(checks, cli, python, workdir, needed, fork, package)
    return checks


def fork_checks(
    checks: Checks,
    cli: list[str],
    python: str,
    workdir: Path,
    needed: list[str],
    fork: Path,
    package: Path,
) -> None:
    """What a fork maintainer runs beyond a release copy's checks."""
    pristine, edited = workdir / "pristine", workdir / "edited"
    verified = run([*cli, "--tree", str(edited), "--verify", "--python", python])
    checks.report(
        verified.returncode == 0,
        "backport --verify passes on the edited tree",
        "; ".join(
            (verified.stdout + verified.stderr).strip().splitlines()
            or [f"exit {verified.returncode}"]
        ),
    )

    selector_path = str(workdir)
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    for fix in needed:
        control = run(
            [
                *pytest,
                "-p",
                "graphsafe_verify_selection",
                "tests/release/classes",
                *(f"--deselect={test}" for test in plugin_form_only()),
            ],
            env={
                **PLUGIN_OFF,
                "PYTHONPATH": os.pathsep.join([str(pristine), selector_path]),
                "GRAPHSAFE_VERIFY_FIXES": fix,
            },
            cwd=REPO,
        )
        summary = _summary(control)
        checks.report(
            control.returncode == 1 and " failed" in summary,
            f"regression tests of {fix} fail on the pristine fork, plugin disabled",
            summary,
        )

    patches, repository = workdir / "patches", workdir / "am"
    unpack_fork(fork, package, repository)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost"]
    outcome = run([*git, "init", "-q"], cwd=repository)
    steps: list[Callable[[], list[str]]] = [
        lambda: [*git, "add", "-A"],
        lambda: [*git, "commit", "-qm", "pristine fork"],
        lambda: [*cli, "--tree", str(repository), "--format-patch", str(patches)],
        lambda: [*git, "am", "-q", *sorted(map(str, patches.glob("*.patch")))],
    ]
    for step in steps:
        if outcome.returncode != 0:
            break
        outcome = run(step(), cwd=repository)
    count = len(list(patches.glob("*.patch"))) if patches.is_dir() else 0
    checks.report(
        outcome.returncode == 0 and count > 0,
        "--format-patch output applies with git am to a git-initialised pristine copy",
        f"{count} patch(es); "
        + ((outcome.stderr.strip().splitlines() or ["applied"])[0]),
    )


def _doctor_states(output: str) -> dict[str, str]:
    try:
        report = json.loads(output)
    except json.JSONDecodeError:
        return {}
    return {patch["id"]: patch["state"] for patch in report.get("patches", [])}


def _summary(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else f"exit {result.returncode}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path, help="a virtual environment with vLLM")
    parser.add_argument(
        "--fork",
        type=Path,
        metavar="TARBALL",
        help="a fork's vllm/ package as a .tar.gz, checked instead of VENV's copy",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree")
    args = parser.parse_args()
    if not (args.venv / "bin" / "python").is_file():
        print(f"{args.venv} is not a virtual environment (no bin/python).")
        return 3
    if args.fork is not None and not (
        args.fork.is_file() and tarfile.is_tarfile(args.fork)
    ):
        print(f"{args.fork} is not a tarball of a vllm/ package.")
        return 3
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="graphsafe-backport-"))
    try:
        checks = verify(args.venv, workdir, args.fork)
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    verdict = "all checks passed" if not checks.failed else f"{checks.failed} failed"
    print(f"{args.venv.name}: {verdict} in {elapsed:.0f} s")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
