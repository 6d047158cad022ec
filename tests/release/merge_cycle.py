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
from pathlib import Path
from typing import Any

from vllm_graphsafe.cli.main import main

RUNNER = "vllm/v1/worker/gpu_model_runner.py"


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
    """The runner's ``_is_uniform_decode`` made phase-aware: an instance
    method that says False while a scheduled row is in its prompt or was not
    handed the batch's drafts. Its last lines are left alone."""
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
