"""Finding and reading a vLLM module's source file, never importing it: its
text and its identity (the file's path and the SHA-256 of its bytes)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

#: A module's source text and its identity: (file path, SHA-256 of its bytes).
Source = tuple[str, tuple[str, str]]


def _decoded(path: str) -> Source | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text, (path, hashlib.sha256(data).hexdigest())


def read_tree_source(root: Path, module: str) -> Source | None:
    base = root.joinpath(*module.split("."))
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        found = _decoded(str(file))
        if found is not None:
            return found
    return None


def _module_file(module: str) -> str | None:
    """The file of ``module``, found without importing its parent packages.

    ``importlib.util.find_spec`` imports every parent package of a dotted
    name: in a process that has only ``vllm`` itself that runs package
    ``__init__`` files which take seconds (``vllm.v1.worker.gpu.spec_decode``
    imports ``vllm.config``). The package directories are searched first.
    """
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    if path is not None:
        return str(path)
    top, _, rest = module.partition(".")
    try:
        top_spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if top_spec is None:
        return None
    if not rest:
        return top_spec.origin
    searched = False
    for base in top_spec.submodule_search_locations or ():
        candidate = Path(base, *rest.split("."))
        for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if file.is_file():
                return str(file)
        searched = searched or Path(base, "__init__.py").is_file()
    if searched:
        # A plain package directory without the file: the module is absent
        # (asking the import system would import its parent packages).
        return None
    try:  # an unusual layout (import hooks, zip files): ask the import system
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def read_source(module: str) -> Source | None:
    path = _module_file(module)
    if path is None or not path.endswith(".py"):
        return None
    return _decoded(path)
