"""The package imports without vLLM, and the doctor says plainly when it is missing."""

from __future__ import annotations

import subprocess
import sys

HIDE_VLLM = """
import importlib.abc, sys
class HideVllm(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, HideVllm())
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )


def test_importing_the_package_imports_no_vllm() -> None:
    result = run_python(
        "import sys\n"
        "import vllm_graphsafe, vllm_graphsafe.plugin, vllm_graphsafe.cli.main\n"
        "import vllm_graphsafe.registry\n"
        "vllm_graphsafe.registry.all_patches()\n"
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_package_imports_where_vllm_is_not_installed() -> None:
    result = run_python(
        HIDE_VLLM + "import vllm_graphsafe.plugin, vllm_graphsafe.cli.main"
    )
    assert result.returncode == 0, result.stderr


def test_doctor_without_vllm_says_so_in_one_sentence() -> None:
    result = run_python(
        HIDE_VLLM
        + "from vllm_graphsafe.cli.main import main\nraise SystemExit(main(['doctor']))"
    )
    assert result.returncode == 3
    message = result.stderr.strip()
    assert "vLLM is not installed" in message
    assert message.count("\n") == 0
