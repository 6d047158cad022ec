"""Rewrites of each upstream fix, and look-alikes, for judging native by behaviour.

Each variant edits a vLLM tree's text (never its files) and says what a
maintainer must be told: ``native`` for a correct fix however it is spelled
(other names, helpers, numpy forms, early returns, guard clauses), ``needed``
for a look-alike that is wrong in its own way (a reversed comparison, the
first row only, everything sent off the graph, a second path into the FULL
graph). The oracle is what the code does to the bug's cases, which a person
can check by reading each variant: it is not computed by the judgement.

V1 dispatch variants are inserted into the tree's own
``_determine_batch_execution_and_padding`` (after its shape rule). The dummy
staging and MRV2 variants start from the backport's edit of the tree (a
rewrite of upstream's vllm-project/vllm#54604 and #51865) and change its
text; MRV2 trees that have upstream's fix (0.28 on) get variants of
upstream's own code.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_graphsafe.backport import Judged, judge_one, planner
from vllm_graphsafe.fixes import v1_dummy_staging, v1_phase_dispatch
from vllm_graphsafe.fixes.v1_phase_dispatch.judge import DISPATCH
from vllm_graphsafe.judging import PatchState
from vllm_graphsafe.tree_edits.tree import Tree

V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
MRV2_RUNNER = "vllm/v1/worker/gpu/model_runner.py"
V1_DISPATCH = DISPATCH.rsplit(".", 1)[-1]
#: The fixes whose variants edit the V1 runner.
V1_FIXES = frozenset({v1_phase_dispatch.FIX.id, v1_dummy_staging.FIX.id})

#: relpath -> text: the files a variant changes.
Edited = dict[str, str]


@dataclass(frozen=True)
class Variant:
    fix: str
    name: str
    #: What the judgement must say.
    native: bool
    edit: Callable[[Path], Edited]
    #: For MRV2: the kind of tree it applies to ("needed": lacks upstream's
    #: fix, "native": has it); None: every tree.
    tree: str | None = None
    #: Text some MRV2 file of the tree must hold (the code the variant
    #: changes, where only some releases have it); None: none needed.
    requires: str | None = None

    def applies(self, root: Path, kind: str) -> bool:
        if self.fix in V1_FIXES and not (root / V1_RUNNER).is_file():
            return False  # vLLM 0.34 removed the V1 runner these variants edit
        return self.tree in (None, kind) and (
            self.requires is None
            or any(self.requires in _read(root, f) for f in _mrv2_files(root))
        )

    @property
    def id(self) -> str:
        return f"{self.fix}:{'native' if self.native else 'needed'}:{self.name}"


def judge(root: Path, fix_id: str, edited: Edited) -> Judged:
    """The fix judged on the tree as if ``edited`` were written (what
    ``backport --check`` does), nothing imported."""
    return judge_one(root, fix_id, edited)


def is_native(judged: Judged) -> bool:
    return judged.state is PatchState.NATIVE


# -- locating and editing text ---------------------------------------------------


def _read(root: Path, relpath: str) -> str:
    return (root / relpath).read_text(encoding="utf-8")


def _method(tree: ast.Module, owner: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"no {owner}.{name}")


def _insert_lines(text: str, after_line: int, block: str, indent: int) -> str:
    """``block`` (dedented source) inserted after 1-based ``after_line``."""
    lines = text.splitlines(keepends=True)
    body = textwrap.indent(textwrap.dedent(block).strip("\n") + "\n", " " * indent)
    return "".join(lines[:after_line]) + body + "".join(lines[after_line:])


def after_shape_rule(text: str, block: str) -> str:
    """``block`` right after the dispatch's ``uniform_decode = _is_uniform_decode(...)``."""
    dispatch = _method(ast.parse(text), "GPUModelRunner", V1_DISPATCH)
    for statement in dispatch.body:
        if (
            isinstance(statement, ast.Assign)
            and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Attribute)
            and statement.value.func.attr == "_is_uniform_decode"
        ):
            assert statement.end_lineno is not None
            return _insert_lines(
                text, statement.end_lineno, block, statement.col_offset
            )
    raise AssertionError("no shape rule in the dispatch")


def after_dispatcher_call(text: str, block: str) -> str:
    """``block`` right after the dispatch's first call of the graph dispatcher."""
    dispatch = _method(ast.parse(text), "GPUModelRunner", V1_DISPATCH)
    for statement in dispatch.body:
        if isinstance(statement, ast.Assign) and "dispatch" in ast.unparse(
            statement.value
        ):
            assert statement.end_lineno is not None
            return _insert_lines(
                text, statement.end_lineno, block, statement.col_offset
            )
    raise AssertionError("no dispatcher call in the dispatch")


def before_dispatch_method(text: str, block: str) -> str:
    """A method ``block`` added to the runner class, before the dispatch."""
    dispatch = _method(ast.parse(text), "GPUModelRunner", V1_DISPATCH)
    first = min([dispatch.lineno, *(d.lineno for d in dispatch.decorator_list)])
    return _insert_lines(text, first - 1, block + "\n", dispatch.col_offset)


def replace_method(text: str, owner: str, name: str, block: str) -> str:
    node = _method(ast.parse(text), owner, name)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    assert node.end_lineno is not None
    lines = text.splitlines(keepends=True)
    body = textwrap.indent(
        textwrap.dedent(block).strip("\n") + "\n", " " * node.col_offset
    )
    return "".join(lines[: first - 1]) + body + "".join(lines[node.end_lineno :])


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected one {old!r}, found {text.count(old)}"
    return text.replace(old, new)


def v1_edit(
    block: str, helper: str | None = None, after_dispatcher: bool = False
) -> Callable[[Path], Edited]:
    def edit(root: Path) -> Edited:
        text = _read(root, V1_RUNNER)
        place = after_dispatcher_call if after_dispatcher else after_shape_rule
        text = place(text, block)
        if helper is not None:
            text = before_dispatch_method(text, helper)
        return {V1_RUNNER: text}

    return edit


# -- V1 dispatch ------------------------------------------------------------------

V1 = v1_phase_dispatch.FIX.id

_COMPLETED_UPSTREAM = """
if uniform_decode and force_uniform_decode is None:
    num_drafts = self.uniform_decode_query_len - 1
    past_prompt = (
        self.input_batch.num_computed_tokens_cpu[:num_reqs]
        >= self.input_batch.num_prompt_tokens[:num_reqs]
    )
    drafted = [
        len(self.input_batch.spec_token_ids[i]) == num_drafts for i in range(num_reqs)
    ]
    uniform_decode = bool(past_prompt.all()) and all(drafted)
"""

V1_VARIANTS = [
    Variant(
        V1,
        "upstream's comparison completed by the scheduled drafts, inline",
        True,
        v1_edit(_COMPLETED_UPSTREAM),
    ),
    Variant(
        V1,
        "the same with other names and the condition reversed",
        True,
        v1_edit(
            """
            if force_uniform_decode is None and uniform_decode:
                width = self.uniform_decode_query_len - 1
                done = self.input_batch.num_computed_tokens_cpu[:num_reqs]
                prompts = self.input_batch.num_prompt_tokens[:num_reqs]
                spec = self.input_batch.spec_token_ids
                ok_rows = [len(spec[row]) == width for row in range(num_reqs)]
                uniform_decode = bool((done >= prompts).all() and all(ok_rows))
            """
        ),
    ),
    Variant(
        V1,
        "numpy functions",
        True,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                drafts = np.array(
                    [len(d) for d in self.input_batch.spec_token_ids[:num_reqs]]
                )
                uniform_decode = bool(
                    np.all(
                        np.greater_equal(
                            self.input_batch.num_computed_tokens_cpu[:num_reqs],
                            self.input_batch.num_prompt_tokens[:num_reqs],
                        )
                    )
                    and np.all(drafts == self.uniform_decode_query_len - 1)
                )
            """
        ),
    ),
    Variant(
        V1,
        "a helper method",
        True,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                uniform_decode = self._every_row_decodes(num_reqs)
            """,
            helper="""
            def _every_row_decodes(self, num_reqs: int) -> bool:
                batch = self.input_batch
                drafts = self.uniform_decode_query_len - 1
                past = batch.num_computed_tokens_cpu[:num_reqs] >= batch.num_prompt_tokens[:num_reqs]
                return bool(past.all()) and all(
                    len(batch.spec_token_ids[i]) == drafts for i in range(num_reqs)
                )
            """,
        ),
    ),
    Variant(
        V1,
        "a helper with early returns (guard clauses)",
        True,
        v1_edit(
            """
            if force_uniform_decode is None and uniform_decode and not self._all_decodes(num_reqs):
                uniform_decode = False
            """,
            helper="""
            def _all_decodes(self, num_reqs):
                width = self.uniform_decode_query_len - 1
                for row in range(num_reqs):
                    if self.input_batch.num_computed_tokens_cpu[row] < self.input_batch.num_prompt_tokens[row]:
                        return False
                    if len(self.input_batch.spec_token_ids[row]) != width:
                        return False
                return True
            """,
        ),
    ),
    Variant(
        V1,
        "the attention builders' draft counts",
        True,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                k = self.uniform_decode_query_len - 1
                if k == 0:
                    uniform_decode = bool(
                        (self.input_batch.num_computed_tokens_cpu[:num_reqs] > 0).all()
                    )
                else:
                    counts = self.num_decode_draft_tokens.np[:num_reqs]
                    uniform_decode = len(
                        self.input_batch.spec_token_ids[0]
                    ) == k and bool((counts == k).all())
            """
        ),
    ),
    Variant(
        V1,
        "np.any of the negation",
        True,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                computed = self.input_batch.num_computed_tokens_cpu[:num_reqs]
                prompt = self.input_batch.num_prompt_tokens[:num_reqs]
                missing = [
                    len(self.input_batch.spec_token_ids[i])
                    != self.uniform_decode_query_len - 1
                    for i in range(num_reqs)
                ]
                if np.any(computed < prompt) or any(missing):
                    uniform_decode = False
            """
        ),
    ),
    Variant(
        V1,
        "a while loop that stops at the first prompt row",
        True,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                row = 0
                while row < num_reqs and uniform_decode:
                    uniform_decode = bool(
                        self.input_batch.num_computed_tokens_cpu[row]
                        >= self.input_batch.num_prompt_tokens[row]
                    ) and len(self.input_batch.spec_token_ids[row]) == (
                        self.uniform_decode_query_len - 1
                    )
                    row += 1
            """
        ),
    ),
    # -- look-alikes: each wrong in its own way --
    Variant(
        V1,
        "the comparison reversed (prompt chunks kept ON the decode graph)",
        False,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                uniform_decode = bool(
                    (
                        self.input_batch.num_computed_tokens_cpu[:num_reqs]
                        < self.input_batch.num_prompt_tokens[:num_reqs]
                    ).all()
                )
            """
        ),
    ),
    Variant(
        V1,
        "only the first row checked",
        False,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                uniform_decode = bool(
                    self.input_batch.num_computed_tokens_cpu[0]
                    >= self.input_batch.num_prompt_tokens[0]
                ) and len(self.input_batch.spec_token_ids[0]) == (
                    self.uniform_decode_query_len - 1
                )
            """
        ),
    ),
    Variant(
        V1,
        "prompt lengths alone (a row re-computing outputs after preemption passes)",
        False,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                uniform_decode = bool(
                    (
                        self.input_batch.num_computed_tokens_cpu[:num_reqs]
                        >= self.input_batch.num_prompt_tokens[:num_reqs]
                    ).all()
                )
            """
        ),
    ),
    Variant(
        V1,
        "every real step sent off the decode graph",
        False,
        v1_edit(
            """
            if force_uniform_decode is None:
                uniform_decode = False
            """
        ),
    ),
    Variant(
        V1,
        "the whole column read, past the batch's rows",
        False,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                batch = self.input_batch
                uniform_decode = bool(
                    (batch.num_computed_tokens_cpu[: len(batch.num_prompt_tokens)] >= batch.num_prompt_tokens).all()
                ) and all(
                    len(batch.spec_token_ids[i]) == self.uniform_decode_query_len - 1
                    for i in range(num_reqs)
                )
            """
        ),
    ),
    Variant(
        V1,
        "prior state alone (a chunked prompt's tail passes)",
        False,
        v1_edit(
            """
            if uniform_decode and force_uniform_decode is None:
                uniform_decode = bool(
                    (self.input_batch.num_computed_tokens_cpu[:num_reqs] > 0).all()
                )
            """
        ),
    ),
    Variant(
        V1,
        "the check made after the graph is dispatched",
        False,
        v1_edit(_COMPLETED_UPSTREAM, after_dispatcher=True),
    ),
]


# -- V1 dummy staging: the backport's edit, changed ----------------------------------

DUMMY = "v1-dummy-staging"


def with_backport(fix_id: str, root: Path) -> Edited:
    """The backport's edit of the tree for ``fix_id`` (and only that fix)."""
    plan = planner(fix_id).plan(Tree(root))
    return dict(plan.texts)


def dummy_edit(*changes: tuple[str, str]) -> Callable[[Path], Edited]:
    def edit(root: Path) -> Edited:
        edited = with_backport(DUMMY, root)
        text = edited[V1_RUNNER]
        for old, new in changes:
            text = replace_once(text, old, new)
        edited[V1_RUNNER] = text
        return edited

    return edit


_FLOOR = "        seq_lens[:num_reqs] = np.maximum(seq_lens[:num_reqs], num_scheduled_tokens)\n"
_POSITIONS = "        positions = np.repeat(num_computed_tokens, num_scheduled_tokens) + query_pos\n"
_QUERY_POS = """        cu_num_tokens = np.cumsum(num_scheduled_tokens)
        query_pos = np.arange(num_tokens) - np.repeat(
            cu_num_tokens - num_scheduled_tokens, num_scheduled_tokens
        )
"""
_CLEAR_ROWS = "        self.input_batch.num_computed_tokens_cpu[num_reqs:] = 0\n"
_MIRROR = (
    "        seq_lens[num_reqs:] = 0\n"
    "        self.seq_lens.copy_(self.optimistic_seq_lens_cpu, non_blocking=True)\n"
)
_CLEAR_TOKENS = "        self.positions[num_tokens:].zero_()\n"
_COMPUTED = "        num_computed_tokens = seq_lens[:num_reqs] - num_scheduled_tokens\n"

DUMMY_VARIANTS = [
    Variant(DUMMY, "the backport's staging as written", True, dummy_edit()),
    Variant(
        DUMMY,
        "query positions from a loop",
        True,
        dummy_edit(
            (
                _QUERY_POS,
                "        query_pos = np.zeros(num_tokens, dtype=np.int64)\n"
                "        start = 0\n"
                "        for count in num_scheduled_tokens:\n"
                "            query_pos[start : start + count] = np.arange(count)\n"
                "            start += count\n",
            )
        ),
    ),
    Variant(
        DUMMY,
        "query positions by concatenation",
        True,
        dummy_edit(
            (
                _QUERY_POS,
                "        query_pos = np.concatenate(\n"
                "            [np.arange(n) for n in num_scheduled_tokens]\n"
                "        ).astype(np.int64)\n",
            )
        ),
    ),
    Variant(
        DUMMY,
        "positions per request in a loop",
        True,
        dummy_edit(
            (
                _POSITIONS,
                "        positions = np.empty(num_tokens, dtype=np.int64)\n"
                "        start = 0\n"
                "        for req, count in enumerate(num_scheduled_tokens):\n"
                "            positions[start : start + count] = num_computed_tokens[req] + np.arange(count)\n"
                "            start += count\n",
            )
        ),
    ),
    Variant(
        DUMMY,
        "the floor with np.where",
        True,
        dummy_edit(
            (
                _FLOOR,
                "        short = seq_lens[:num_reqs] < num_scheduled_tokens\n"
                "        seq_lens[:num_reqs] = np.where(short, num_scheduled_tokens, seq_lens[:num_reqs])\n",
            )
        ),
    ),
    Variant(
        DUMMY,
        "computed lengths with np.subtract",
        True,
        dummy_edit(
            (
                _COMPUTED,
                "        num_computed_tokens = np.subtract(seq_lens[:num_reqs], num_scheduled_tokens)\n",
            )
        ),
    ),
    Variant(
        DUMMY,
        "padded rows cleared with fill",
        True,
        dummy_edit(
            (
                _CLEAR_ROWS,
                "        self.input_batch.num_computed_tokens_cpu[num_reqs:].fill(0)\n",
            )
        ),
    ),
    Variant(
        DUMMY,
        "padded tokens cleared by assignment",
        True,
        dummy_edit((_CLEAR_TOKENS, "        self.positions[num_tokens:] = 0\n")),
    ),
    # -- look-alikes --
    Variant(
        DUMMY,
        "no floor under a short profiling length",
        False,
        dummy_edit((_FLOOR, "")),
    ),
    Variant(
        DUMMY,
        "positions without the computed offset",
        False,
        dummy_edit((_POSITIONS, "        positions = query_pos\n")),
    ),
    Variant(
        DUMMY,
        "padded rows left stale",
        False,
        dummy_edit((_CLEAR_ROWS, "")),
    ),
    Variant(
        DUMMY,
        "the device mirror left stale",
        False,
        dummy_edit((_MIRROR, "        seq_lens[num_reqs:] = 0\n")),
    ),
    Variant(
        DUMMY,
        "padded tokens left stale",
        False,
        dummy_edit((_CLEAR_TOKENS, "")),
    ),
]


# -- MRV2 --------------------------------------------------------------------------

MRV2 = "mrv2-phase-dispatch"
_HAS_PREFILL = """            has_prefill = bool(
                np.any(
                    req_states.num_computed_prefill_tokens[rows]
                    < req_states.prefill_len.np[rows]
                )
            )
"""
_ROWS = """            rows = np.fromiter(
                (req_states.req_id_to_index[req_id] for req_id in num_tokens_per_req),
                dtype=np.int64,
                count=num_reqs,
            )
"""
_DRAFT_PHASE = "input_batch.is_prefilling_np[:num_reqs].any()"


def mrv2_edit(
    runner: tuple[tuple[str, str], ...] = (), draft: str | None = None
) -> Callable[[Path], Edited]:
    """The backport's MRV2 edit with ``runner`` changes in the runner and the
    draft prefill's phase test replaced by ``draft`` in every speculator."""

    def edit(root: Path) -> Edited:
        edited = with_backport(MRV2, root)
        for old, new in runner:
            edited[MRV2_RUNNER] = replace_once(edited[MRV2_RUNNER], old, new)
        if draft is not None:
            for relpath, text in edited.items():
                if "spec_decode" in relpath and _DRAFT_PHASE in text:
                    edited[relpath] = text.replace(_DRAFT_PHASE, draft)
        return edited

    return edit


def upstream_edit(*changes: tuple[str, str]) -> Callable[[Path], Edited]:
    """Upstream's own MRV2 fix (0.28 on), its text changed."""

    def edit(root: Path) -> Edited:
        edited: Edited = {}
        for old, new in changes:
            for relpath in _mrv2_files(root):
                text = edited.get(relpath, _read(root, relpath))
                if old in text:
                    edited[relpath] = text.replace(old, new)
        assert edited, f"none of {changes} is in this tree"
        return edited

    return edit


def _mrv2_files(root: Path) -> list[str]:
    gpu = root / "vllm" / "v1" / "worker" / "gpu"
    return sorted(str(p.relative_to(root)) for p in gpu.rglob("*.py"))


_UPSTREAM_PHASE = "is_prefilling_np = num_computed_prefill_tokens_np < prefill_len_np"
#: Upstream's exception (0.31 on): one new prompt token over prior context runs
#: as a decode.
_ONE_TOKEN_EXTENSION = (
    "one_token_ext = (num_new_tokens == 1) & (num_computed_prefill_tokens_np > 0)"
)
_PROMPT_EXTENSION_BRANCH = "if has_prefill and self.pcp_manager is None:"

MRV2_VARIANTS = [
    Variant(
        MRV2,
        "the backport's edit (upstream's helpers) as written",
        True,
        mrv2_edit(),
        "needed",
    ),
    Variant(
        MRV2,
        "rows from a list",
        True,
        mrv2_edit(
            (
                (
                    _ROWS,
                    "            rows = np.array(\n"
                    "                [req_states.req_id_to_index[r] for r in num_tokens_per_req]\n"
                    "            )\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "a loop that stops at the first prompt",
        True,
        mrv2_edit(
            (
                (
                    _HAS_PREFILL,
                    "            for row in rows:\n"
                    "                if req_states.num_computed_prefill_tokens[row] < req_states.prefill_len.np[row]:\n"
                    "                    has_prefill = True\n"
                    "                    break\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "np.greater with the operands swapped",
        True,
        mrv2_edit(
            (
                (
                    _HAS_PREFILL,
                    "            has_prefill = bool(\n"
                    "                np.greater(\n"
                    "                    req_states.prefill_len.np[rows],\n"
                    "                    req_states.num_computed_prefill_tokens[rows],\n"
                    "                ).any()\n"
                    "            )\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "a generator and other names",
        True,
        mrv2_edit(
            (
                (
                    _HAS_PREFILL,
                    "            states = self.req_states\n"
                    "            has_prefill = any(\n"
                    "                states.num_computed_prefill_tokens[slot] < states.prefill_len.np[slot]\n"
                    "                for slot in rows\n"
                    "            )\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "a helper method the count calls",
        True,
        mrv2_edit(
            (
                (
                    _HAS_PREFILL,
                    "            has_prefill = self._scheduled_prefill(req_states, rows)\n",
                ),
                (
                    "    def _get_uniform_decode_token_count(\n",
                    "    def _scheduled_prefill(self, req_states, rows):\n"
                    "        computed = req_states.num_computed_prefill_tokens[rows]\n"
                    "        return bool((computed < req_states.prefill_len.np[rows]).any())\n"
                    "\n"
                    "    def _get_uniform_decode_token_count(\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "the draft's phase test with any()",
        True,
        mrv2_edit(draft="any(input_batch.is_prefilling_np[:num_reqs])"),
        "needed",
    ),
    Variant(
        MRV2,
        "the draft's phase test as a count",
        True,
        mrv2_edit(draft="(input_batch.is_prefilling_np[:num_reqs].sum() > 0)"),
        "needed",
    ),
    Variant(
        MRV2,
        "upstream's comparison with np.less",
        True,
        upstream_edit(
            (
                _UPSTREAM_PHASE,
                "is_prefilling_np = np.less(num_computed_prefill_tokens_np, prefill_len_np)",
            )
        ),
        "native",
    ),
    Variant(
        MRV2,
        "upstream's comparison with the operands swapped",
        True,
        upstream_edit(
            (
                _UPSTREAM_PHASE,
                "is_prefilling_np = prefill_len_np > num_computed_prefill_tokens_np",
            )
        ),
        "native",
    ),
    Variant(
        MRV2,
        "upstream's has_prefill with any()",
        True,
        upstream_edit(
            (
                "has_prefill = bool(is_prefilling_np.any())",
                "has_prefill = any(is_prefilling_np)",
            )
        ),
        "native",
    ),
    # -- look-alikes --
    Variant(
        MRV2,
        "the comparison reversed",
        False,
        mrv2_edit(
            (
                (
                    "                    req_states.num_computed_prefill_tokens[rows]\n"
                    "                    < req_states.prefill_len.np[rows]\n",
                    "                    req_states.num_computed_prefill_tokens[rows]\n"
                    "                    >= req_states.prefill_len.np[rows]\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "only the first scheduled request checked",
        False,
        mrv2_edit(((_ROWS, _ROWS + "            rows = rows[:1]\n"),)),
        "needed",
    ),
    Variant(
        MRV2,
        "the draft prefill left to the shape rule",
        False,
        mrv2_edit(draft="False"),
        "needed",
    ),
    Variant(
        MRV2,
        "every request's state read, scheduled or not",
        False,
        mrv2_edit(
            (
                (
                    "                    req_states.num_computed_prefill_tokens[rows]\n"
                    "                    < req_states.prefill_len.np[rows]\n",
                    "                    req_states.num_computed_prefill_tokens[\n"
                    "                        : len(req_states.prefill_len.np)\n"
                    "                    ]\n"
                    "                    < req_states.prefill_len.np\n",
                ),
            )
        ),
        "needed",
    ),
    Variant(
        MRV2,
        "upstream's comparison reversed",
        False,
        upstream_edit(
            (
                _UPSTREAM_PHASE,
                "is_prefilling_np = num_computed_prefill_tokens_np >= prefill_len_np",
            )
        ),
        "native",
    ),
    Variant(
        MRV2,
        "upstream's phase test beside a varlen decode graph that admits a short prompt",
        False,
        upstream_edit(
            (
                "            if batch_req_state.has_prefill:\n"
                "                # Varlen decode graphs replay decodes only, and their bound\n"
                "                # alone would admit a short prefill.\n"
                "                max_query_len = None\n",
                "",
            ),
            (
                "            if not batch_req_state.decode_graph_eligible:\n"
                "                # A query-length bound alone would admit a short prefill.\n"
                "                max_query_len = None\n",
                "",
            ),
        ),
        "native",
    ),
    # -- upstream's one-token prompt extension (0.31 on), rewritten and widened --
    Variant(
        MRV2,
        "upstream's one-token extension with np.logical_and",
        True,
        upstream_edit(
            (
                _ONE_TOKEN_EXTENSION,
                "one_token_ext = np.logical_and(\n"
                "                num_new_tokens == 1, num_computed_prefill_tokens_np > 0\n"
                "            )",
            )
        ),
        "native",
        requires=_ONE_TOKEN_EXTENSION,
    ),
    Variant(
        MRV2,
        "the one-token extension widened to a decode's width of new tokens",
        False,
        upstream_edit(
            (
                _ONE_TOKEN_EXTENSION,
                "one_token_ext = (num_new_tokens <= self.decode_query_len) & "
                "(num_computed_prefill_tokens_np > 0)",
            )
        ),
        "native",
        requires=_ONE_TOKEN_EXTENSION,
    ),
    Variant(
        MRV2,
        "the one-token extension granted to a fresh prompt",
        False,
        upstream_edit((_ONE_TOKEN_EXTENSION, "one_token_ext = num_new_tokens == 1")),
        "native",
        requires=_ONE_TOKEN_EXTENSION,
    ),
    Variant(
        MRV2,
        "the shape rule again: every batch eligible for the decode graph",
        False,
        upstream_edit(
            ("decode_graph_eligible = not has_prefill", "decode_graph_eligible = True"),
            (_PROMPT_EXTENSION_BRANCH, "if False:"),
            (
                "            if batch_req_state.has_prefill:\n",
                "            if False:\n",
            ),
            (
                "            if not batch_req_state.decode_graph_eligible:\n",
                "            if False:\n",
            ),
        ),
        "native",
        requires="decode_graph_eligible = not has_prefill",
    ),
    Variant(
        MRV2,
        "upstream's draft prefill eligible whatever the phase",
        False,
        upstream_edit(
            ("input_batch.decode_graph_eligible,", "True,"),
            ("input_batch.decode_graph_eligible\n", "True\n"),
        ),
        "native",
    ),
]


# -- The replay guard: the backport's edit of the FULL wrapper's call, changed --------

GUARD = "replay-guard"
CUDA_GRAPH_FILE = "vllm/compilation/cuda_graph.py"
_GUARD_START = (
    "        if (\n"
    "            cudagraph_runtime_mode == CUDAGraphMode.FULL\n"
    "            and batch_descriptor is not None\n"
)
_GUARD_END = "                forward_context.cudagraph_runtime_mode = cudagraph_runtime_mode\n\n"


def _replay_statement(text: str) -> int:
    """Where the wrapper's statement that replays the graph starts (a fork
    may hand the replay to a tracing call, as 1Cat-vLLM does)."""
    at = text.rindex("\n", 0, text.index("entry.cudagraph.replay")) + 1
    while not text.startswith(" " * 8, at) or text.startswith(" " * 9, at):
        at = text.rindex("\n", 0, at - 1) + 1
    return at


def guard_edit(block: str, at_replay: bool = False) -> Callable[[Path], Edited]:
    """The backport's guard in ``CUDAGraphWrapper.__call__`` replaced by
    ``block`` (its ``{flag}``: the tree's batch descriptor's uniform field), in
    the same place or, ``at_replay``, just before the graph's replay. The
    helper the backport adds stays (Model Runner V2's edit uses it)."""

    def edit(root: Path) -> Edited:
        edited = with_backport(GUARD, root)
        text = edited[CUDA_GRAPH_FILE]
        start = text.index(_GUARD_START)
        end = text.index(_GUARD_END, start) + len(_GUARD_END)
        guard = text[start:end]
        flag = "uniform_decode" if ".uniform_decode\n" in guard else "uniform"
        body = textwrap.indent(
            textwrap.dedent(block).strip("\n").replace("{flag}", flag) + "\n", " " * 8
        )
        if at_replay:
            text = text[:start] + text[end:]
            at = _replay_statement(text)
            text = text[:at] + body + text[at:]
        else:
            text = text[:start] + body + "\n" + text[end:]
        edited[CUDA_GRAPH_FILE] = text
        return edited

    return edit


def _guard_loop(groups: str = "step_metadata", rows: str = "layers.values()") -> str:
    """An inline guard: every microbatch's and layer's ``num_prefills`` read."""
    return f"""
    step_metadata = forward_context.attn_metadata
    if (
        cudagraph_runtime_mode == CUDAGraphMode.FULL
        and batch_descriptor is not None
        and batch_descriptor.{{flag}}
        and step_metadata is not None
    ):
        if not isinstance(step_metadata, list):
            step_metadata = [step_metadata]
        holds_prompt = False
        for layers in {groups}:
            for layer_metadata in {rows}:
                if getattr(layer_metadata, "num_prefills", 0):
                    holds_prompt = True
        if holds_prompt:
            return self.runnable(*args, **kwargs)
"""


_GUARD_BY_HELPER = """
if (
    cudagraph_runtime_mode == CUDAGraphMode.FULL
    and batch_descriptor is not None
    and batch_descriptor.{flag}
    and graphsafe_attn_metadata_has_prefill(forward_context.attn_metadata)
):
    return self.runnable(*args, **kwargs)
"""


def _prefill_rows(expression: str) -> str:
    """A guard on ``expression`` over ``counts``: each layer's prefill count."""
    return f"""
    metadata = forward_context.attn_metadata
    microbatches = metadata if isinstance(metadata, list) else [metadata]
    counts = [
        getattr(layer, "num_prefills", 0)
        for per_layer in microbatches
        if per_layer
        for layer in per_layer.values()
    ]
    if (
        cudagraph_runtime_mode == CUDAGraphMode.FULL
        and getattr(batch_descriptor, "{{flag}}", False)
        and {expression}
    ):
        return self.runnable(*args, **kwargs)
"""


def _guard_as_written(root: Path) -> Edited:
    return with_backport(GUARD, root)


GUARD_VARIANTS = [
    Variant(GUARD, "the backport's guard as written", True, _guard_as_written),
    Variant(
        GUARD, "inline loops, other names, no helper", True, guard_edit(_guard_loop())
    ),
    Variant(
        GUARD,
        "a guard clause around the helper's test, no logging or mode switch",
        True,
        guard_edit(
            """
            if cudagraph_runtime_mode == CUDAGraphMode.FULL and batch_descriptor:
                if batch_descriptor.{flag}:
                    if graphsafe_attn_metadata_has_prefill(
                        forward_context.attn_metadata
                    ):
                        return self.runnable(*args, **kwargs)
            """
        ),
    ),
    Variant(
        GUARD, "any() over the counts", True, guard_edit(_prefill_rows("any(counts)"))
    ),
    Variant(
        GUARD, "sum() of the counts", True, guard_edit(_prefill_rows("sum(counts) > 0"))
    ),
    Variant(
        GUARD,
        "max() of the counts",
        True,
        guard_edit(_prefill_rows("max(counts, default=0) > 0")),
    ),
    Variant(
        GUARD,
        "a torch tensor of the counts",
        True,
        guard_edit(
            _prefill_rows("bool(torch.tensor(counts, dtype=torch.int64).any())")
        ),
    ),
    Variant(
        GUARD,
        "the check just before the replay",
        True,
        guard_edit(_GUARD_BY_HELPER, at_replay=True),
    ),
    # Look-alikes.
    Variant(
        GUARD,
        "only the first KV-cache group read",
        False,
        guard_edit(_guard_loop(rows="list(layers.values())[:1]")),
    ),
    Variant(
        GUARD,
        "only the first microbatch read",
        False,
        guard_edit(_guard_loop(groups="step_metadata[:1]")),
    ),
    Variant(
        GUARD,
        "the test reversed: decode steps leave the graph",
        False,
        guard_edit(_prefill_rows("not any(counts)")),
    ),
    Variant(
        GUARD,
        "every FULL replay of a decode graph sent to eager",
        False,
        guard_edit(_prefill_rows("True")),
    ),
    Variant(
        GUARD,
        "FULL graphs captured for mixed batches left as well",
        False,
        guard_edit(
            """
            if cudagraph_runtime_mode == CUDAGraphMode.FULL and (
                graphsafe_attn_metadata_has_prefill(forward_context.attn_metadata)
            ):
                return self.runnable(*args, **kwargs)
            """
        ),
    ),
]

ALL_VARIANTS = [*V1_VARIANTS, *DUMMY_VARIANTS, *MRV2_VARIANTS, *GUARD_VARIANTS]
