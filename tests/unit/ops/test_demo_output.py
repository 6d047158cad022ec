"""The demo's documented output has the structure the demo prints now."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import demo_output
from vllm_graphsafe.cli import demo

ROOT = Path(__file__).resolve().parents[3]


def documented_run() -> str:
    doc = (ROOT / demo_output.FULL_DOC).read_text(encoding="utf-8")
    return demo_output.unfenced(demo_output.block_text(doc, demo_output.FULL_BLOCK))


def test_the_documented_run_and_the_readme_excerpt_are_current(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    assert demo_output.main(["--check"]) == demo_output.EXIT_OK
    run = documented_run()
    headings = re.findall(r"^=== (.+) ===$", run, flags=re.MULTILINE)
    assert headings == list(demo.SECTIONS)
    assert run.splitlines()[-1] == "exit status 0"


def replace_first(pattern: str, new: str) -> Callable[[str], str]:
    return lambda run: re.sub(pattern, new, run, count=1, flags=re.MULTILINE)


STALE = {
    # What the demo printed before it named phases: a cut log line.
    "a raw log line while waiting": replace_first(
        r"^ +\d+ s  starting Python and importing vLLM$",
        "   20 s  (APIServer pid=9527) INFO 12-03 08:11:45 [writer.py:84] "
        "vllm-graphsafe: v1-phase-dispatch=applied, v",
    ),
    "the old summary line": replace_first(
        r"^probe passed: .*$", "probe passed: 34 passed, 0 failed, 0 skipped"
    ),
    "a check that could not run, summed up as passed": replace_first(
        r"^(ongoing_decode +\S+  )PASS   ", r"\1NOT RUN"
    ),
    "a section left out": replace_first(r"^=== doctor \(this environment\) ===$", ""),
    "a section renamed": replace_first(r"^=== probe ===$", "=== the probe ==="),
    "an exit status the lines do not imply": replace_first(
        r"^exit status 0$", "exit status 1"
    ),
    "no exit status": replace_first(r"^exit status 0$", ""),
    "a line the demo does not print": replace_first(
        r"^(dispatch decisions:)$", r"\1\nunexpected line"
    ),
    "the emulated bug not shown": replace_first(
        r"plugin disabled: GARBAGE: .*$",
        "plugin disabled: clean: the cached answer is identical to the first one",
    ),
}


@pytest.mark.parametrize("change", list(STALE), ids=list(STALE))
def test_a_run_whose_structure_differs_is_stale(change: str) -> None:
    run = documented_run()
    changed = STALE[change](run)
    assert changed != run
    with pytest.raises(demo_output.StaleOutput):
        demo_output.check_run(changed)


def test_timings_counts_ports_paths_and_pids_may_differ() -> None:
    run = documented_run()
    changed = re.sub(r"pid \d+", "pid 1", run)
    changed = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:9", changed)
    changed = re.sub(r"after \d+ s", "after 999 s", changed)
    changed = re.sub(  # every elapsed time 9, 99, ...: its width kept
        r"^ *\d+ s  ",
        lambda found: re.sub(r"\d", "9", found.group(0)),
        changed,
        flags=re.MULTILINE,
    )
    changed = re.sub(r"\(for \d+ s\)", "(for 3 s)", changed)
    changed = re.sub(r"/tmp/graphsafe-demo-\w+", "/tmp/graphsafe-demo-other", changed)
    changed = re.sub(r"\} \d+$", "} 5", changed, flags=re.MULTILINE)
    changed = re.sub(r"kept \d+ prefill", "kept 3 prefill", changed)
    changed = re.sub(r"([a-z_])=\d+", r"\1=4", changed)
    assert changed != run
    demo_output.check_run(changed)


def test_writing_a_saved_run_updates_both_documents(tmp_path: Path) -> None:
    readme, doc = tmp_path / "README.md", tmp_path / "demo-output.md"
    readme.write_text((ROOT / demo_output.README).read_text(encoding="utf-8"))
    doc.write_text((ROOT / demo_output.FULL_DOC).read_text(encoding="utf-8"))
    lines_before = len(readme.read_text().splitlines())
    saved = tmp_path / "demo.log"
    saved.write_text(re.sub(r"kept \d+ prefill", "kept 77 prefill", documented_run()))

    paths = ["--readme", str(readme), "--doc", str(doc)]
    assert demo_output.main(["--write", str(saved), *paths]) == demo_output.EXIT_OK
    assert demo_output.main(["--check", *paths]) == demo_output.EXIT_OK
    assert "kept 77 prefill" in readme.read_text()
    assert "kept 77 prefill" in doc.read_text()
    assert len(readme.read_text().splitlines()) == lines_before


def test_a_saved_run_of_another_structure_is_refused_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme, doc = tmp_path / "README.md", tmp_path / "demo-output.md"
    readme.write_text((ROOT / demo_output.README).read_text(encoding="utf-8"))
    doc.write_text((ROOT / demo_output.FULL_DOC).read_text(encoding="utf-8"))
    before = readme.read_text(), doc.read_text()
    saved = tmp_path / "demo.log"
    saved.write_text(documented_run().rsplit("\n", 1)[0])  # no exit status

    status = demo_output.main(
        ["--write", str(saved), "--readme", str(readme), "--doc", str(doc)]
    )
    err = capsys.readouterr().err
    assert status == demo_output.EXIT_STALE
    assert err.count("\n") == 1 and "exit status" in err and "Traceback" not in err
    assert (readme.read_text(), doc.read_text()) == before


def test_the_readme_excerpt_shows_only_lines_the_demo_printed() -> None:
    readme = (ROOT / demo_output.README).read_text(encoding="utf-8")
    excerpt = demo_output.unfenced(
        demo_output.block_text(readme, demo_output.EXCERPT_BLOCK)
    ).splitlines()
    # The documented run's last line is the shell's `echo "exit status $?"`.
    printed = documented_run().splitlines()[:-1]
    assert excerpt, "the README's excerpt is empty"
    assert [line for line in excerpt if line not in printed] == []
