"""vLLM's own ruff rule set, the bar the inserted code must pass.

Taken from the ``[tool.ruff]`` sections of vLLM's ``pyproject.toml`` (current
layout, as upstream's 0.2x trees carry it, e.g. 1CatAI/1Cat-vLLM at commit
25733d9cf98d47108ff4b8da2138aa121ad1d1b1, which inherits it unchanged). The
line length is ruff's default, 88, which vLLM uses since it moved from yapf to
``ruff format``.
"""

from __future__ import annotations

from pathlib import Path

LINE_LENGTH = 88
SELECT = ("E", "F", "UP", "B", "ISC", "SIM", "I", "G")
IGNORE = ("F405", "F403", "E731", "B905", "B007", "UP032")
PER_FILE_IGNORES = {
    "vllm/third_party/**": ("ALL",),
    "vllm/version.py": ("F401",),
    "vllm/_version.py": ("ALL",),
}


def _toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{value}"' for value in values) + "]"


def config_text(tree_root: Path) -> str:
    """A ``ruff.toml`` with vLLM's rules; ``tree_root`` makes ``vllm`` first-party."""
    ignores = "\n".join(
        f'"{pattern}" = {_toml_list(codes)}'
        for pattern, codes in PER_FILE_IGNORES.items()
    )
    return (
        f"line-length = {LINE_LENGTH}\n"
        f'src = ["{tree_root}"]\n'
        'target-version = "py310"\n'
        "\n[lint]\n"
        f"select = {_toml_list(SELECT)}\n"
        f"ignore = {_toml_list(IGNORE)}\n"
        "\n[lint.per-file-ignores]\n"
        f"{ignores}\n"
    )
