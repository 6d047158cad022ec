"""Questions answered from the statements they are about give the whole parse's answers.

Each module text below hides a trap for a reader that would find statements
by text alone (a ``def`` inside a string, a closing bracket at column 0, a
decorator over two lines, ...). The oracle is :mod:`ast` on the whole text,
with :mod:`vllm_graphsafe.recognition` applied to it; the reader under test
parses only pieces, and the tests also check that it did (or, for text the
outline must refuse, that it parsed the module whole).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from vllm_graphsafe import recognition
from vllm_graphsafe.outline import Outline, OutlineError
from vllm_graphsafe.sources import DefinitionSite, SourceReader

MODULE = "stand_in.sample"

TRICKY = '''\
"""Module docstring naming def helper(): and class Runner: in prose."""
import os
from typing import (
    Any,
)
from pkg import (a, b as renamed,
)

LIMIT: int = 4
helper_alias = other = None


def helper(x: int = len("def fake(): pass")) -> int:
    """A docstring with
def not_a_function():
    pass
at column 0."""
    return os.getpid() + compute(x)


@decorate(
    "arg",
)
@other.decorator
def decorated(a,
              b):  # a comment with 'quotes" and # hashes
    return a \\
        + b


class Runner(Base,
             metaclass=Meta):
    """The runner."""

    field: int
    named = value = 3
    listed: list[int] = [
1, 2,
]
    text = """
    def fake_method(self):
        self.fake = 1
"""

    def __init__(self) -> None:
        self.built = make()
        self.left, self.right = 1, 2
        (self).wrapped = 0
        self.counter += 1
        self.typed: int = 5
        for self.looped in range(3):
            pass
        if self.built: self.inline = 1
        else: self.elsewhere = 2
        try: self.tried = 1
        except ValueError: self.caught = 2
        print(f"{self.formatted}")
        self.mentioned.append(1)

    @property
    def prop(self) -> int:
        return self.field

    async def later(self):
        async with self.lock:
            self.locked = call_inside()

    def compute(self, x):
        def inner():
            self.nested = x
        return inner

    class Inner:
        def method(self):
            self.inner_set = 1


class Runner:  # a second class of the same name: never the one found
    def compute(self):
        self.second = 1


class OneLine: attr = 1


def compute(x):
    return x


if TYPE_CHECKING:
    guarded = 1
else:
    from pkg import guarded_import
'''


def reader_for(tmp_path: Path, text: str) -> SourceReader:
    file = tmp_path / Path(*MODULE.split(".")).with_suffix(".py")
    file.parent.mkdir(parents=True, exist_ok=True)
    (file.parent / "__init__.py").write_text("")
    file.write_text(text)
    return SourceReader(root=tmp_path)


def names_in(tree: ast.Module) -> list[str]:
    found = {"absent_everywhere", "self"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
    return sorted(found)


def qualnames_in(tree: ast.Module) -> list[str]:
    found = ["absent", "Runner.absent", "Absent.method"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node.name)
        elif isinstance(node, ast.ClassDef):
            found.append(node.name)
            found += [
                f"{node.name}.{child.name}"
                for child in node.body
                if isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                )
            ]
    return found


def assert_same_as_the_whole_parse(reader: SourceReader, text: str) -> None:
    tree = ast.parse(text)
    for qualname in qualnames_in(tree):
        piece = reader.function_node(MODULE, qualname)
        whole = recognition.find_function(tree, qualname)
        assert (piece is None) == (whole is None), qualname
        if piece is not None and whole is not None:
            assert ast.dump(piece, include_attributes=True) == ast.dump(
                whole, include_attributes=True
            ), qualname
            assert reader.function(MODULE, qualname) == "".join(
                text.splitlines(keepends=True)[whole.lineno - 1 : whole.end_lineno]
            )
    for qualname in qualnames_in(tree):
        whole = recognition.find_function(tree, qualname)
        if "." in qualname:
            assert reader.defines(MODULE, qualname) == (whole is not None), qualname
        for name in names_in(tree):
            expected = whole is not None and recognition.calls_name(whole, name)
            assert reader.calls(MODULE, qualname, name) == expected, (qualname, name)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)] + ["Absent"]
    for name in names_in(tree):
        assert reader.module_calls(MODULE, name) == recognition.calls_name(
            tree, name
        ), name
        if "." not in name:
            assert reader.defines(MODULE, name) == recognition.module_binds(
                tree, name
            ), name
        for owner in classes:
            cls = recognition.find_class(tree, owner)
            expected = cls is not None and recognition.class_sets_attribute(cls, name)
            assert reader.sets_attribute(MODULE, owner, name) == expected, (owner, name)
    for owner in classes:
        whole_class = recognition.find_class(tree, owner)
        assert reader.has_class(MODULE, owner) == (whole_class is not None)
        piece_class = reader.class_node(MODULE, owner)
        assert (piece_class is None) == (whole_class is None)
        if piece_class is not None and whole_class is not None:
            assert ast.dump(piece_class, include_attributes=True) == ast.dump(
                whole_class, include_attributes=True
            )


def test_tricky_text_is_answered_from_pieces_as_the_whole_parse_answers(
    tmp_path: Path,
) -> None:
    reader = reader_for(tmp_path, TRICKY)
    assert_same_as_the_whole_parse(reader, TRICKY)
    assert reader._trees == {}, "the module was parsed whole"
    assert reader.pieces_parsed[MODULE] > 0


def test_a_method_of_a_nested_class_is_found_by_the_whole_parse(
    tmp_path: Path,
) -> None:
    reader = reader_for(tmp_path, TRICKY)
    found = reader.function_node(MODULE, "Runner.Inner.method")
    whole = recognition.find_function(ast.parse(TRICKY), "Runner.Inner.method")
    assert found is not None and whole is not None
    assert ast.dump(found, include_attributes=True) == ast.dump(
        whole, include_attributes=True
    )


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (("sets_attribute", "Runner", "built"), True),
        (("sets_attribute", "Runner", "right"), True),
        (("sets_attribute", "Runner", "wrapped"), True),
        (("sets_attribute", "Runner", "counter"), True),
        (("sets_attribute", "Runner", "elsewhere"), True),
        (("sets_attribute", "Runner", "caught"), True),
        (("sets_attribute", "Runner", "inner_set"), True),
        (("sets_attribute", "Runner", "listed"), True),
        (("sets_attribute", "Runner", "value"), True),
        (("sets_attribute", "Runner", "prop"), True),
        (("sets_attribute", "Runner", "looped"), False),  # a loop target
        (("sets_attribute", "Runner", "fake"), False),  # inside a string
        (("sets_attribute", "Runner", "formatted"), False),  # read in an f-string
        (("sets_attribute", "Runner", "second"), False),  # the other Runner
        (("sets_attribute", "OneLine", "attr"), True),
        (("module_calls", "call_inside"), True),
        (("module_calls", "fake"), False),
        (("defines", "renamed"), True),
        (("defines", "guarded"), False),  # nested in an if
        (("defines", "not_a_function"), False),
    ],
)
def test_answers_of_the_traps(
    tmp_path: Path, question: tuple[str, ...], expected: bool
) -> None:
    reader = reader_for(tmp_path, TRICKY)
    kind, *names = question
    assert getattr(reader, kind)(MODULE, *names) is expected


@pytest.mark.parametrize(
    "text",
    [
        TRICKY.replace("    def compute(self, x):", "\tdef compute(self, x):"),
        TRICKY.replace("\n", "\r\n"),
    ],
    ids=["tab-indented", "carriage-returns"],
)
def test_text_the_outline_cannot_place_is_parsed_whole(
    tmp_path: Path, text: str
) -> None:
    with pytest.raises(OutlineError):
        Outline(text)
    reader = reader_for(tmp_path, text)
    reader.function_node(MODULE, "Runner.prop")
    assert list(reader._trees) == [MODULE], "the whole module was not parsed"


QUOTES = """\
# don't stop at this quote
x = "it's"  # a comment after a string, with "quotes"
y = 'a "b" # not a comment'
z = \'\'\'three
# not a comment, "nor a string"
'quoted' \\' still in\'\'\'
w = "escaped \\" quote" + 'and \\' this'
v = f"{x!r} #{y}" + rb'raw\\\\' + \"\"\"\"\"\"
"""


@pytest.mark.parametrize("text", [TRICKY, QUOTES], ids=["tricky", "quotes"])
def test_strings_and_comments_are_where_the_tokenizer_finds_them(text: str) -> None:
    """Every string literal and comment is blanked (a string's prefix, such
    as ``f`` or ``rb``, stays: it is not inside the quotes), and only they
    are: the blanked text keeps exactly the tokenizer's other tokens."""
    outline = Outline(text)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lexemes = [t for t in tokens if t.type in (tokenize.STRING, tokenize.COMMENT)]
    assert lexemes, "the text holds no string or comment"
    kept: list[str] = []
    for token in tokens:
        prefix = _string_prefix(token) if token.type == tokenize.STRING else ""
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            start = outline.line_start(token.start[0] - 1) + token.start[1]
            end = outline.line_start(token.end[0] - 1) + token.end[1]
            assert outline.code[start + len(prefix) : end].strip("\n ") == ""
            kept += [prefix] if prefix else []
        elif token.string.strip():
            kept.append(token.string)
    blanked = tokenize.generate_tokens(io.StringIO(outline.code).readline)
    assert [t.string for t in blanked if t.string.strip()] == kept


def _string_prefix(token: tokenize.TokenInfo) -> str:
    quoted = token.string.lstrip("bBrRuUfF")
    return token.string[: len(token.string) - len(quoted)]


def test_identifiers_spelled_beyond_ascii_are_found_by_the_whole_parse(
    tmp_path: Path,
) -> None:
    """Python reads a fullwidth ``c`` in ``compute`` as an ASCII one: a search
    for the word would miss the call, so the reader parses the module whole."""
    text = "def caller():\n    return \uff43ompute(1)\n"
    reader = reader_for(tmp_path, text)
    assert reader.module_calls(MODULE, "compute") is True
    assert list(reader._trees) == [MODULE]


def test_a_module_that_does_not_parse_answers_nothing(tmp_path: Path) -> None:
    reader = reader_for(tmp_path, 'def f():\n    return "unterminated\n')
    assert reader.function_node(MODULE, "f") is None
    assert reader.defines(MODULE, "f") is False


def test_a_def_mentions_every_name_its_code_uses_without_being_parsed(
    tmp_path: Path,
) -> None:
    """``mentions`` may only say False of a word no code of the def names (the
    fixes then skip parsing it): checked against each def's whole-parse node."""
    tree = ast.parse(TRICKY)
    reader = reader_for(tmp_path, TRICKY)
    checked = 0
    for qualname in qualnames_in(tree):
        whole = recognition.find_function(tree, qualname)
        if whole is None:
            assert reader.mentions(MODULE, qualname, "self") is None, qualname
            continue
        named = set(names_in(ast.Module([whole], []))) - {"self", "absent_everywhere"}
        named |= {n.id for n in ast.walk(whole) if isinstance(n, ast.Name)}
        for word in named:
            assert reader.mentions(MODULE, qualname, word) is True, (qualname, word)
            checked += 1
        assert reader.mentions(MODULE, qualname, "absent_everywhere") is False
    assert checked > 50
    assert reader._trees == {} and reader.pieces_parsed == {}, "a def was parsed"


def test_a_word_only_in_the_next_method_is_not_mentioned(tmp_path: Path) -> None:
    text = (
        "class Runner:\n"
        "    def first(self):\n"
        "        return self.alpha\n"
        "    # a comment between\n"
        "    @staticmethod\n"
        "    def second():\n"
        "        return beta\n"
    )
    reader = reader_for(tmp_path, text)
    assert reader.mentions(MODULE, "Runner.first", "alpha") is True
    assert reader.mentions(MODULE, "Runner.first", "beta") is False
    assert reader.mentions(MODULE, "Runner.first", "staticmethod") is False
    assert reader.mentions(MODULE, "Runner.second", "staticmethod") is True
    assert reader.mentions(MODULE, "Runner.second", "alpha") is False


@pytest.mark.parametrize(
    "text",
    [
        "def caller():\n    return \uff43ompute(1)\n",  # read as "compute"
        "def caller():\n\treturn compute(1)\n",  # tab indentation
    ],
    ids=["beyond-ascii", "tab-indented"],
)
def test_mentions_does_not_answer_where_a_search_could_miss(
    tmp_path: Path, text: str
) -> None:
    reader = reader_for(tmp_path, text)
    assert reader.mentions(MODULE, "caller", "compute") is None


def test_binding_sites_are_the_whole_parses_bindings(tmp_path: Path) -> None:
    """A def or class is named by its kind; any other binding is the statement
    the whole parse finds (the reader may parse the module whole for those)."""
    reader = reader_for(tmp_path, TRICKY)
    tree = ast.parse(TRICKY)
    for name in names_in(tree):
        binding = recognition.binding_statement(tree.body, name)
        site = reader.binding_site(MODULE, name)
        if isinstance(site, DefinitionSite):
            kinds = {
                "def": ast.FunctionDef | ast.AsyncFunctionDef,
                "class": ast.ClassDef,
            }
            assert isinstance(binding, kinds[site.kind]), name
            assert binding.name == name
        else:
            assert (site is None) == (binding is None), name
            if site is not None and binding is not None:
                assert ast.dump(site) == ast.dump(binding), name


def test_a_long_class_is_named_by_its_header_not_parsed(tmp_path: Path) -> None:
    methods = "".join(f"    def m{i}(self):\n        return {i}\n" for i in range(300))
    reader = reader_for(
        tmp_path, f"class Long(Base):\n{methods}\n\ndef after():\n    pass\n"
    )
    assert reader.binding_site(MODULE, "Long") == DefinitionSite("class", "Long")
    assert reader.binding_site(MODULE, "after") == DefinitionSite("def", "after")
    assert reader.calls(MODULE, "Long.m7", "absent") is False
    assert reader.defines(MODULE, "Long.m299")
    assert not reader.defines(MODULE, "Long.m300")
    assert reader.pieces_parsed.get(MODULE, 0) == 0  # nothing parsed to answer


def test_lines_naming_a_word_are_parsed_alone_in_the_files_order(
    tmp_path: Path,
) -> None:
    reader = reader_for(tmp_path, TRICKY)
    lines = reader.lines_naming(MODULE, "Runner.__init__", "built")
    assert lines is not None
    assert [ast.unparse(line[0]).split("\n")[0] for line in lines] == [
        "self.built = make()",
        "if self.built:",
    ]
    assert reader.lines_naming(MODULE, "Runner.absent", "built") == []
    assert (MODULE, "Runner") not in reader._classes  # never parsed whole
