"""The settings reach the Ray actors vLLM starts, through vLLM's own copying.

A Ray actor inherits nothing from the process that starts it, and on another
machine nothing at all: vLLM hands it the variables ``get_env_vars_to_copy``
names (the legacy Ray executor's workers, the data-parallel engine actors), or,
with the default Ray executor, all of the starting process's variables
(``get_driver_env_vars``). The plugin runs (``register()``) in a child Python
process, as vLLM's engine process loads it before it starts the actors; the
child then asks the installed vLLM what it would copy. No Ray is needed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from vllm_graphsafe import vllm_layout
from vllm_graphsafe.sources import SourceReader

AS_VLLM_STARTS_ACTORS = """
    import json, os, sys
    from vllm_graphsafe import plugin, vllm_layout

    def unknown_to_vllm():
        known = vllm_layout.load_name(vllm_layout.ENVS, "environment_variables")
        return {name for name in os.environ if name.startswith("VLLM_")} - set(known)

    unknown_before = unknown_to_vllm()
    plugin.register()
    copy = vllm_layout.load_name(vllm_layout.RAY_ENV, "get_env_vars_to_copy")
    driver = vllm_layout.load_name(vllm_layout.RAY_ENV_UTILS, "get_driver_env_vars")
    names = copy(destination="workers")
    result = {
        "copied": {name: os.environ[name] for name in names if name in os.environ},
        "copied_by_default_executor": driver(worker_specific_vars=set()),
        "prefixes": os.environ.get(vllm_layout.RAY_EXTRA_ENV_PREFIXES),
        "new_unknown": sorted(unknown_to_vllm() - unknown_before),
    }
    with open(sys.argv[1], "w") as out:
        json.dump(result, out)
"""

SETTINGS = {
    "GRAPHSAFE_DISABLE": "all",  # the kill switch
    "GRAPHSAFE_STRICT": "1",
}


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What vLLM copies once the plugin has run, the operator having set the
    kill switch, a statistics directory and a prefix of their own."""
    tmp = tmp_path_factory.mktemp("ray-copy")
    out = tmp / "copied.json"
    clean = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GRAPHSAFE_", "VLLM_GRAPHSAFE_", "MYLIB_"))
        and name != vllm_layout.RAY_EXTRA_ENV_PREFIXES
    }
    env = {
        **clean,
        **SETTINGS,
        "GRAPHSAFE_STATS_DIR": str(tmp / "stats"),
        # A cache directory of the test's own (the conftest's, removed with it).
        "GRAPHSAFE_CACHE_DIR": os.environ["GRAPHSAFE_CACHE_DIR"],
        # The server's private directory: a path on the server's machine.
        "GRAPHSAFE_METRICS_DIR": str(tmp / "graphsafe-metrics-x"),
        vllm_layout.RAY_EXTRA_ENV_PREFIXES: "MYLIB_",
        "MYLIB_FLAG": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(AS_VLLM_STARTS_ACTORS), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(out.read_text())
    loaded["stats_dir"] = env["GRAPHSAFE_STATS_DIR"]
    loaded["metrics_dir"] = env["GRAPHSAFE_METRICS_DIR"]
    return loaded


def test_the_kill_switch_and_every_setting_reach_the_ray_actors(
    copied: dict[str, Any],
) -> None:
    for name, value in SETTINGS.items():
        assert copied["copied"].get(name) == value, name
    assert copied["copied"].get("GRAPHSAFE_STATS_DIR") == copied["stats_dir"]


def test_the_operators_own_prefix_still_travels(copied: dict[str, Any]) -> None:
    assert copied["copied"].get("MYLIB_FLAG") == "1"
    assert copied["prefixes"].split(",")[0] == "MYLIB_"


def test_the_servers_metrics_directory_travels_as_a_path(
    copied: dict[str, Any],
) -> None:
    """Where no such directory exists (another machine) a worker ignores it
    (tests/unit/ops/test_ray_roles.py); on the server's machine it counts there."""
    assert copied["copied"].get("GRAPHSAFE_METRICS_DIR") == copied["metrics_dir"]


def test_vllm_is_given_no_variable_it_does_not_know(copied: dict[str, Any]) -> None:
    """vLLM warns about each ``VLLM_*`` variable it does not know."""
    assert copied["new_unknown"] == []


def test_the_default_ray_executor_copies_them_too(copied: dict[str, Any]) -> None:
    for name, value in SETTINGS.items():
        assert copied["copied_by_default_executor"].get(name) == value, name


# -- the actor classes the plugin recognises a Ray worker by ----------------------


def defined_classes(module: str) -> set[str]:
    """The classes ``module`` defines at any depth (vLLM defines its legacy Ray
    worker inside ``try: import ray``), read from its source: no Ray needed."""
    text = SourceReader().text(module)
    if text is None:
        return set()
    return {
        node.name
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef)
    }


def test_the_ray_actor_classes_are_where_the_plugin_looks() -> None:
    """A class moved or renamed in a new vLLM makes its Ray actors count as
    ``main`` and leave ``/metrics``: ``vllm_layout.py`` then needs an edit."""
    assert vllm_layout.RAY_WORKER_PROC_CLASS in defined_classes(
        vllm_layout.RAY_EXECUTOR_V2
    )
    assert set(vllm_layout.RAY_ENGINE_CORE_ACTOR_CLASSES) <= defined_classes(
        vllm_layout.ENGINE_CORE
    )
    assert SourceReader().exists(vllm_layout.RAY_EXECUTOR) == (
        vllm_layout.RAY_WORKER_WRAPPER_CLASS
        in defined_classes(vllm_layout.RAY_WORKER_WRAPPER)
    )
