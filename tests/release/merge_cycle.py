"""A maintainer's merge cycle, in a git repository holding a vLLM tree.

``main`` holds the tree as released; branch ``ours`` carries our written
edits; branch ``upstream`` brings an upstream-style fix of the V1 dispatch of
its own (``_is_uniform_decode`` made phase-aware, vllm-project/vllm#53059's
place, completed with the rows' scheduled drafts). Merging ``upstream`` into
``ours`` leaves both; ``--drop`` leaves upstream's alone.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.release.neighbours import Carried, Change
from vllm_graphsafe.backport.record import EditRecord, record_path
from vllm_graphsafe.cli.main import main
from vllm_graphsafe.vllm_layout import (
    CUDAGRAPH_DISPATCHER,
    V1_CP_UTILS,
    V1_INPUT_BATCH,
    V1_RUNNER,
)

RUNNER = V1_RUNNER.replace(".", "/") + ".py"


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "maintainer",
        "GIT_AUTHOR_EMAIL": "maintainer@example.invalid",
        "GIT_COMMITTER_NAME": "maintainer",
        "GIT_COMMITTER_EMAIL": "maintainer@example.invalid",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def repository(root: Path) -> None:
    """``root`` (holding ``vllm/``) as a git repository on branch ``main``."""
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "vLLM as released")


def upstream_fix(text: str) -> str:
    """The runner's ``_is_uniform_decode`` made phase-aware, as
    vllm-project/vllm#53059 writes it: an instance method that says False
    while a scheduled row is in its prompt or was not handed the batch's
    drafts, its closing statement written anew (the lines just above the
    method our edit inserts after it)."""
    tree = ast.parse(text)
    rule = next(
        item
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "GPUModelRunner"
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "_is_uniform_decode"
    )
    lines = text.splitlines(keepends=True)
    body = rule.body
    docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    after = body[0].end_lineno if docstring else rule.body[0].lineno - 1
    assert after is not None
    indent = " " * body[0].col_offset
    check = (
        f"{indent}if force_uniform_decode is None:\n"
        f"{indent}    batch = self.input_batch\n"
        f"{indent}    for row in range(num_reqs):\n"
        f"{indent}        if (\n"
        f"{indent}            batch.num_computed_tokens_cpu[row]\n"
        f"{indent}            < batch.num_prompt_tokens[row]\n"
        f"{indent}        ):\n"
        f"{indent}            return False\n"
        f"{indent}        drafts = len(batch.spec_token_ids[row])\n"
        f"{indent}        if drafts != uniform_decode_query_len - 1:\n"
        f"{indent}            return False\n"
    )
    closing = body[-1]
    assert closing.end_lineno is not None
    lines[closing.lineno - 1 : closing.end_lineno] = [
        f"{indent}{ast.unparse(closing)}\n"
    ]
    lines.insert(after, check)
    decorator = next(d for d in rule.decorator_list if ast.unparse(d) == "staticmethod")
    header = rule.lineno - 1
    lines[header] = (
        lines[header] + f"{indent}self,\n"
        if lines[header].rstrip().endswith("(")
        else lines[header].replace("(", "(self, ", 1)
    )
    del lines[decorator.lineno - 1]
    return "".join(lines)


def backport(root: Path, *args: str) -> dict[str, Any]:
    """``backport --json`` on the tree: its report."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(["backport", "--tree", str(root), "--json", *args])
    report: dict[str, Any] = json.loads(out.getvalue())
    assert report["exit_status"] == status
    return report


def states(report: dict[str, Any]) -> dict[str, str]:
    return {fix["id"]: fix["state"] for fix in report["fixes"]}


# -- upstream's changes next to our hunks (tests/release/neighbours.py) -------------

#: States in which the tree carries something of ours.
CARRIED = {"ours", "both", "ours, changed", "target gone"}


@dataclass
class Carrying:
    """A tree in git: ``main`` as released, ``ours`` with our edits written."""

    root: Path
    #: relpath -> upstream's lines with our hunks among them (source files).
    files: dict[str, Carried]
    #: The fixes written, and their records.
    records: dict[str, EditRecord]


def carrying(root: Path) -> Carrying:
    """``root`` (holding ``vllm/``) made a repository with our edits on ``ours``."""
    repository(root)
    git(root, "checkout", "-q", "-b", "ours")
    written = backport(root, "--write")
    assert written["exit_status"] == 0, written
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "carry vllm-graphsafe's fixes")
    records = {
        fix["id"]: EditRecord.from_text((root / record_path(fix["id"])).read_text())
        for fix in written["fixes"]
        if fix["state"] == "needed"
    }
    changed = git(root, "diff", "--name-only", "main", "ours", "--", "vllm").stdout
    files = {
        relpath: Carried.of(
            git(root, "show", f"main:{relpath}").stdout,
            (root / relpath).read_text(encoding="utf-8"),
        )
        for relpath in changed.split()
    }
    return Carrying(root, files, {k: v for k, v in records.items() if v is not None})


def merge_upstream(tree: Carrying, name: str, change: Change) -> dict[str, str | None]:
    """Upstream's branch ``name``: ``main`` with ``change`` made next to our
    hunks, merged into a branch off ``ours`` (checked out). A conflicted file
    is resolved as a maintainer would: upstream's change beside our lines.
    Returns each changed file as the merge left it (None: removed)."""
    root = tree.root
    git(root, "reset", "-q", "--hard")
    git(root, "clean", "-fdq")
    git(root, "checkout", "-q", "-B", name, "main")
    changes = {relpath: change(carried) for relpath, carried in tree.files.items()}
    for relpath, changed in changes.items():
        assert changed is None or changed.parses(), f"{name} breaks {relpath}"
        if changed is None:
            git(root, "rm", "-q", relpath)
        else:
            (root / relpath).write_text(changed.text(ours=False), encoding="utf-8")
    git(root, "commit", "-q", "-am", f"upstream: {name}")
    git(root, "checkout", "-q", "-B", f"merge-{name}", "ours")
    if git(root, "merge", "-q", "--no-edit", name, check=False).returncode != 0:
        unmerged = git(root, "diff", "--name-only", "--diff-filter=U").stdout.split()
        for relpath in unmerged:
            changed = changes[relpath]
            if changed is None:
                git(root, "rm", "-q", relpath)
            else:
                (root / relpath).write_text(changed.text(ours=True), encoding="utf-8")
                git(root, "add", relpath)
        git(root, "commit", "-q", "--no-edit")
    return {
        relpath: (root / relpath).read_text(encoding="utf-8")
        if (root / relpath).exists()
        else None
        for relpath in tree.files
    }


def lines_removed(tree: Carrying, merged: dict[str, str | None]) -> set[str]:
    """The fixes some of whose lines, there as written, the merge removed."""
    removed = set()
    for fix, record in tree.records.items():
        for relpath, edit in record.files.items():
            written = tree.files[relpath].text(ours=True)
            now = merged.get(relpath) or ""
            if any(
                h.after.strip() in written and h.after.strip() not in now
                for h in edit.hunks
            ):
                removed.add(fix)
    return removed


def same_as_upstream(root: Path, branch: str) -> str:
    """``git diff`` of the working tree (new files included) against ``branch``."""
    git(root, "add", "-A")
    return git(root, "diff", "--cached", "--stat", branch).stdout


# -- vLLM 0.34: the V1 runner removed ------------------------------------------------

#: Files vLLM 0.34 removed that our V1 edits live in or read (it removed
#: the V1 runner's ubatch wrapper too).
REMOVED_IN_0_34 = tuple(
    module.replace(".", "/") + ".py"
    for module in (V1_RUNNER, V1_INPUT_BATCH, CUDAGRAPH_DISPATCHER)
)
#: The DCP dummy-run helpers vLLM 0.34 removed from cp_utils.py.
DCP_DUMMY_HELPERS = ("get_dcp_dummy_context_len", "prepare_dcp_dummy_context_metadata")
V1_FIXES = ("v1-phase-dispatch", "v1-dummy-staging")


def without_functions(text: str, names: tuple[str, ...]) -> str:
    """``text`` without its module-level functions ``names`` (and the blank
    lines after each)."""
    lines = text.splitlines(keepends=True)
    gone: set[int] = set()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            last = node.end_lineno or node.lineno
            while last < len(lines) and not lines[last].strip():
                last += 1
            gone.update(range(first, last))
    return "".join(line for number, line in enumerate(lines) if number not in gone)


def v1_runner_removed(root: Path) -> None:
    """Our edits written, then upstream's merge that removes the V1 runner (as
    0.34 does), conflicts resolved upstream's way: the V1 fixes read ``target
    gone``; dropping them removes what is left of ours (their tests and
    records), the tree is upstream's but for our other fixes, and the V1 fixes
    are then ``not applicable``."""
    repository(root)
    git(root, "checkout", "-q", "-b", "upstream")
    for relpath in REMOVED_IN_0_34:
        if (root / relpath).exists():
            git(root, "rm", "-q", relpath)
    cp_utils = root / (V1_CP_UTILS.replace(".", "/") + ".py")
    if cp_utils.exists():
        text = cp_utils.read_text(encoding="utf-8")
        cp_utils.write_text(
            without_functions(text, DCP_DUMMY_HELPERS), encoding="utf-8"
        )
    git(root, "commit", "-q", "-am", "upstream: the V1 runner removed")
    git(root, "checkout", "-q", "main")
    git(root, "checkout", "-q", "-b", "ours")
    written = backport(root, "--write")
    ours = [fix for fix, state in states(written).items() if state == "needed"]
    v1 = [fix for fix in ours if fix in V1_FIXES]
    assert v1, written
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "carry vllm-graphsafe's fixes")

    git(root, "merge", "-q", "--no-edit", "-X", "theirs", "upstream", check=False)
    for relpath in REMOVED_IN_0_34:
        if (root / relpath).exists():
            git(root, "rm", "-q", relpath)  # removed upstream, changed by us
    git(root, "commit", "-q", "--no-edit")

    report = backport(root, "--check")
    assert {fix: states(report)[fix] for fix in ours} == {
        fix: "target gone" if fix in v1 else "ours" for fix in ours
    }, report
    assert report["exit_status"] == 1
    for fix in report["fixes"]:
        if fix["id"] in v1:
            assert RUNNER in [gone["what"] for gone in fix["gone"]], fix
            assert record_path(fix["id"]) in fix["reason"], fix["reason"]

    dropped = backport(root, "--drop", *(a for fix in v1 for a in ("--fix", fix)))
    assert dropped["exit_status"] == 0, dropped
    assert sorted(dropped["removed"]) == sorted(
        path for fix in report["fixes"] if fix["id"] in v1 for path in fix["tests"]
    )
    git(root, "add", "-A")
    differs = set(
        git(root, "diff", "--cached", "--name-only", "upstream").stdout.split()
    )
    kept = {
        path
        for fix in report["fixes"]
        if fix["id"] in ours and fix["id"] not in v1
        for path in [*fix["files"], *fix["tests"]]
    }
    assert differs <= kept, differs - kept
    after = states(backport(root, "--check"))
    assert {fix: after[fix] for fix in v1} == dict.fromkeys(v1, "not applicable")
