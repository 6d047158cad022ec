"""The verdicts shipped for the installed release are those its source gives.

Where the installed vLLM is one this package ships verdicts for, each shipped
verdict (with the yes/no answers the hooks ask when they bind) must equal the
one judged now from the installed files, and a first process with an empty
verdict cache must take every verdict from the table, parsing nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_graphsafe import shipped_verdicts
from vllm_graphsafe.fixes import all_patches
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.verdicts import judged_with_origin, verdict_cache


def installed_shipped() -> tuple[str, list[shipped_verdicts.ShippedVerdict]]:
    release = shipped_verdicts.installed_release()
    table = shipped_verdicts.read_table(shipped_verdicts.SHIPPED_FILE)
    if release is None or not any(v.release == release for v in table):
        pytest.skip(f"no verdicts ship for {release} (CI's releases all have them)")
    return release, [v for v in table if v.release == release]


def test_each_shipped_verdict_is_what_the_installed_source_gives() -> None:
    release, shipped = installed_shipped()
    judged_now = shipped_verdicts.judge_installed(release, all_patches())
    assert sorted(shipped, key=lambda v: v.patch) == sorted(
        judged_now, key=lambda v: v.patch
    )


def test_a_first_process_takes_every_verdict_from_the_table(tmp_path: Path) -> None:
    installed_shipped()
    sources = SourceReader()
    cache = verdict_cache(str(tmp_path / "verdicts"), sources)
    shipped = shipped_verdicts.ShippedVerdicts()
    origins = {
        patch.id: judged_with_origin(patch, sources, cache, shipped)[1]
        for patch in all_patches()
    }
    assert set(origins.values()) == {"shipped"}, origins
    assert sources.pieces_parsed == {} and not any(sources._trees.values())
