"""Doctor right after vLLM changes in place, with the verdicts kept from before.

``pip install -U vllm`` rewrites the package's files where they are. Here a
copy of the installed release stands first on ``PYTHONPATH``; doctor runs once
(it keeps each fix's verdict), then the copy gets the upstream form of the V1
phase fix written into it (the backport's edit), and doctor must see it at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_graphsafe.backport import backport

REPO = Path(__file__).resolve().parents[3]
V1 = "v1-phase-dispatch"


def doctor_report(tree: Path, cache: Path) -> list[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHSAFE_")} | {
        "GRAPHSAFE_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join((str(tree), str(REPO / "src"))),
    }
    result = subprocess.run(
        [sys.executable, "-m", "vllm_graphsafe.cli.main", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(result.stdout)
    assert all(p["reason"] for p in report["patches"])
    patches: list[dict[str, str]] = report["patches"]
    return patches


def doctor_states(tree: Path, cache: Path) -> dict[str, str]:
    return {patch["id"]: patch["state"] for patch in doctor_report(tree, cache)}


def test_doctor_tells_the_truth_after_an_in_place_upgrade(
    tree_copy: Callable[[], Path], tmp_path: Path
) -> None:
    tree, cache = tree_copy(), tmp_path / "verdicts"
    before = doctor_states(tree, cache)
    assert before[V1] == "applied"
    assert any(cache.iterdir()), "doctor kept no verdict"
    kept = doctor_report(tree, cache)
    assert {p["id"]: p["state"] for p in kept} == before, "a kept verdict changed it"
    assert {p["verdict"] for p in kept} == {"kept"}

    edits = backport(tree, [V1]).edited
    assert edits
    for relpath, text in edits.items():
        (tree / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tree / relpath).write_text(text)

    upgraded = {p["id"]: p for p in doctor_report(tree, cache)}
    assert upgraded[V1]["state"] == "native", upgraded[V1]
    assert upgraded[V1]["verdict"] == "judged", "a verdict of the old files was used"
    assert {k: p["state"] for k, p in upgraded.items() if k != V1} == {
        k: v for k, v in before.items() if k != V1
    }


#: A process that loads the plugin as vLLM does; prints each patch's verdict
#: origin and the modules it parsed.
REGISTER = """
import json
from vllm_graphsafe.sources import SourceReader
parsed = set()
tree = SourceReader.tree
def counting_tree(reader, module):
    parsed.add(module)
    return tree(reader, module)
SourceReader.tree = counting_tree
import vllm_graphsafe.plugin as plugin
plugin.register()
patches = plugin.registry().patches
print(json.dumps({
    "verdicts": {p.id: p.verdict_origin for p in patches},
    "parsed": sorted(parsed),
}))
"""


def registered_process(tree: Path, cache: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHSAFE_")} | {
        "GRAPHSAFE_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join((str(tree), str(REPO / "src"))),
    }
    result = subprocess.run(
        [sys.executable, "-c", REGISTER],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return found


def test_after_one_doctor_run_a_forks_serving_process_parses_nothing(
    tree_copy: Callable[[], Path], tmp_path: Path
) -> None:
    tree, cache = tree_copy(), tmp_path / "verdicts"
    for relpath, text in backport(tree, [V1]).edited.items():
        (tree / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tree / relpath).write_text(text)
    first = registered_process(tree, tmp_path / "another-cache")
    assert first["verdicts"][V1] == "judged", "an edited tree matched a kept verdict"
    assert first["parsed"], "a judged verdict read no vLLM source"

    assert doctor_states(tree, cache)[V1] == "native"
    served = registered_process(tree, cache)
    assert set(served["verdicts"].values()) == {"kept"}, served
    assert served["parsed"] == []
