"""The patch registry: what each fix wraps, and the state it ended in.

A patch binds wrappers to named hook points of vLLM modules. Where a module is
not imported yet (the API server never imports the model runner), the patch
checks the module's source text now and wraps the module when it is imported,
through wrapt's post-import hooks, so the plugin costs the other processes
nothing.

Hook points on the per-step path are bound *inline*: wrapt installs a plain
function made from the original by a factory, instead of a ``FunctionWrapper``
whose descriptor and call protocol cost about 1 µs per call on a small host,
as much as the phase rule itself (bench/dispatch_cost.py measures both).
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import wrapt

from vllm_graphsafe.settings import DISABLE_ENV, Settings, read_settings

logger = logging.getLogger("vllm.graphsafe")

#: ``wrapper(wrapped, instance, args, kwargs)`` for wrapt's FunctionWrapper, or
#: for an inline hook point ``factory(original) -> replacement``.
Wrapper = Callable[..., Any]

#: Set on an inline replacement: the id of the patch that installed it.
INLINE_MARK = "__graphsafe_patch__"


def is_hooked(value: Any) -> bool:
    """Whether ``value`` is a wrapper that a patch installed."""
    return isinstance(value, wrapt.FunctionWrapper) or hasattr(value, INLINE_MARK)


class PatchState(str, enum.Enum):
    APPLIED = "applied"
    NATIVE = "native"
    NOT_APPLICABLE = "not applicable"
    DISABLED = "disabled"
    FAILED = "failed"


class PatchFailedError(RuntimeError):
    """Raised in strict mode when a patch cannot bind to this vLLM."""


@dataclass(frozen=True)
class HookPoint:
    """``qualname`` in ``module``, optionally required to be called from ``caller``.

    ``caller`` guards against a hook point that still exists but no longer runs
    where the fix needs it: its source must contain a call of the hook point.
    ``inline`` makes ``wrapper`` a factory of a plain replacement function, for
    hook points that run on every step.
    """

    module: str
    qualname: str
    wrapper: Wrapper
    caller: str | None = None
    inline: bool = False

    @property
    def symbol(self) -> str:
        return f"{self.module}.{self.qualname}"

    def install(self, owner: Any, attribute: str | None = None) -> Any:
        """Put this hook point's wrapper on ``owner`` (default: the leaf name).

        An inline factory runs before anything is replaced, so a factory that
        raises leaves ``owner`` untouched. An inline hook is never stacked on
        one a patch installed (a subclass inherits its base's, for instance).
        """
        attribute = attribute or self.qualname.rsplit(".", 1)[-1]
        if self.inline:
            if is_hooked(getattr(owner, attribute, None)):
                raise ValueError(f"{self.symbol} already carries a patch's hook")
            return wrapt.wrap_object(owner, attribute, self.wrapper)
        return wrapt.wrap_function_wrapper(owner, attribute, self.wrapper)


@dataclass
class Patch:
    """One fix, as data. Subclass and fill in the class attributes."""

    id: str = ""
    title: str = ""
    upstream: tuple[str, ...] = ()
    tested_against: tuple[str, ...] = ()
    delete_when: str = ""
    #: The module whose presence decides whether the patch applies at all.
    anchor_module: str = ""

    state: PatchState | None = field(default=None, init=False)
    reason: str = field(default="", init=False)
    _wrapped: list[tuple[Any, str, Any]] = field(default_factory=list, init=False)
    _armed: set[str] = field(default_factory=set, init=False)
    _source_reader: SourceReader | None = field(default=None, init=False)

    # -- what a concrete patch provides -------------------------------------

    def hook_points(self) -> list[HookPoint]:
        """The hook points in this release; ``self.sources`` tells which exist."""
        raise NotImplementedError

    def native_reason(self, sources: SourceReader) -> str | None:
        """Why this vLLM already has the fix natively, judged by its code."""
        raise NotImplementedError

    # -- lifecycle ------------------------------------------------------------

    @property
    def sources(self) -> SourceReader:
        if self._source_reader is None:
            self._source_reader = SourceReader()
        return self._source_reader

    def hook_modules(self) -> list[str]:
        return sorted({hook.module for hook in self.hook_points()})

    def decide(self, settings: Settings, sources: SourceReader) -> None:
        """Settle the state from settings and source text, wrapping nothing."""
        self._source_reader = sources
        if settings.is_disabled(self.id):
            self._set(PatchState.DISABLED, f"disabled by {DISABLE_ENV}")
            return
        if not sources.exists(self.anchor_module):
            self._set(
                PatchState.NOT_APPLICABLE, f"this vLLM has no {self.anchor_module}"
            )
            return
        native = self.native_reason(sources)
        if native is not None:
            self._set(PatchState.NATIVE, native)
            return
        missing = self._missing_in_source(sources)
        if missing is not None:
            self._set(PatchState.FAILED, missing)
            return
        modules = ", ".join(self.hook_modules())
        self._set(PatchState.APPLIED, f"wraps {modules} when imported")

    def arm(self) -> None:
        """Wrap each hook module now if imported, else when it is imported."""
        for module_name in self.hook_modules():
            if module_name not in self._armed:
                self._armed.add(module_name)
                wrapt.register_post_import_hook(self._on_import, module_name)
            elif module_name in sys.modules:
                self._on_import(sys.modules[module_name])

    def _on_import(self, module: ModuleType) -> None:
        if self.state is not PatchState.APPLIED:
            return
        hooks = [hook for hook in self.hook_points() if hook.module == module.__name__]
        with _LOCK:
            try:
                targets = [(hook, _resolve(hook)) for hook in hooks]
            except _MissingSymbolError as missing:
                self._fail(str(missing))
                return
            for hook, (parent, attr) in targets:
                if any(p is parent and a == attr for p, a, _ in self._wrapped):
                    continue
                original = (
                    vars(parent)[attr]
                    if isinstance(parent, type)
                    else getattr(parent, attr)
                )
                try:
                    installed = hook.install(parent, attr)
                except (TypeError, ValueError) as error:
                    self._fail(f"hook point {hook.symbol} cannot be bound: {error}")
                    return
                if hook.inline:
                    setattr(installed, INLINE_MARK, self.id)
                self._wrapped.append((parent, attr, original))
        self.reason = f"wrapped {len(self._wrapped)} hook point(s)"

    def remove(self) -> None:
        """Restore every wrapped attribute; the patch can be applied again."""
        with _LOCK:
            for parent, attr, original in reversed(self._wrapped):
                setattr(parent, attr, original)
            self._wrapped.clear()
        if self.state is PatchState.APPLIED:
            self._set(PatchState.DISABLED, "removed")

    def is_wrapped(self) -> bool:
        return bool(self._wrapped)

    # -- helpers --------------------------------------------------------------

    def _missing_in_source(self, sources: SourceReader) -> str | None:
        for hook in self.hook_points():
            text = sources.text(hook.module)
            if text is None:
                return f"hook point {hook.symbol} is missing: no module {hook.module}"
            leaf = hook.qualname.rsplit(".", 1)[-1]
            if not sources.defines(hook.module, hook.qualname):
                return f"hook point {hook.symbol} is missing"
            if hook.caller is not None:
                body = sources.function(hook.module, hook.caller)
                if body is None or f"{leaf}(" not in body:
                    return (
                        f"hook point {hook.symbol} is no longer called from "
                        f"{hook.module}.{hook.caller}"
                    )
        return None

    def _fail(self, reason: str) -> None:
        self.remove()
        self._set(PatchState.FAILED, reason)
        report_failure(self, reason)

    def _set(self, state: PatchState, reason: str) -> None:
        self.state = state
        self.reason = reason


class _MissingSymbolError(LookupError):
    pass


_LOCK = threading.RLock()


def _resolve(hook: HookPoint) -> tuple[Any, str]:
    module = sys.modules[hook.module]
    *parents, attr = hook.qualname.split(".")
    parent: Any = module
    for name in parents:
        parent = getattr(parent, name, None)
        if parent is None:
            raise _MissingSymbolError(f"hook point {hook.symbol} is missing")
    if not hasattr(parent, attr):
        raise _MissingSymbolError(f"hook point {hook.symbol} is missing")
    return parent, attr


def report_failure(patch: Patch, reason: str) -> None:
    message = (
        f"vllm-graphsafe: patch {patch.id} was not applied ({reason}); "
        "vLLM runs without this fix. Check `vllm-graphsafe doctor` for the "
        "supported releases."
    )
    if read_settings().strict:
        raise PatchFailedError(
            message + " Unset VLLM_GRAPHSAFE_STRICT to start without it."
        )
    logger.warning(message)


class SourceReader:
    """Reads vLLM module source text without importing the modules."""

    def __init__(self) -> None:
        self._texts: dict[str, str | None] = {}

    def exists(self, module: str) -> bool:
        return self.text(module) is not None

    def text(self, module: str) -> str | None:
        if module not in self._texts:
            self._texts[module] = _read_source(module)
        return self._texts[module]

    def defines(self, module: str, qualname: str) -> bool:
        text = self.text(module) or ""
        leaf = qualname.rsplit(".", 1)[-1]
        if "." in qualname:
            return self.function(module, qualname) is not None
        return f"def {leaf}(" in text or f" {leaf}" in text

    def function(self, module: str, qualname: str) -> str | None:
        """Source of ``def <leaf>(`` up to the next definition at its indentation."""
        text = self.text(module)
        if text is None:
            return None
        *owners, leaf = qualname.split(".")
        indent = "    " * len(owners)
        search_from = 0
        for depth, owner in enumerate(owners):
            found = text.find(f"\n{'    ' * depth}class {owner}(", search_from)
            if found < 0:
                found = text.find(f"\n{'    ' * depth}class {owner}:", search_from)
            if found < 0:
                return None
            search_from = found
        start = text.find(f"\n{indent}def {leaf}(", search_from)
        if start < 0:
            return None
        if owners:
            next_class = text.find("\nclass ", search_from + 1)
            if 0 <= next_class < start:
                return None
        end = len(text)
        for marker in (f"\n{indent}def ", f"\n{indent}@", f"\n{indent}async def "):
            found = text.find(marker, start + 1)
            if found >= 0:
                end = min(end, found)
        if indent:
            found = text.find("\nclass ", start + 1)
            if found >= 0:
                end = min(end, found)
        return text[start:end]


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
    for base in top_spec.submodule_search_locations or ():
        candidate = Path(base, *rest.split("."))
        for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if file.is_file():
                return str(file)
    try:  # an unusual layout (import hooks, zip files): ask the import system
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _read_source(module: str) -> str | None:
    path = _module_file(module)
    if path is None or not path.endswith(".py"):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


class Registry:
    def __init__(self, patches: Iterable[Patch]) -> None:
        self.patches = list(patches)

    def get(self, patch_id: str) -> Patch:
        for patch in self.patches:
            if patch.id == patch_id:
                return patch
        raise KeyError(patch_id)

    def apply_all(self, settings: Settings | None = None) -> None:
        """Decide every patch and arm those that apply. Idempotent."""
        settings = read_settings() if settings is None else settings
        sources = SourceReader()
        with _LOCK:
            for patch in self.patches:
                if patch.state is PatchState.APPLIED and not settings.is_disabled(
                    patch.id
                ):
                    continue
                if patch.is_wrapped():
                    patch.remove()
                patch.decide(settings, sources)
                if patch.state is PatchState.FAILED:
                    report_failure(patch, patch.reason)
                elif patch.state is PatchState.APPLIED:
                    patch.arm()

    def remove_all(self) -> None:
        for patch in self.patches:
            patch.remove()

    def states(self) -> dict[str, str]:
        return {p.id: p.state.value if p.state else "unset" for p in self.patches}

    def wrapped(self) -> list[str]:
        return [p.id for p in self.patches if p.is_wrapped()]

    def summary(self) -> str:
        return ", ".join(
            f"{p.id}={p.state.value if p.state else 'unset'}" for p in self.patches
        )
