"""The patch registry: what each fix hooks, what it reads, and its state.

A patch binds hooks to named points of vLLM modules. Where a module is not
imported yet (the API server never imports the model runner), the patch judges
the module's source now and hooks it when it is imported, through wrapt's
post-import hooks, so the plugin costs the other processes nothing.

Two kinds of hook point:

* :class:`WrapHook` puts a wrapt ``FunctionWrapper`` around the target, for
  calls off the per-step path (dummy runs);
* :class:`ReplaceHook` installs what a factory makes from the original: a
  plain function (or descriptor) with the original's calling convention, for
  the per-step path, where a ``FunctionWrapper``'s descriptor and call
  protocol would cost about as much as the rule itself.

A hook that meets an unexpected error in this project's code at run time calls
the ``on_failure`` it was bound with (:meth:`Patch.fail_open`): the patch is
removed in that process and marked ``failed``, and the hook returns vLLM's own
answer. Strict mode re-raises instead.
"""

from __future__ import annotations

import enum
import logging
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import wrapt

from vllm_graphsafe.behaviour.judgement import (
    BEHAVIOUR,
    Evidence,
    by_reading,
    settled,
)
from vllm_graphsafe.hook_points import (
    ORIGINAL_MARK,
    REPLACEMENT_MARK,
    Factory,
    HookPoint,
    OnFailure,
    ReplaceHook,
    Requirement,
    SetsAttribute,
    SourceCheck,
    TakesParameters,
    WrapHook,
    Wrapper,
    is_hooked,
    original_of,
    unhooked,
)
from vllm_graphsafe.settings import DISABLE_ENV, Settings, read_settings
from vllm_graphsafe.shipped_verdicts import shipped_verdicts
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.verdicts import (
    Origin,
    Verdict,
    judged,
    judged_with_origin,
    verdict_cache,
)

# Found here by callers (hooks, tests) as before the hook points had a module.
__all__ = [
    "ORIGINAL_MARK",
    "REPLACEMENT_MARK",
    "Factory",
    "HookPoint",
    "OnFailure",
    "ReplaceHook",
    "Requirement",
    "SetsAttribute",
    "SourceCheck",
    "SourceReader",
    "TakesParameters",
    "WrapHook",
    "Wrapper",
    "is_hooked",
    "judged",
    "original_of",
    "unhooked",
    "verdict_cache",
]

logger = logging.getLogger("vllm.graphsafe")


class PatchState(str, enum.Enum):
    APPLIED = "applied"
    NATIVE = "native"
    NOT_APPLICABLE = "not applicable"
    DISABLED = "disabled"
    FAILED = "failed"


class PatchFailedError(RuntimeError):
    """Raised in strict mode when a patch cannot bind to this vLLM."""


@dataclass
class Patch:
    """One fix, its facts as data. Subclass and fill in the fields.

    The releases it is verified on come from ``data/releases.json``
    (:attr:`verified_on`); everything users and the README read about a patch
    is rendered from these fields (:mod:`vllm_graphsafe.catalogue`).
    """

    id: str = ""
    title: str = ""
    #: What it changes, in one or two sentences.
    what: str = ""
    #: Why: the failure it prevents.
    why: str = ""
    #: The vLLM code it hooks, for the catalogue.
    binds_to: str = ""
    upstream: tuple[str, ...] = ()
    delete_when: str = ""
    #: Why it does not apply where ``anchor_module`` is absent, in words.
    absent: str = ""
    #: The module whose presence decides whether the patch applies at all.
    anchor_module: str = ""

    state: PatchState | None = field(default=None, init=False)
    reason: str = field(default="", init=False)
    _wrapped: list[tuple[Any, str, Any, Any]] = field(default_factory=list, init=False)
    _armed: set[str] = field(default_factory=set, init=False)
    _source_reader: SourceReader | None = field(default=None, init=False)
    #: The hooked modules of the last verdict (None: ask the hook points).
    _judged_modules: tuple[str, ...] | None = field(default=None, init=False)
    #: Where the verdict last applied came from (kept, shipped or judged).
    verdict_origin: Origin | None = field(default=None, init=False)
    #: How the last verdict decided native or needed (None: no anchor module).
    evidence: Evidence | None = field(default=None, init=False)
    _settings: Settings | None = field(default=None, init=False)
    _failed_at_run_time: bool = field(default=False, init=False)

    # -- what a concrete patch provides -------------------------------------

    def hook_points(self) -> list[HookPoint]:
        """The hook points in this release; ``self.sources`` tells which exist."""
        raise NotImplementedError

    def reads(self) -> list[Requirement]:
        """What the hooks read from vLLM objects, checked in source at decide."""
        return []

    def native_reason(self, sources: SourceReader) -> str | None:
        """Reading the code: why this vLLM already has the fix natively (None:
        no fix found). The fallback where its behaviour cannot be run."""
        raise NotImplementedError

    def behaviour(self, sources: SourceReader) -> Evidence | None:
        """The fix's cases run on the code ``sources`` reads, compiled from it
        (never imported); None where the fix declares no cases."""
        return None

    def live_behaviour(self) -> Evidence | None:
        """The fix's cases run on the imported vLLM's own classes (as vLLM
        defines them, without this package's hooks); None where the fix
        declares no cases or its modules are not imported."""
        return None

    def confirm_behaviour(self) -> Evidence | None:
        """What a process that imports the runner runs to confirm a native
        verdict (:meth:`confirm_native_when_imported`): the live cases, or
        the part of them the source cannot already tell."""
        return self.live_behaviour()

    def live_modules(self) -> list[str]:
        """The modules :meth:`live_behaviour` needs imported."""
        return [self.anchor_module]

    #: What a native verdict says the code does (before its evidence).
    native_summary: ClassVar[str] = "this vLLM has the fix"

    def native_evidence(self, sources: SourceReader) -> Evidence:
        """How native this code is: by its behaviour on the fix's cases where
        they run, else by reading it (the evidence says why)."""
        could_not_run = "the fix declares no cases to run"
        try:
            evidence = self.behaviour(sources)
        except Exception as error:  # the harness itself met code it cannot run
            evidence = None
            could_not_run = f"{type(error).__name__}: {error}"
        if evidence is not None:
            if settled(evidence):
                return evidence
            could_not_run = evidence.could_not_run or could_not_run
        return by_reading(self.native_reason(sources), could_not_run)

    # -- facts ------------------------------------------------------------------

    @property
    def verified_on(self) -> tuple[str, ...]:
        from vllm_graphsafe.releases import verified_releases

        return verified_releases(self.id)

    @property
    def tested_against(self) -> tuple[str, ...]:
        """Deprecated name of :attr:`verified_on`."""
        return self.verified_on

    # -- lifecycle ------------------------------------------------------------

    @property
    def sources(self) -> SourceReader:
        if self._source_reader is None:
            self._source_reader = SourceReader()
        return self._source_reader

    @property
    def strict(self) -> bool:
        settings = self._settings if self._settings is not None else read_settings()
        return settings.strict

    def hook_modules(self) -> list[str]:
        if self._judged_modules is not None:
            return list(self._judged_modules)
        return sorted({hook.module for hook in self.hook_points()})

    def judge(self, sources: SourceReader) -> Verdict:
        """What vLLM's source alone decides about this patch (no settings)."""
        self._source_reader = sources
        self._judged_modules = None
        if not sources.exists(self.anchor_module):
            return Verdict(anchor_exists=False)
        evidence = self.native_evidence(sources)
        if evidence.native:
            return Verdict(
                anchor_exists=True,
                native=f"{self.native_summary} ({evidence.text()})",
                evidence=evidence,
            )
        missing = self._missing_in_source(sources)
        if missing is not None:
            return Verdict(anchor_exists=True, missing=missing, evidence=evidence)
        return Verdict(
            anchor_exists=True,
            hook_modules=tuple(self.hook_modules()),
            evidence=evidence,
        )

    def decide(
        self, settings: Settings, sources: SourceReader, verdict: Verdict | None = None
    ) -> None:
        """Settle the state from settings and source code (or its ``verdict``,
        judged on these sources before), hooking nothing."""
        verdict = self.judge(sources) if verdict is None else verdict
        self._source_reader = sources
        self._settings = settings
        self._judged_modules = verdict.hook_modules
        self.evidence = verdict.evidence
        if not verdict.anchor_exists:
            self._set(
                PatchState.NOT_APPLICABLE,
                self.absent or f"this vLLM has no {self.anchor_module}",
            )
        elif verdict.native is not None:
            # ops: a fix vLLM has natively stays native when disabled (issue 18).
            self._set(PatchState.NATIVE, verdict.native)
        elif settings.is_disabled(self.id):
            self._set(PatchState.DISABLED, f"disabled by {DISABLE_ENV}")
        elif verdict.missing is not None:
            self._set(PatchState.FAILED, verdict.missing)
        else:
            modules = ", ".join(verdict.hook_modules)
            self._set(PatchState.APPLIED, f"hooks {modules} when imported")

    def finding(self) -> str | None:
        """``native (behaviour: 37/37 cases)``, ``needed (reading: ...)``: what
        vLLM's code was found to need, and how; None without the anchor."""
        if self.evidence is None:
            return None
        verdict = "native" if self.evidence.native else "needed"
        return f"{verdict} ({self.evidence.text()})"

    def confirm_native_when_imported(self) -> None:
        """Run the fix's cases again on vLLM's own classes once the process
        imports them (the source's verdict could differ from what runs: a
        platform's or another plugin's replacement). Where they fail, the fix
        is applied after all, with a warning naming the case."""
        if self.anchor_module not in self._armed:
            self._armed.add(self.anchor_module)
            wrapt.register_post_import_hook(self._confirm_native, self.anchor_module)

    def _confirm_native(self, module: ModuleType) -> None:
        if self.state is not PatchState.NATIVE:
            return
        try:
            live = self.confirm_behaviour()
        except Exception:  # the harness meets code it cannot run: keep the verdict
            return
        if live is None or live.how != BEHAVIOUR or live.failed is None:
            return
        self.evidence = live
        self._judged_modules = None
        missing = self._missing_in_source(self.sources)
        if missing is not None:
            self._fail(f"native by its source, but {live.failed}; {missing}")
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
        """Hook each module now if imported, else when it is imported."""
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
        """Restore every hooked attribute; the patch can be applied again."""
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
        """A hook's own code failed at run time: restore vLLM's code here.

        Marks the patch ``failed`` in this process with one warning naming the
        error and what the hook was reading; the calling hook then returns
        vLLM's own answer. In strict mode the error is re-raised instead.
        """
        if self.strict:
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

    # -- helpers --------------------------------------------------------------

    def _missing_in_source(self, sources: SourceReader) -> str | None:
        for hook in self.hook_points():
            if sources.text(hook.module) is None:
                return f"hook point {hook.symbol} is missing: no module {hook.module}"
            if not sources.defines(hook.module, hook.qualname):
                return f"hook point {hook.symbol} is missing"
            if hook.caller is not None and not sources.calls(
                hook.module, hook.caller, hook.leaf
            ):
                return (
                    f"hook point {hook.symbol} is no longer called from "
                    f"{hook.module}.{hook.caller}"
                )
        for requirement in self.reads():
            missing = requirement.missing(sources)
            if missing is not None:
                return missing
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
    if patch.strict:
        raise PatchFailedError(message + " Unset strict mode to start without it.")
    logger.warning(message)


class Registry:
    def __init__(self, patches: Iterable[Patch]) -> None:
        self.patches = list(patches)

    def get(self, patch_id: str) -> Patch:
        for patch in self.patches:
            if patch.id == patch_id:
                return patch
        raise KeyError(patch_id)

    def read_settings(self, environ: Mapping[str, str] | None = None) -> Settings:
        """The operator's switches, ``GRAPHSAFE_DISABLE`` checked against these
        patches' ids (an unknown id is one of the settings' problems)."""
        return read_settings(environ, patch_ids=[patch.id for patch in self.patches])

    def apply_all(self, settings: Settings | None = None) -> None:
        """Decide every patch and arm those that apply. Idempotent."""
        settings = self.read_settings() if settings is None else settings
        sources = SourceReader()
        cache = verdict_cache(settings.cache_dir, sources)
        shipped = shipped_verdicts(settings.cache_dir)
        with _LOCK:
            for patch in self.patches:
                if patch._failed_at_run_time or (
                    patch.state is PatchState.APPLIED
                    and not settings.is_disabled(patch.id)
                ):
                    continue
                if patch.is_wrapped():
                    patch.remove()
                verdict, patch.verdict_origin = judged_with_origin(
                    patch, sources, cache, shipped
                )
                patch.decide(settings, sources, verdict)
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
            f"{p.id}={p.state.value if p.state else 'unset'}" for p in self.patches
        )
