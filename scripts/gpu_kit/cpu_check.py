#!/usr/bin/env python3
"""Check on a CPU what a CPU can check of the GPU kit.

usage: python3 scripts/gpu_kit/cpu_check.py [--kit DIR] [--venv DIR] [--python EXE]

It makes (once) a Python 3.12 environment holding what the GPU machine's image
holds for vLLM (``image-packages.txt``: torch 2.11.0 with CUDA 13 and its
nvidia-* libraries, several GB) and nothing it lacks, unpacks the kit there as
``device.sh`` does, and checks, with an H100's capability stood in for the
missing GPU:

- ``cuobjdump`` (Triton's) lists only sm_90 cubins in the cut extensions, no
  PTX, and exactly as many others as the build put in as stand-ins;
- the cut extensions load and register the operators the run calls;
- every engine module the run needs imports, the plugin's hooks bind
  (``doctor --import``) and the step recorder wraps its functions;
- the run's engine configuration builds, with cudagraph_mode FULL_DECODE_ONLY.

Exit statuses: 0 every check passed; 1 a check failed; 2 bad command line;
3 the environment could not be made (pip, or no Python 3.12); 4 no kit built.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENV, EXIT_NO_KIT = 0, 1, 2, 3, 4
PYTHON = "/root/.pyenv/versions/3.12.1/bin/python3.12"
#: Operators the run calls from the compiled extensions (library, name).
OPERATORS = (
    ("_C", "rms_norm"),
    ("_C", "silu_and_mul"),
    ("_C", "rotary_embedding"),
    ("_C", "weak_ref_tensor"),
    ("_C_cache_ops", "reshape_and_cache_flash"),
    ("_moe_C", "moe_align_block_size"),
    ("_moe_C", "topk_softmax"),
    ("_moe_C", "moe_sum"),
    ("_vllm_fa3_C", "fwd"),
)
#: The modules an engine of the run loads, beyond what ``vllm.LLM`` imports.
ENGINE_MODULES = (
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.cudagraph_dispatcher",
    "vllm.compilation.cuda_graph",
    "vllm.model_executor.models.qwen3_next",
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.gdn_attn",
    "vllm.v1.attention.backends.fa_utils",
    "vllm.v1.spec_decode.ngram_proposer",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.sample.sampler",
    "vllm.vllm_flash_attn",
    "vllm_graphsafe.plugin",
    "tests.support.step_recorder",
)


# -- outside: the environment and the unpacked kit ---------------------------------


def make_venv(venv: Path, python: str) -> None:
    """The check environment, made once; brought up to image-packages.txt each run."""
    if not (venv / "bin" / "python").is_file():
        if shutil.which(python) is None:
            raise SystemExit(_fail(f"no Python 3.12 at {python} (--python)", EXIT_ENV))
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    done = subprocess.run([*pip, "-r", str(HERE / "image-packages.txt")], check=False)
    if done.returncode != 0:
        raise SystemExit(
            _fail(
                "pip could not install image-packages.txt into the "
                "check environment (its output is above)",
                EXIT_ENV,
            )
        )


def stub_driver(site: Path, folder: Path) -> Path:
    """A stand-in for the GPU driver's libcuda.so.1, which the extensions link:
    every driver function they name, each answering CUDA_ERROR_NO_DEVICE (100)."""
    names: set[str] = set()
    for library in (site / "vllm").rglob("*.so"):
        listing = subprocess.run(
            ["nm", "-D", "--undefined-only", str(library)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        names |= {word for word in listing.split() if re.fullmatch(r"cu[A-Z]\w*", word)}
    folder.mkdir(parents=True)
    source = folder / "libcuda.c"
    source.write_text(
        "".join(f"int {name}(void) {{ return 100; }}\n" for name in sorted(names))
    )
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(folder / "libcuda.so.1"),
            "-Wl,-soname,libcuda.so.1",
            str(source),
        ],
        check=True,
    )
    return folder


def _fail(message: str, status: int) -> int:
    print(f"cpu_check.py: {message}", file=sys.stderr)
    return status


def unpack(kit: Path, site: Path, python: Path) -> None:
    """The kit's archive and this project's wheel, installed as device.sh does."""
    import tarfile

    with tarfile.open(kit / "site.tar.xz") as archive:
        archive.extractall(site, filter="data")
    (wheel,) = kit.glob("vllm_graphsafe-*.whl")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
    )


def outside(args: argparse.Namespace) -> int:
    kit: Path = args.kit
    if not (kit / "site.tar.xz").is_file():
        return _fail(
            f"no kit at {kit}: build it first (scripts/gpu_kit/build.py)", EXIT_NO_KIT
        )
    make_venv(args.venv, args.python)
    python = args.venv / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="gpu-kit-check-") as scratch:
        site = Path(scratch) / "site"
        unpack(kit, site, python)
        driver = stub_driver(site, Path(scratch) / "driver")
        env = {
            **os.environ,
            # The checkout too: tests/support has the step recorder, the tiny model.
            "PYTHONPATH": os.pathsep.join((str(site), str(ROOT))),
            "LD_LIBRARY_PATH": str(driver),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_USE_V2_MODEL_RUNNER": "0",
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(Path(scratch) / "cache"),
            "GRAPHSAFE_CACHE_DIR": "off",
            "GRAPHSAFE_TEST_STEP_DIR": str(Path(scratch) / "steps"),
        }
        command = [
            str(python),
            __file__,
            "--inside",
            "--kit",
            str(kit),
            "--site",
            str(site),
            "--scratch",
            scratch,
        ]
        return subprocess.run(command, env=env, check=False).returncode


# -- inside: the checks, in the Python 3.12 environment -----------------------------


class Checks:
    def __init__(self) -> None:
        self.passed: list[str] = []
        self.failed: list[str] = []

    def run(self, name: str, check: Callable[[], str]) -> None:
        try:
            detail = check()
        except Exception as error:  # a check's failure is reported, never raised
            self.failed.append(name)
            print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
        else:
            self.passed.append(name)
            print(f"PASS {name}: {detail}", flush=True)


def cuobjdump() -> str:
    import triton

    found = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not found.is_file():
        raise FileNotFoundError("Triton's cuobjdump is not in this environment")
    return str(found)


def check_listing(site: Path, manifest: dict[str, Any]) -> str:
    tool = cuobjdump()
    lines = []
    for name, summary in manifest["cut"].items():
        path = site / name
        elves = subprocess.run(
            [tool, "--list-elf", str(path)], capture_output=True, text=True, check=True
        ).stdout.split()
        arches = [word.rsplit(".", 2)[-2] for word in elves if word.endswith(".cubin")]
        others = [a for a in arches if a not in ("sm_90", "sm_90a")]
        ptx = subprocess.run(
            [tool, "--list-ptx", str(path)], capture_output=True, text=True, check=False
        ).stdout.count(".ptx")
        if ptx or len(others) != summary["fallbacks"]:
            raise AssertionError(
                f"{name}: {ptx} PTX, {len(others)} cubins of other "
                f"architectures, {summary['fallbacks']} put in as stand-ins"
            )
        lines.append(f"{Path(name).name} {len(arches) - len(others)} sm_90")
    return "; ".join(lines) + " (every other cubin a stand-in the build put in)"


def stand_in_h100() -> str:
    """Make vLLM's current platform a CUDA platform that reports an H100."""
    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class StoodInH100(CudaPlatform):  # type: ignore[misc]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(major=9, minor=0)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H100 80GB HBM3 (stood in)"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 << 30

    vllm.platforms.current_platform = StoodInH100()
    return f"{CudaPlatform.__name__} reporting capability 9.0"


def check_operators() -> str:
    import torch

    importlib.import_module("vllm._C_stable_libtorch")
    importlib.import_module("vllm._moe_C_stable_libtorch")
    importlib.import_module("vllm.vllm_flash_attn")
    missing = [
        f"{lib}::{op}"
        for lib, op in OPERATORS
        if not hasattr(getattr(torch.ops, lib), op)
    ]
    if missing:
        raise AssertionError("not registered: " + ", ".join(missing))
    return ", ".join(f"{lib}::{op}" for lib, op in OPERATORS)


def check_modules(site: Path) -> str:
    import vllm

    for name in ENGINE_MODULES:
        importlib.import_module(name)
    kit_packages = sorted(
        {
            name.split(".")[0]
            for name, module in list(sys.modules.items())
            if str(getattr(module, "__file__", "") or "").startswith(str(site))
        }
    )
    return (
        f"vLLM {vllm.__version__}: {len(ENGINE_MODULES)} modules; packages loaded "
        f"from the kit: {', '.join(kit_packages)}"
    )


def unresolved_imports(site: Path) -> dict[str, list[str]]:
    """Packages named by an import anywhere in a loaded vLLM module (in functions
    too) that this environment cannot find: what the run would fail on if it
    reached that import."""
    missing: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        path = str(getattr(module, "__file__", "") or "")
        if not name.startswith("vllm.") or not path.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            for top in {n.split(".")[0] for n in names}:
                if importlib.util.find_spec(top) is None:
                    missing.setdefault(top, []).append(name)
    return missing


def check_config(scratch: Path) -> str:
    import run
    from vllm.config import CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs

    from tests.support.tiny_hybrid import build_tiny_hybrid_model

    model = str(build_tiny_hybrid_model(scratch / "models"))
    shapes = []
    for k, engine in ((k, e) for k in (3, 0) for e in ("eager", "tput-on", "on")):
        kwargs = run.engine_kwargs(k, engine, run.DTYPE)
        config = EngineArgs(model=model, **kwargs).create_engine_config()
        mode = config.compilation_config.cudagraph_mode
        expected = (
            CUDAGraphMode.NONE if engine == "eager" else CUDAGraphMode.FULL_DECODE_ONLY
        )
        if mode != expected:
            raise AssertionError(f"K={k}, {engine}: cudagraph_mode became {mode}")
        if engine != "on":
            continue
        sizes = config.compilation_config.cudagraph_capture_sizes
        shapes.append(
            f"K={k}: capture sizes {sizes}, mamba cache mode "
            f"{config.cache_config.mamba_cache_mode}, speculative "
            f"{getattr(config.speculative_config, 'method', None)}"
        )
    return f"FULL_DECODE_ONLY kept (NONE when eager); {'; '.join(shapes)}"


def check_doctor() -> str:
    from vllm_graphsafe.cli.main import main as cli

    with tempfile.TemporaryFile("w+") as out:
        saved, sys.stdout = sys.stdout, out
        try:
            status = cli(["doctor", "--import", "--json"])
        finally:
            sys.stdout = saved
        out.seek(0)
        report = json.loads(out.read())
    states = {p["id"]: p["state"] for p in report["patches"]}
    if status != 0 or report["import_errors"]:
        raise AssertionError(
            f"doctor exit {status}, states {states}, "
            f"import errors {report['import_errors']}"
        )
    return ", ".join(f"{fix}={state}" for fix, state in states.items())


def check_recorder() -> str:
    from tests.support import step_recorder

    wrapped = step_recorder.RUNNER_MODULE
    runner = importlib.import_module(wrapped)
    if not hasattr(runner.GPUModelRunner.execute_model, "__wrapped__"):
        raise AssertionError("GPUModelRunner.execute_model is not wrapped")
    return f"{wrapped}.GPUModelRunner.execute_model and the dispatcher wrapped"


def inside(args: argparse.Namespace) -> int:
    import torch

    site, scratch = Path(args.site), Path(args.scratch)
    manifest = json.loads((args.kit / "manifest.json").read_text())
    sys.path.insert(0, str(args.kit))
    checks = Checks()
    checks.run("torch", lambda: _torch_is_the_gpu_machines(torch))
    checks.run("cut extensions (cuobjdump)", lambda: check_listing(site, manifest))
    checks.run("H100 stood in", stand_in_h100)
    checks.run("operators registered", check_operators)
    checks.run("engine modules import", lambda: check_modules(site))
    checks.run("step recorder binds", check_recorder)
    checks.run("plugin binds (doctor --import)", check_doctor)
    checks.run("engine configuration", lambda: check_config(scratch))
    for package, modules in sorted(unresolved_imports(site).items()):
        print(
            f"NOTE an import of {package} is not resolvable, in {len(modules)} loaded "
            f"vLLM module(s), e.g. {modules[0]}"
        )
    print(f"{len(checks.passed)} passed, {len(checks.failed)} failed")
    return EXIT_FAILED if checks.failed else EXIT_OK


def _torch_is_the_gpu_machines(torch: Any) -> str:
    if not torch.__version__.startswith("2.11.0") or torch.version.cuda != "13.0":
        raise AssertionError(f"torch {torch.__version__} CUDA {torch.version.cuda}")
    python = sys.version.split()[0]
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {python}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, default=ROOT / ".gpu-kit")
    parser.add_argument(
        "--venv", type=Path, default=ROOT / ".gpu-kit-build" / "check-venv"
    )
    parser.add_argument(
        "--python", default=PYTHON, help=f"a Python 3.12 (default {PYTHON})"
    )
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--site", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.kit = args.kit.resolve()
    return inside(args) if args.inside else outside(args)


if __name__ == "__main__":
    sys.exit(main())
