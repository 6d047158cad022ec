"""Operator switches: new names, old names still honoured, bad values named."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from vllm_graphsafe import settings
from vllm_graphsafe.settings import read_settings

IDS = ["v1-phase-dispatch", "v1-dummy-staging", "mrv2-phase-dispatch"]


def test_new_names_are_read() -> None:
    read = read_settings(
        {
            "GRAPHSAFE_DISABLE": "v1-dummy-staging",
            "GRAPHSAFE_STRICT": "yes",
            "GRAPHSAFE_STATS_DIR": "/some/dir",
            "GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1",
        },
        patch_ids=IDS,
    )
    assert read.is_disabled("v1-dummy-staging")
    assert not read.is_disabled("v1-phase-dispatch")
    assert read.strict and read.emulate_graph_hazard
    assert read.stats_dir == "/some/dir"
    assert read.problems == () and read.deprecated == ()


def test_old_names_are_honoured_and_reported_as_deprecated() -> None:
    read = read_settings(
        {
            "VLLM_GRAPHSAFE_DISABLE": "all",
            "VLLM_GRAPHSAFE_STRICT": "1",
            "VLLM_GRAPHSAFE_STATS_DIR": "/old",
        },
        patch_ids=IDS,
    )
    assert read.disable_all and read.strict and read.stats_dir == "/old"
    assert set(read.deprecated) == {
        "VLLM_GRAPHSAFE_DISABLE",
        "VLLM_GRAPHSAFE_STRICT",
        "VLLM_GRAPHSAFE_STATS_DIR",
    }
    sentences = settings.deprecation_sentences(read)
    assert any("name it GRAPHSAFE_STRICT" in sentence for sentence in sentences)


def test_the_new_name_wins_over_the_old_one() -> None:
    read = read_settings(
        {"GRAPHSAFE_STATS_DIR": "/new", "VLLM_GRAPHSAFE_STATS_DIR": "/old"},
        patch_ids=IDS,
    )
    assert read.stats_dir == "/new"
    assert read.deprecated == ()


def test_an_unknown_patch_id_is_named_and_ignored() -> None:
    read = read_settings(
        {"GRAPHSAFE_DISABLE": "nonsense-id, v1-phase-dispatch"}, patch_ids=IDS
    )
    assert read.is_disabled("v1-phase-dispatch")
    assert len(read.problems) == 1
    assert "'nonsense-id'" in read.problems[0]


@pytest.mark.parametrize("value", ["maybe", "2", "enable"])
def test_a_non_boolean_strict_is_named_and_read_as_off(value: str) -> None:
    read = read_settings({"GRAPHSAFE_STRICT": value}, patch_ids=IDS)
    assert not read.strict
    assert read.problems == (
        f"GRAPHSAFE_STRICT={value!r} is neither on (1, true, yes, on) nor off "
        "(0, false, no, off); it is read as off.",
    )


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_false_values_raise_no_problem(value: str) -> None:
    read = read_settings({"GRAPHSAFE_STRICT": value}, patch_ids=IDS)
    assert not read.strict and read.problems == ()


def test_the_emulator_switch_reads_its_variable() -> None:
    assert settings.emulate_graph_hazard({"GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1"})
    assert not settings.emulate_graph_hazard({"GRAPHSAFE_EMULATE_GRAPH_HAZARD": "0"})
    assert not settings.emulate_graph_hazard({})


def test_the_plugin_checks_ids_against_the_packages_own_patches() -> None:
    from vllm_graphsafe.registry import Registry, all_patches

    registry = Registry(all_patches())
    read = registry.read_settings({"GRAPHSAFE_DISABLE": "mrv2-phase-dispatch"})
    assert read.problems == ()
    (problem,) = registry.read_settings({"GRAPHSAFE_DISABLE": "nonsense-id"}).problems
    assert "'nonsense-id'" in problem and "mrv2-phase-dispatch" in problem


def test_problems_are_warned_once_per_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "_warned", False)
    read = read_settings(
        {"GRAPHSAFE_STRICT": "maybe", "VLLM_GRAPHSAFE_DISABLE": "all"}, patch_ids=IDS
    )
    logger = logging.getLogger("vllm.graphsafe.test")
    with caplog.at_level(logging.WARNING, logger="vllm.graphsafe.test"):
        settings.warn_once(logger, read)
        settings.warn_once(logger, read)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert any("'maybe'" in message for message in messages)
    assert any(
        "VLLM_GRAPHSAFE_DISABLE is deprecated" in message for message in messages
    )


README = Path(__file__).resolve().parents[3] / "README.md"


def readme_values(variable: str) -> str:
    for line in README.read_text().splitlines():
        if line.startswith(f"| `{variable}` |"):
            return line.split("|")[2]
    raise AssertionError(f"{variable} has no row in the README's settings table")


@pytest.mark.parametrize(
    "variable", ["GRAPHSAFE_STRICT", "GRAPHSAFE_EMULATE_GRAPH_HAZARD"]
)
def test_the_readme_lists_every_value_a_switch_accepts_and_what_it_means(
    variable: str,
) -> None:
    cell = readme_values(variable)
    on_part, _, off_part = cell.partition("off:")
    on_words = re.findall(r"`([^`]+)`", on_part)
    off_words = re.findall(r"`([^`]+)`", off_part)
    assert on_words and off_words, cell

    def reads(value: str) -> tuple[bool, tuple[str, ...]]:
        read = read_settings({variable: value}, patch_ids=IDS)
        flag = (
            read.strict if variable == "GRAPHSAFE_STRICT" else read.emulate_graph_hazard
        )
        return flag, read.problems

    # What the table says is what the reader does, also in upper case ...
    for word in on_words:
        assert reads(word) == (True, ()) and reads(word.upper()) == (True, ())
    for word in [*off_words, ""]:
        assert reads(word) == (False, ()) and reads(word.upper()) == (False, ())
    # ... and no value the reader accepts is missing from the table.
    for word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        assert word in on_words + off_words
