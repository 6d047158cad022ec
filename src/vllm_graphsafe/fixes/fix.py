"""What a fix declares: its facts, and where its code lives.

Standard library only: the plugin reads this list in every vLLM process, and the
repository's scripts read it under the machine's own ``python3``. A fix's
folder (:attr:`Fix.package`) holds its judge (``judge``: ``JUDGE``), its
runtime hooks (``hooks``) and its backport planner (``backport``: ``plan``),
each imported by what needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


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
    """One fix of this package; its folder is :attr:`package`."""

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
    #: The module of the code it fixes: without it, the fix does not apply.
    anchor: str
    #: Why the fix does not apply to a vLLM without ``anchor``, for the
    #: operator (doctor's ``not applicable``).
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
