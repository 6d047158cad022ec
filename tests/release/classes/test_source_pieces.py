"""On the installed release, judging from pieces of vLLM's source gives the
verdicts, and the kept answers, that judging from its whole parse gives.

The reference reader parses every module whole (the way every verdict was
judged before pieces); the reader under test parses only the statements each
question is about. Both read the same installed files.
"""

from __future__ import annotations

import ast

import pytest

from vllm_graphsafe import recognition
from vllm_graphsafe.fixes import all_patches
from vllm_graphsafe.outline import Outline
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.verdicts import Verdict


class WholeModuleReader(SourceReader):
    """Answers every question from the whole module's parse."""

    def outline(self, module: str) -> Outline | None:
        return None


def judged_by(reader: SourceReader) -> dict[str, tuple[Verdict, dict[str, bool]]]:
    judged = {}
    for patch in all_patches():
        with reader.recording() as reading:
            verdict = patch.judge(reader)
        judged[patch.id] = (verdict, dict(reading.answers))
    return judged


def test_every_verdict_and_answer_matches_the_whole_parse() -> None:
    pieces, whole = SourceReader(), WholeModuleReader()
    assert judged_by(pieces) == judged_by(whole)
    assert pieces._trees == {}, f"parsed whole: {sorted(pieces._trees)}"
    assert pieces.pieces_parsed, "no piece was parsed: nothing was judged"


#: Words whose absence from a def spares parsing it (``SourceReader.mentions``).
WORDS_THE_FIXES_SEEK = {
    "num_computed_tokens_cpu",
    "positions",
    "gather_batch_req_state",
    "get_uniform_decode_token_count",
    "_get_uniform_decode_token_count",
}


def names_used(node: ast.AST) -> set[str]:
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Name | ast.Attribute)
    }


def modules_the_fixes_read() -> list[str]:
    reader = WholeModuleReader()
    with reader.recording() as reading:
        for patch in all_patches():
            patch.judge(reader)
    return sorted(m for m in reading.modules if reader.text(m) is not None)


@pytest.mark.parametrize("module", modules_the_fixes_read())
def test_every_definition_of_a_module_read_is_found_as_parsed(module: str) -> None:
    """Each module-level def and class, and each method, of every module the
    fixes read: the piece is the whole parse's node, positions included."""
    pieces = SourceReader()
    tree = WholeModuleReader().tree(module)
    assert tree is not None
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found = pieces.class_node(module, node.name)
            expected = recognition.find_class(tree, node.name)
            assert found is not None and expected is not None
            assert ast.dump(found, include_attributes=True) == ast.dump(
                expected, include_attributes=True
            )
            qualnames = [
                f"{node.name}.{child.name}"
                for child in node.body
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            qualnames = [node.name]
        else:
            continue
        for qualname in qualnames:
            piece = pieces.function_node(module, qualname)
            expected_node = recognition.find_function(tree, qualname)
            assert piece is not None and expected_node is not None, qualname
            assert ast.dump(piece, include_attributes=True) == ast.dump(
                expected_node, include_attributes=True
            ), qualname
            for word in names_used(expected_node) & WORDS_THE_FIXES_SEEK:
                assert pieces.mentions(module, qualname, word) is True, (qualname, word)
    assert pieces._trees == {}, f"{module} was parsed whole"
