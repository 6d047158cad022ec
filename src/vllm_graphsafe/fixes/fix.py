"""What a fix declares: its facts, and where its code lives.

Standard library only: the plugin reads this list in every vLLM process, and the
repository's scripts read it under the machine's own ``python3``. A fix's runtime
hooks and backport planner are imported only when asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, cast

if TYPE_CHECKING:
    from vllm_graphsafe.backport.plan import Plan
    from vllm_graphsafe.backport.tree import Tree
    from vllm_graphsafe.registry import Patch


class CatalogueFacts(TypedDict):
    """The facts a :class:`~vllm_graphsafe.registry.Patch` carries."""

    id: str
    title: str
    what: str
    why: str
    binds_to: str
    upstream: tuple[str, ...]
    delete_when: str
    absent: str


class ExtraControl(NamedTuple):
    """A negative control beyond the plugin switched off: one piece of the fix
    removed (``attribute`` of ``module`` replaced by ``replacement``) under a
    pytest option, and the tests that must catch it."""

    #: The pytest option that removes the piece, e.g. ``--drop-seq-len-floor``.
    option: str
    #: The option's help, and the label run_suite.py prints.
    removes: str
    module: str
    attribute: str
    replacement: Callable[..., Any]
    #: pytest arguments selecting the tests that must catch it.
    tests: tuple[str, ...]
    #: What the tests catch, for "no test caught ...".
    caught: str


class Fix(NamedTuple):
    """One fix of this package; its folder is :attr:`package`.

    The folder holds ``hooks.py`` (``make_patch()``: the plugin's runtime form)
    and ``backport.py`` (``plan(tree)``: the same fix as a source edit).
    """

    id: str
    title: str
    #: What it changes, in one or two sentences.
    what: str
    #: Why: the failure it prevents.
    why: str
    #: The vLLM code it hooks, for the catalogue.
    binds_to: str
    upstream: tuple[str, ...]
    delete_when: str
    #: The subject line of the commit the backport writes.
    commit_subject: str
    #: Why the fix does not apply to a vLLM without the code it fixes, for
    #: the operator (doctor's ``not applicable``).
    absent: str
    #: The fix's folder, as a module name (its ``__name__``).
    package: str
    #: The decision events its hooks count (``/metrics``, the statistics files).
    events: tuple[str, ...] = ()
    #: The first minor release (``(0, 28)``) whose code has the fix natively,
    #: as surveyed; None: every surveyed release lacks it.
    native_from: tuple[int, int] | None = None
    #: The runner whose CUDA-graph dispatch it decides (``"v1"`` or ``"mrv2"``),
    #: for the dispatch benchmarks; None: it decides no dispatch.
    dispatch_runner: str | None = None
    extra_controls: tuple[ExtraControl, ...] = ()
    #: Regression tests that pin the plugin's runtime form rather than the fix:
    #: the backport's verification does not run them on the edited tree.
    plugin_form_only: tuple[str, ...] = ()

    def catalogue_facts(self) -> CatalogueFacts:
        return CatalogueFacts(
            id=self.id,
            title=self.title,
            what=self.what,
            why=self.why,
            binds_to=self.binds_to,
            upstream=self.upstream,
            delete_when=self.delete_when,
            absent=self.absent,
        )

    def make_patch(self) -> Patch:
        """A fresh instance of the plugin's runtime form (imports its hooks)."""
        hooks = importlib.import_module(f"{self.package}.hooks")
        return cast("Patch", hooks.make_patch())

    def plan(self, tree: Tree) -> Plan:
        """The fix as an edit of ``tree`` (imports its backport planner)."""
        planner = importlib.import_module(f"{self.package}.backport")
        return cast("Plan", planner.plan(tree))
