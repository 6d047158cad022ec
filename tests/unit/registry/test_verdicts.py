"""Verdicts kept between processes: used only while vLLM's bytes are unchanged.

A synthetic ``vllm`` package on ``sys.path`` stands in for an installed
release; the real fixes judge it, so what a stale verdict would get wrong is a
fix's state an operator reads.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_graphsafe import registry, shipped_verdicts, vllm_layout
from vllm_graphsafe.fixes import all_patches
from vllm_graphsafe.registry import PatchState, Registry
from vllm_graphsafe.settings import read_settings
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


def test_yes_no_answers_are_kept_for_the_hooks_that_bind_later(
    release: Path, cache: Path, judgements: list[str]
) -> None:
    """The process that imports the runner asks the hooks' questions again."""
    write_runner(release, SHAPE)
    states(cache)
    reader = registry.SourceReader()
    for patch in all_patches():
        registry.judged(patch, reader, registry.verdict_cache(str(cache), reader))
    judgements.clear()
    assert reader.defines(vllm_layout.V1_RUNNER, "GPUModelRunner._is_uniform_decode")
    assert judgements == [], "a kept answer was worked out again"


# -- the verdicts this package ships ------------------------------------------------


@pytest.fixture
def shipped_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the package's shipped table is read from, empty to begin with."""
    table = tmp_path / "shipped.json"
    monkeypatch.setattr(shipped_verdicts, "SHIPPED_FILE", table)
    return table


def ship(table: Path, **changes: object) -> None:
    """Judge the release now on ``sys.path`` and ship its verdicts in ``table``."""
    judged = shipped_verdicts.judge_installed("vllm==test", all_patches())
    document = shipped_verdicts.table(judged, shipped_verdicts.rules_digest())
    table.write_text(json.dumps({**document, **changes}))


def origins(cache: Path | str) -> dict[str, str | None]:
    patches = Registry(all_patches())
    patches.apply_all(read_settings({"GRAPHSAFE_CACHE_DIR": str(cache)}))
    return {patch.id: patch.verdict_origin for patch in patches.patches}


def test_a_shipped_verdict_spares_the_first_process_the_judgement(
    release: Path, cache: Path, shipped_table: Path, judgements: list[str]
) -> None:
    write_runner(release, NATIVE)
    ship(shipped_table)
    judgements.clear()
    assert states(cache)[V1] == PatchState.NATIVE.value
    assert judgements == [], "the first process judged a release whose verdicts ship"
    assert set(origins(cache).values()) == {"kept"}, "the shipped verdict was not kept"


def test_a_shipped_verdict_is_not_used_for_other_bytes(
    release: Path, cache: Path, shipped_table: Path
) -> None:
    runner = write_runner(release, NATIVE)
    ship(shipped_table)
    runner.write_text(SHAPE)  # same size: a build of the same release, edited
    assert origins(cache)[V1] == "judged"
    assert states(Path("off"))[V1] != PatchState.NATIVE.value


def test_a_shipped_verdict_is_not_used_for_a_module_that_appeared(
    release: Path, cache: Path, shipped_table: Path
) -> None:
    ship(shipped_table)  # judged with no runner module
    write_runner(release, NATIVE)
    assert states(cache)[V1] == PatchState.NATIVE.value


@pytest.mark.parametrize(
    "damage",
    [
        {"rules": "0" * 64},
        {"format": 0},
        {"verdicts": [{"patch": V1}]},
        {"verdicts": "all native"},
    ],
    ids=["other rules", "other format", "damaged entry", "not a list"],
)
def test_a_table_of_other_rules_or_damaged_is_not_used(
    release: Path,
    cache: Path,
    shipped_table: Path,
    judgements: list[str],
    damage: dict[str, object],
) -> None:
    write_runner(release, NATIVE)
    ship(shipped_table, **damage)
    judgements.clear()
    assert set(origins(cache).values()) == {"judged"}
    assert judgements, "a table it cannot trust was used"


@pytest.mark.parametrize(
    "damage", [b"", b"{", b"\x00" * 40], ids=["empty", "cut", "binary"]
)
def test_an_unreadable_table_is_not_used(
    release: Path, cache: Path, shipped_table: Path, damage: bytes
) -> None:
    write_runner(release, NATIVE)
    shipped_table.write_bytes(damage)
    assert states(cache)[V1] == PatchState.NATIVE.value


def test_off_uses_no_shipped_verdict(
    release: Path, shipped_table: Path, judgements: list[str]
) -> None:
    write_runner(release, NATIVE)
    ship(shipped_table)
    judgements.clear()
    assert set(origins("off").values()) == {"judged"}
    assert judgements
