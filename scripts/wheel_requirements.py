#!/usr/bin/env python3
"""A wheel's requirements, one per line, less the ones named.

usage: wheel_requirements.py WHEEL [NAME ...]

scripts/install-venv.sh installs a vLLM release whose pinned requirement the
index does not serve (vllm 0.34.0 pins flashinfer-python==0.7.3) from the
release's other requirements and the wheel itself, without its dependencies.
Requirements of an extra are left out, markers are kept (pip evaluates them).
Standard library only.
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import HeaderParser

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
EXTRA = re.compile(r";.*\bextra\s*==")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: str, without: set[str]) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(
            n for n in archive.namelist() if n.endswith(".dist-info/METADATA")
        )
        text = archive.read(metadata).decode()
    kept = []
    for requirement in HeaderParser().parsestr(text).get_all("Requires-Dist") or []:
        name = NAME.match(requirement)
        if EXTRA.search(requirement) or name is None:
            continue
        if canonical(name.group(0)) not in without:
            kept.append(requirement)
    return kept


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        kept = requirements(argv[0], {canonical(name) for name in argv[1:]})
    except (OSError, zipfile.BadZipFile, StopIteration) as error:
        print(f"wheel_requirements.py: cannot read {argv[0]}: {error}", file=sys.stderr)
        return 1
    print("\n".join(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
