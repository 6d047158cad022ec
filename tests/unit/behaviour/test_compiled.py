"""vLLM's code compiled out of a source tree, never imported, and run on fakes.

A synthetic tree (a package standing for ``vllm``) holds what the judgement
meets in vLLM's own: a runner class with bases in other modules, private
methods, static methods, imports (absolute, relative, of submodules), module
constants, a module that makes its attributes on demand, a GPU kernel and a
dataclass.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from vllm_graphsafe.behaviour.compiled import SourceCode
from vllm_graphsafe.behaviour.stand_in import StandIn
from vllm_graphsafe.sources import SourceReader

FILES = {
    "fakevllm/__init__.py": "",
    "fakevllm/envs.py": """
        def __getattr__(name):
            return None
        """,
    "fakevllm/worker/__init__.py": "",
    "fakevllm/worker/mixin.py": """
        class Mixin:
            def from_base(self):
                return self.value * 10
        """,
    "fakevllm/worker/helpers.py": """
        from dataclasses import dataclass
        from typing import NamedTuple

        LIMIT = 4 * 2
        NAMES = frozenset({"a", "b"})
        LOGGER = make_logger(__name__)


        def double(x):
            return 2 * x


        @dataclass(frozen=True)
        class Shape:
            rows: int
            cols: int = 3


        class Pair(NamedTuple):
            first: int
            second: int
        """,
    "fakevllm/worker/runner.py": """
        import numpy as np

        import fakevllm.envs as envs
        from fakevllm.worker.helpers import LIMIT, NAMES, LOGGER, Shape, Pair, double
        from .mixin import Mixin
        from . import helpers
        import torch
        import triton


        @triton.jit
        def kernel(x):
            return x


        class Runner(Mixin):
            @staticmethod
            def static_rule(a, b):
                return a == b

            @torch.inference_mode()
            def decorated(self):
                return "decorated"

            def __private(self):
                return "private"

            def calls_private(self):
                return self.__private()

            def uses_module_names(self):
                return double(LIMIT), "a" in NAMES, helpers.double(1)

            def uses_numpy(self):
                return int(np.arange(4).sum())

            def makes_data(self):
                return Shape(2), Pair(1, 2)

            def reads_env(self):
                return envs.SOME_FLAG

            def logs(self):
                LOGGER.info("ignored")
                return "logged"

            def launches(self):
                return kernel[(1,)](3)

            def unknown_name(self):
                return not_defined_anywhere

            def reads_state(self):
                return self.value + self.missing_config.size
        """,
}


@pytest.fixture
def code(tmp_path: Path) -> SourceCode:
    for relpath, text in FILES.items():
        path = tmp_path / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return SourceCode(SourceReader(root=tmp_path), package="fakevllm")


def runner(code: SourceCode, **state: object) -> object:
    return code.instance("fakevllm.worker.runner", "Runner", {"value": 3, **state})


def test_methods_run_from_their_own_source(code: SourceCode) -> None:
    r = runner(code)
    assert r.calls_private() == "private"  # type: ignore[attr-defined]
    assert r.from_base() == 30  # type: ignore[attr-defined]
    assert r.static_rule(1, 1) is True  # type: ignore[attr-defined]
    assert r.decorated() == "decorated"  # type: ignore[attr-defined]


def test_module_names_are_bound_as_the_modules_bind_them(code: SourceCode) -> None:
    r = runner(code)
    assert r.uses_module_names() == (16, True, 2)  # type: ignore[attr-defined]
    assert r.uses_numpy() == 6  # type: ignore[attr-defined]
    shape, pair = r.makes_data()  # type: ignore[attr-defined]
    assert (shape.rows, shape.cols, pair.second) == (2, 3, 2)


def test_what_the_fake_does_not_provide_is_a_stand_in(code: SourceCode) -> None:
    r = runner(code)
    assert isinstance(r.reads_env(), StandIn)  # type: ignore[attr-defined]
    assert r.logs() == "logged"  # type: ignore[attr-defined]
    assert isinstance(r.launches(), StandIn)  # type: ignore[attr-defined]
    assert isinstance(r.reads_state(), StandIn)  # type: ignore[attr-defined]


def test_a_name_no_module_binds_fails_as_it_would_in_vllm(code: SourceCode) -> None:
    with pytest.raises(NameError, match="not_defined_anywhere"):
        runner(code).unknown_name()  # type: ignore[attr-defined]


def test_an_attribute_the_fake_sets_wins_over_the_source(code: SourceCode) -> None:
    r = runner(code, from_base=lambda: "fake")
    assert r.from_base() == "fake"  # type: ignore[attr-defined]


def test_nothing_of_the_tree_is_imported(code: SourceCode) -> None:
    before = {
        name for name in sys.modules if name.split(".")[0] in ("fakevllm", "triton")
    }
    runner(code).uses_module_names()  # type: ignore[attr-defined]
    runner(code).launches()  # type: ignore[attr-defined]
    after = {
        name for name in sys.modules if name.split(".")[0] in ("fakevllm", "triton")
    }
    assert after == before


def test_the_stand_in_is_false_zero_and_empty() -> None:
    value = StandIn("config")
    assert not value and len(value) == 0 and list(value) == [] and int(value) == 0
    assert isinstance(value.anything.deeper()[3], StandIn)
    assert value is not None and not (value < 1) and not (value > 1)
    with value as entered:
        assert entered is value
