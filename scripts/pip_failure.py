#!/usr/bin/env python3
"""One sentence for a ``pip install`` that failed: what, from where, why.

usage: pip_failure.py PIP_LOG [PIP_INSTALL_ARGS...]

Reads pip's output (PIP_LOG) and prints the sentence scripts/install-venv.sh
shows instead of it: the package pip could not install (else the ones asked
for), the indexes and links it looked in, the reason in pip's words, and where
its whole output is. Run with the venv's python, whose pip it asks where it
looks when its output does not say. Standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PYPI = "https://pypi.org/simple"
INDEXES = re.compile(r"^Looking in indexes: (.+)$", re.MULTILINE)
LINKS = re.compile(r"^Looking in links: (.+)$", re.MULTILINE)
NOT_FOUND = re.compile(
    r"^ERROR: No matching distribution found for (\S+)", re.MULTILINE
)
UNREACHABLE = re.compile(
    r"(Failed to establish a new connection: [^'\")]+"
    r"|Could not fetch URL [^:]+: [^\n]+"
    r"|Name or service not known|Temporary failure in name resolution"
    r"|Read timed out|Connection refused)"
)
ERROR = re.compile(r"^ERROR: (.+)$", re.MULTILINE)
CREDENTIALS = re.compile(r"//[^/@\s]+@")
OFF = {"", "0", "false", "no", "off"}


def redacted(url: str) -> str:
    return CREDENTIALS.sub("//****@", url)


def requested(args: Sequence[str]) -> list[str]:
    """The requirements of a ``pip install`` command line (options left out)."""
    packages: list[str] = []
    editable = False
    for arg in args:
        if arg in ("-e", "--editable"):
            editable = True
            continue
        if arg.startswith("-"):
            continue
        packages.append(f"{Path(arg).name} (editable)" if editable else arg)
        editable = False
    return packages


def configured_no_index(environ: dict[str, str], pip_config: str) -> bool:
    if environ.get("PIP_NO_INDEX", "").strip().lower() not in OFF:
        return True
    return re.search(r"\.no-index='(?!0|false|no|off)", pip_config) is not None


def pip_config() -> str:
    """``pip config list`` of the running interpreter's pip ('' if it fails)."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout


def where(output: str, no_index: bool) -> str:
    """Where pip looked, in words."""
    indexes = INDEXES.search(output)
    links = LINKS.search(output)
    if indexes:
        place = f"the index {redacted(indexes.group(1).strip())}"
    elif no_index:
        place = "no index (pip's --no-index)"
    else:
        place = f"the index {PYPI}"
    if links:
        place += f" and the links {redacted(links.group(1).strip())}"
    return place


def reason(output: str) -> str:
    """Why, in pip's words (its last error, or the index it could not reach)."""
    unreachable = UNREACHABLE.search(output)
    if unreachable:
        return f"the index could not be reached ({unreachable.group(1).strip()})"
    if NOT_FOUND.search(output):
        return "no version of it was found there"
    errors = ERROR.findall(output)
    if errors:
        return errors[-1].strip().rstrip(".")
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip().rstrip(".") if lines else "pip printed nothing"


def sentence(output: str, args: Sequence[str], log: str, no_index: bool = False) -> str:
    missing = NOT_FOUND.search(output)
    what = missing.group(1) if missing else ", ".join(requested(args)) or "packages"
    return (
        f"pip could not install {what} from {where(output, no_index)}: "
        f"{reason(output)}; point pip at an index that has it with PIP_INDEX_URL, "
        f'PIP_EXTRA_INDEX_URL or pip.conf (README, "The demo"); pip\'s output is '
        f"in {log}."
    )


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    log = argv[0]
    try:
        output = Path(log).read_text(errors="replace")
    except OSError:
        output = ""
    no_index = configured_no_index(dict(os.environ), pip_config())
    print(sentence(output, argv[1:], log, no_index))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
