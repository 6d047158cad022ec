"""Judge every fix on each CI release's installed vLLM and write the verdicts
this package ships (``src/vllm_graphsafe/data/verdicts.json``).

Run it after changing a rule file (the fixes, the source reader, the outline):
the table is used only while its rules digest matches the package's, and a
unit test fails until it is made again.

usage: python scripts/ship_verdicts.py [PYTHON ...]
  PYTHON  the interpreter of a venv with vLLM and this package (default: the
          CI releases' venvs under .venvs/, or $GRAPHSAFE_VENVS)

Exit status: 0 written; 1 a venv is missing, names no vLLM, or its judgement
failed (nothing written); 2 bad usage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vllm_graphsafe import releases  # noqa: E402
from vllm_graphsafe.shipped_verdicts import (  # noqa: E402
    SHIPPED_FILE,
    ShippedVerdict,
    rules_digest,
    table,
)

CHILD = """
import json
from vllm_graphsafe import shipped_verdicts as s
from vllm_graphsafe.fixes import all_patches
release = s.installed_release()
if release is None:
    raise SystemExit("no vLLM distribution is installed")
judged = s.judge_installed(release, all_patches())
print(json.dumps({"rules": s.rules_digest(), "release": release,
                  "verdicts": [v.to_json() for v in judged]}))
"""


def default_pythons() -> list[Path]:
    venvs = Path(os.environ.get("GRAPHSAFE_VENVS") or ROOT / ".venvs")
    return [
        venvs / releases.venv_name(release) / "bin" / "python"
        for release in releases.ci_releases()
    ]


def judged_in(python: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    result = subprocess.run(
        [str(python), "-c", CHILD],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python}: judging failed ({last})")
    answer: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def main(argv: list[str]) -> int:
    if any(arg.startswith("-") for arg in argv):
        print(__doc__.split("usage:")[1].split("Exit")[0].rstrip(), file=sys.stderr)
        return 2
    pythons = [Path(arg) for arg in argv] or default_pythons()
    missing = [str(p) for p in pythons if not p.exists()]
    if missing:
        print(f"ship_verdicts: no interpreter at {', '.join(missing)}", file=sys.stderr)
        return 1
    rules = rules_digest()
    verdicts: list[ShippedVerdict] = []
    for python in pythons:
        try:
            answer = judged_in(python)
        except RuntimeError as error:
            print(f"ship_verdicts: {error}", file=sys.stderr)
            return 1
        if answer["rules"] != rules:
            print(f"ship_verdicts: {python} judged with other rules", file=sys.stderr)
            return 1
        entries = answer["verdicts"]
        assert isinstance(entries, list)
        for entry in entries:
            shipped = ShippedVerdict.from_json(entry)
            assert shipped is not None, entry
            verdicts.append(shipped)
        print(f"{answer['release']}: {len(entries)} verdicts")
    text = json.dumps(table(verdicts, rules), indent=1, sort_keys=False) + "\n"
    SHIPPED_FILE.write_text(text)
    print(f"wrote {SHIPPED_FILE.relative_to(ROOT)} ({len(verdicts)} verdicts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
