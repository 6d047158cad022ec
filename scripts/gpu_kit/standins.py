"""Stand-ins for the structured-output libraries the GPU kit does not carry.

vLLM 0.24.0 imports llguidance, xgrammar and apache-tvm-ffi (``tvm_ffi``) in
modules the engine loads, but calls them only for structured output (a grammar
or JSON schema in a request), which the kit's run never asks for. Together they
are about 48 MiB of wheels. Each stand-in imports, hands out a placeholder for
any name, and raises a plain error the moment one is used.
"""

from __future__ import annotations

from pathlib import Path

#: Each stand-in package and the submodules vLLM imports from it.
STANDINS: dict[str, tuple[str, ...]] = {
    "llguidance": ("hf", "torch"),
    "xgrammar": ("openai_tool_call_schema", "structural_tag"),
    "tvm_ffi": (),
}

TEMPLATE = '''"""Stand-in for {package} from vllm-graphsafe's GPU kit: it imports,
and any use raises (the kit runs no structured output)."""

__version__ = "0+graphsafe.standin"


class Unavailable:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "{package} is a stand-in in vllm-graphsafe's GPU kit: structured "
            "output is not available there"
        )

    def __class_getitem__(cls, item: object) -> type:
        return cls


def __getattr__(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    return Unavailable
'''


def write_standins(site: Path) -> list[str]:
    """Write every stand-in package into ``site``; the module names written."""
    written = []
    for package, submodules in STANDINS.items():
        folder = site / package
        folder.mkdir(parents=True, exist_ok=False)
        for module in ("__init__", *submodules):
            text = TEMPLATE.format(package=package)
            (folder / f"{module}.py").write_text(text, encoding="utf-8")
            written.append(package if module == "__init__" else f"{package}.{module}")
    return written
