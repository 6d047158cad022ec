"""Whether the installed vLLM has the V1 model runner (vLLM 0.34 removed it).

A test module about the V1 runner starts, after its imports, with::

    if not v1_runner.installed():
        pytest.skip(v1_runner.ABSENT, allow_module_level=True)

so that where the runner's module is absent the whole module is reported
skipped, with the reason, at its own file. Where the module is there it is
imported as before: an import that fails for any other reason still fails.
"""

from __future__ import annotations

import importlib.util

from vllm_graphsafe import vllm_layout

ABSENT = (
    f"this vLLM has no V1 model runner ({vllm_layout.V1_RUNNER} is absent: "
    "vLLM 0.34 removed it), so there is no V1 code to test"
)


def installed() -> bool:
    """Whether the V1 runner's module exists, without importing it."""
    return importlib.util.find_spec(vllm_layout.V1_RUNNER) is not None
