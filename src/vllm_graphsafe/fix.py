"""What a fix declares: its facts, and where its code lives.

Standard library only: the repository's scripts read it under the machine's own
``python3``. A fix's folder (:attr:`Fix.package`) holds its ``judge``
(``JUDGE``), ``hooks`` and ``backport`` (``plan``), each imported on demand.
"""

from __future__ import annotations

from typing import NamedTuple


class Fix(NamedTuple):
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
    #: Why the fix does not apply without ``anchor`` (doctor's ``not applicable``).
    absent: str
    #: The fix's folder, as a module name (its ``__name__``).
    package: str
    #: The decision events its hooks count (``/metrics``, the statistics files).
    events: tuple[str, ...] = ()


#: The V1 runner's fixes: when they go, and why they do not apply without it.
V1_RUNNER_DELETE_WHEN = (
    "the oldest vLLM you serve has no V1 model runner (0.34 removed it): "
    "no release has upstream's fix, so it retires with the runner"
)
V1_RUNNER_ABSENT = (
    "this vLLM has no V1 model runner, the code this fixes: vLLM 0.34 "
    "removed it, and Model Runner V2 runs every model"
)
