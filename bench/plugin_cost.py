"""Benchmark 2, the plugin's cost to a vLLM process (run by ``dispatch_cost.py``).

In a fresh interpreter, with vLLM imported the way a vLLM process has it when it
loads its plugins, time ``import vllm_graphsafe.plugin; register()``; then import
the runner modules and time what the post-import wrapping adds to them.
Only :mod:`vllm_graphsafe.vllm_layout` (which imports only standard modules already
loaded) is loaded before :func:`time_register` times the plugin's import.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vllm_graphsafe import vllm_layout

V1_RUNNER = vllm_layout.V1_RUNNER
MRV2_RUNNER = vllm_layout.MRV2_RUNNER


def import_vllm(context: str) -> float:
    """Import vLLM as a process has it when plugins load; seconds taken."""
    started = time.perf_counter()
    importlib.import_module(vllm_layout.PACKAGE)
    if context == "process":
        # vLLM loads general plugins from EngineArgs (API server), the engine
        # core and the workers: vllm.config and the engine args are in by then.
        importlib.import_module(vllm_layout.ENGINE_ARG_UTILS)
    return time.perf_counter() - started


@contextmanager
def collector_pauses() -> Iterator[list[float]]:
    """Seconds of each garbage-collector pass inside the block."""
    pauses: list[float] = []
    started: list[float] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


def time_register() -> dict[str, Any]:
    modules_before = set(sys.modules)
    with collector_pauses() as pauses:
        started = time.perf_counter()
        plugin = importlib.import_module("vllm_graphsafe.plugin")
        plugin.register()
        elapsed = time.perf_counter() - started
    new_modules = set(sys.modules) - modules_before
    source = str(plugin.__file__)
    bytecode = Path(importlib.util.cache_from_source(source)).exists()
    return {
        "bytecode": "cached" if bytecode else "source",
        "package": str(Path(source).parent),
        "register_ms": elapsed * 1e3,
        "collector_ms": sum(pauses) * 1e3,
        "collector_passes": len(pauses),
        # Kept: from this user's cache (every later process); judged: from
        # vLLM's source (the first process of an installation).
        "verdicts": verdict_origin(plugin.registry().patches),
        "modules_imported": len(new_modules),
        "vllm_modules_imported": sorted(
            name for name in new_modules if name.split(".")[0] == "vllm"
        )[:40],
        "states": plugin.registry().states(),
    }


def verdict_origin(patches: list[Any]) -> str:
    """Where the patches' verdicts came from, "+"-joined where they differ."""
    return "+".join(sorted({str(patch.verdict_origin) for patch in patches}))


@contextmanager
def timed_import_machinery(totals: dict[str, float]) -> Iterator[None]:
    """Accumulate time spent in post-import hooks and in wrapt's import finder."""
    import wrapt.importer as importer

    hooks: dict[str, list[Any]] = getattr(importer, "_post_import_hooks", {})
    originals = {name: list(callbacks) for name, callbacks in hooks.items()}

    def timed_hook(callback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def hook(module: Any) -> Any:
            started = time.perf_counter()
            try:
                return callback(module)
            finally:
                totals["hooks_s"] += time.perf_counter() - started

        return hook

    for name, callbacks in originals.items():
        hooks[name] = [timed_hook(callback) for callback in callbacks]
    finders = [f for f in sys.meta_path if isinstance(f, importer.ImportHookFinder)]
    for finder in finders:
        original_find_spec = finder.find_spec

        def find_spec(*args: Any, _original: Any = original_find_spec) -> Any:
            started = time.perf_counter()
            spec = _original(*args)
            elapsed = time.perf_counter() - started
            if spec is None:
                # Not a hooked module: pure overhead on an ordinary import.
                totals["finder_s"] += elapsed
                totals["finder_calls"] += 1
            else:
                # A hooked module: includes the path search the import needs
                # anyway, done on the finder's behalf.
                totals["hooked_find_s"] += elapsed
            return spec

        # Timed on the instance, restored below (wrapt's stubs may not declare it).
        finder.find_spec = find_spec  # type: ignore[method-assign,unused-ignore]
    try:
        yield
    finally:
        for finder in finders:
            vars(finder).pop("find_spec", None)


def time_runner_imports() -> dict[str, Any]:
    """What the post-import wrapping adds to importing each runner module."""
    import wrapt.importer as importer

    pending = sorted(getattr(importer, "_post_import_hooks", {}))
    order = [m for m in (V1_RUNNER, MRV2_RUNNER) if m in pending or _exists(m)]
    order += [m for m in pending if m not in order]
    results: dict[str, Any] = {}
    for module in order:
        if module in sys.modules or not _exists(module):
            continue
        totals: dict[str, float] = defaultdict(float)
        with timed_import_machinery(totals):
            started = time.perf_counter()
            importlib.import_module(module)
            import_s = time.perf_counter() - started
        results[module] = {
            "import_s": import_s,
            "hooks_ms": totals["hooks_s"] * 1e3,
            "finder_ms": totals["finder_s"] * 1e3,
            "finder_calls": int(totals["finder_calls"]),
            "hooked_find_ms": totals["hooked_find_s"] * 1e3,
            "added_ms": (totals["hooks_s"] + totals["finder_s"]) * 1e3,
        }
    return results


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
