"""The plugin adds ``GRAPHSAFE_`` to the prefixes vLLM copies to its Ray actors.

vLLM reads ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` as comma-separated
prefixes, each stripped, empty ones dropped (``vllm/ray/ray_env.py``,
``_parse_csv``); :func:`copied_prefixes` reads it the same way, so that these
tests check what vLLM will see. The release tests run vLLM's own reader.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from vllm_graphsafe import plugin, vllm_layout
from vllm_graphsafe.settings import ray_copy_prefixes

VARIABLE = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
KNOWN = {VARIABLE: lambda: ""}


def copied_prefixes(value: str) -> set[str]:
    return {part.strip() for part in value.split(",") if part.strip()}


def test_the_layout_names_vllms_variable() -> None:
    assert vllm_layout.RAY_EXTRA_ENV_PREFIXES == VARIABLE


@pytest.mark.parametrize("unset_or_empty", [{}, {VARIABLE: ""}, {VARIABLE: " "}])
def test_alone_it_is_the_only_extra_prefix(unset_or_empty: dict[str, str]) -> None:
    value = ray_copy_prefixes(unset_or_empty, KNOWN)
    assert value is not None
    assert copied_prefixes(value) == {"GRAPHSAFE_"}


@pytest.mark.parametrize("operators", ["MYLIB_", "MYLIB_,OTHER_", " MYLIB_ , OTHER_,"])
def test_the_operators_prefixes_stay_as_written(operators: str) -> None:
    value = ray_copy_prefixes({VARIABLE: operators}, KNOWN)
    assert value is not None
    assert value.startswith(operators)
    assert copied_prefixes(value) == copied_prefixes(operators) | {"GRAPHSAFE_"}


@pytest.mark.parametrize("covered", ["GRAPHSAFE_", "A_, GRAPHSAFE_ ", "GRAPH", "G,B_"])
def test_a_prefix_that_already_covers_it_is_left_alone(covered: str) -> None:
    assert ray_copy_prefixes({VARIABLE: covered}, KNOWN) is None


def test_adding_it_twice_is_adding_it_once() -> None:
    once = ray_copy_prefixes({VARIABLE: "MYLIB_"}, KNOWN)
    assert once is not None
    assert ray_copy_prefixes({VARIABLE: once}, KNOWN) is None


def test_a_vllm_without_the_variable_gets_none_of_it() -> None:
    """Such a vLLM would warn about an unknown VLLM_* variable, and copy nothing."""
    assert ray_copy_prefixes({}, {"VLLM_HOST_IP": lambda: ""}) is None


# -- the plugin sets it in its process's environment ----------------------------


def fake_vllm_envs(monkeypatch: pytest.MonkeyPatch, variables: Any) -> None:
    def load_name(module: str, name: str) -> Any:
        if isinstance(variables, BaseException):
            raise variables
        assert (module, name) == (vllm_layout.ENVS, "environment_variables")
        return variables

    monkeypatch.setattr(vllm_layout, "load_name", load_name)


def test_the_plugin_appends_it_to_the_operators_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_vllm_envs(monkeypatch, KNOWN)
    monkeypatch.setenv(VARIABLE, "MYLIB_")
    plugin.send_settings_to_ray_actors()
    plugin.send_settings_to_ray_actors()
    assert os.environ[VARIABLE] == "MYLIB_,GRAPHSAFE_"


@pytest.mark.parametrize(
    "vllm_envs",
    [{"VLLM_HOST_IP": lambda: ""}, ImportError("no vllm.envs"), RuntimeError("odd")],
)
def test_without_the_mechanism_the_environment_is_untouched(
    monkeypatch: pytest.MonkeyPatch, vllm_envs: Any
) -> None:
    fake_vllm_envs(monkeypatch, vllm_envs)
    monkeypatch.delenv(VARIABLE, raising=False)
    plugin.send_settings_to_ray_actors()
    assert VARIABLE not in os.environ
