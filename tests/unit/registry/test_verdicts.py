"""Verdicts kept between processes: used only while vLLM's bytes are unchanged.

A synthetic ``vllm`` package on ``sys.path`` stands in for an installed
release; the real fixes judge it, so what a stale verdict would get wrong is a
fix's state an operator reads.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_graphsafe import registry, vllm_layout
from vllm_graphsafe.judging import PatchState
from vllm_graphsafe.registry import Registry, all_patches
from vllm_graphsafe.settings import read_settings
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.verdicts import cache_directory

V1 = "v1-phase-dispatch"
RUNNER_FILE = Path(*vllm_layout.V1_RUNNER.split(".")).with_suffix(".py")
#: A V1 runner whose dispatch keeps prompts off the decode graph (its rows'
#: phase read from the builders' counts), and one of the same length that reads
#: the shape only: the fix's cases run on each tell them apart.
_RUNNER = """class GPUModelRunner:
    @staticmethod
    def _is_uniform_decode(
        max_num_scheduled_tokens,
        uniform_decode_query_len,
        num_tokens,
        num_reqs,
        force_uniform_decode=None,
    ):
        q = uniform_decode_query_len
        return max_num_scheduled_tokens == q and num_tokens == q * num_reqs

    def _determine_batch_execution_and_padding(
        self, num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens
    ):
        q = self.uniform_decode_query_len
        uniform = self._is_uniform_decode(
            max_num_scheduled_tokens, q, num_tokens, num_reqs
        )
        uniform = uniform and {CHECK}
        return self.cudagraph_dispatcher.dispatch(
            num_tokens=num_tokens, uniform_decode=uniform
        )

    def _decodes(self, n):
        q = self.uniform_decode_query_len
        if q == 1:
            return bool((self.input_batch.num_computed_tokens_cpu[:n] > 0).all())
        first = len(self.input_batch.spec_token_ids[0]) == q - 1
        return first and bool((self.num_decode_draft_tokens.np[:n] == q - 1).all())
"""
NATIVE = _RUNNER.replace("{CHECK}", "self._decodes(num_reqs)")
SHAPE = _RUNNER.replace("{CHECK}", "True" + " " * len("self._decodes(num_reqs)"[4:]))
assert len(NATIVE) == len(SHAPE)


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``vllm`` package of our own, found first on ``sys.path``."""
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    saved = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == "vllm" or name.startswith("vllm.")
    }
    yield root
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "verdicts"


@pytest.fixture
def judgements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per fix judged on vLLM's code (what a kept verdict spares)."""
    counted: list[str] = []
    original = registry.Patch.judge

    def judge(patch: registry.Patch, sources: object) -> object:
        counted.append(patch.id)
        return original(patch, sources)  # type: ignore[arg-type]

    monkeypatch.setattr(registry.Patch, "judge", judge)
    return counted


def write_runner(release: Path, text: str) -> Path:
    file = release / RUNNER_FILE
    file.parent.mkdir(parents=True, exist_ok=True)
    for package in file.relative_to(release).parents:
        if package != Path("."):
            (release / package / "__init__.py").touch()
    file.write_text(text)
    return file


def states(cache: Path) -> dict[str, str]:
    patches = Registry(all_patches())
    patches.apply_all(read_settings({"GRAPHSAFE_CACHE_DIR": str(cache)}))
    return patches.states()


def test_a_kept_verdict_spares_the_judgement_and_is_private(
    release: Path, cache: Path, judgements: list[str]
) -> None:
    write_runner(release, NATIVE)
    first = states(cache)
    assert first[V1] == PatchState.NATIVE.value
    assert judgements, "the first process judges vLLM's code"
    judgements.clear()
    assert states(cache) == first
    assert judgements == [], "a later process judged vLLM's code again"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    entries = list(cache.iterdir())
    assert entries and all(stat.S_IMODE(e.stat().st_mode) == 0o600 for e in entries)


def test_an_edit_that_keeps_size_and_time_is_judged_again(
    release: Path, cache: Path
) -> None:
    runner = write_runner(release, NATIVE)
    assert states(cache)[V1] == PatchState.NATIVE.value
    before = runner.stat()
    runner.write_text(SHAPE)
    os.utime(runner, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert runner.stat().st_size == before.st_size
    assert states(cache)[V1] != PatchState.NATIVE.value, "stale verdict after upgrade"


def test_a_module_that_appears_is_judged_again(release: Path, cache: Path) -> None:
    assert states(cache)[V1] == PatchState.NOT_APPLICABLE.value
    write_runner(release, NATIVE)
    assert states(cache)[V1] == PatchState.NATIVE.value


@pytest.mark.parametrize(
    "damage",
    [b"", b"{", b'{"body": {}, "check": "0"}', b"\x00" * 40],
    ids=["empty", "truncated", "wrong check", "binary"],
)
def test_a_damaged_entry_is_judged_again_and_replaced(
    release: Path, cache: Path, judgements: list[str], damage: bytes
) -> None:
    write_runner(release, NATIVE)
    states(cache)
    for entry in cache.iterdir():
        entry.write_bytes(damage)
    judgements.clear()
    assert states(cache)[V1] == PatchState.NATIVE.value
    assert judgements, "a damaged entry was trusted"
    judgements.clear()
    states(cache)
    assert judgements == [], "the damaged entry was not replaced"


def test_a_forged_verdict_with_a_stale_check_is_not_trusted(
    release: Path, cache: Path
) -> None:
    write_runner(release, NATIVE)
    states(cache)
    entry = next(e for e in cache.iterdir() if V1 in e.name)
    entry.write_text(entry.read_text().replace('"native": "', '"native": "forged '))
    assert "forged" not in " ".join(p.reason for p in _applied(cache) if p.id == V1)


def _applied(cache: Path) -> list[registry.Patch]:
    patches = Registry(all_patches())
    patches.apply_all(read_settings({"GRAPHSAFE_CACHE_DIR": str(cache)}))
    return patches.patches


def test_a_link_at_an_entry_is_neither_followed_nor_replaced(
    release: Path, cache: Path, tmp_path: Path
) -> None:
    write_runner(release, NATIVE)
    states(cache)
    entry = next(e for e in cache.iterdir() if V1 in e.name)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(elsewhere)
    write_runner(release, SHAPE)  # a verdict through the link would be stale
    assert states(cache)[V1] != PatchState.NATIVE.value
    assert entry.is_symlink() and elsewhere.read_bytes().count(b"native")


def test_a_directory_others_can_enter_is_not_used(release: Path, cache: Path) -> None:
    write_runner(release, NATIVE)
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    assert states(cache)[V1] == PatchState.NATIVE.value
    assert list(cache.iterdir()) == []


def test_off_keeps_nothing(release: Path, tmp_path: Path) -> None:
    write_runner(release, NATIVE)
    before = set(tmp_path.rglob("*"))
    assert states(Path("off"))[V1] == PatchState.NATIVE.value
    assert set(tmp_path.rglob("*")) == before
    assert not Path("off").exists()


def test_the_default_place_follows_xdg_cache_home(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert cache_directory(None, env) == tmp_path / "vllm-graphsafe"
    assert cache_directory(str(tmp_path / "x"), env) == tmp_path / "x"
    assert cache_directory("off", env) is None
    assert cache_directory(None, {"XDG_CACHE_HOME": "relative"}) == (
        Path.home() / ".cache" / "vllm-graphsafe"
    )


def test_a_kept_verdict_is_all_the_hooks_need(
    release: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process that imports the runner binds the hooks from the kept
    verdict: vLLM's source is not parsed again there."""
    write_runner(release, SHAPE)
    first = states(cache)

    def refuse(reader: object, module: str) -> None:
        raise AssertionError(f"{module} was parsed again")

    monkeypatch.setattr(SourceReader, "tree", refuse)
    patches = Registry(all_patches())
    patches.apply_all(read_settings({"GRAPHSAFE_CACHE_DIR": str(cache)}))
    assert patches.states() == first
    v1 = patches.get(V1)
    assert v1.verdict_origin == "kept"
    assert [hook.qualname for hook in v1.hook_points()] == [
        "GPUModelRunner._is_uniform_decode"
    ]
