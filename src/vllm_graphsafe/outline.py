"""Where a module's statements are, found without parsing the whole module.

Parsing vLLM's model runner takes 70-120 ms, and a fix's verdict needs a few
of its functions. :class:`Outline` finds statement boundaries in the source
text the way Python's tokenizer does (outside strings, comments and brackets,
not after a line continuation), so that :mod:`vllm_graphsafe.sources` can
parse just the statements a question is about. Every answer is still read from
parsed code: a piece of source is handed to :func:`ast.parse` with its own
line numbers and columns, and whatever the outline cannot place exactly
(tabs or form feeds in indentation, carriage returns, an unterminated string)
makes it refuse, so the caller parses the whole module instead.
"""

from __future__ import annotations

import ast
import bisect
import functools
import itertools
import re
import unicodedata
from collections.abc import Iterator
from typing import NamedTuple

from vllm_graphsafe import recognition

#: What starts at each of ``#``, ``"`` and ``'``: a comment, or a string literal
#: (triple-quoted first). The lexemes are found by ``str.find`` of these three
#: characters and matched where one is found: a single pattern alternating all
#: three tests every offset of the text, about three times slower.
_LEXEME_AT = {
    "#": re.compile(r"#[^\n]*"),
    '"': re.compile(
        r'"""[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*"""'
        r'|"[^"\\\n]*(?:\\[\s\S][^"\\\n]*)*"'
    ),
    "'": re.compile(
        r"'''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''"
        r"|'[^'\\\n]*(?:\\[\s\S][^'\\\n]*)*'"
    ),
}
#: A line whose indentation the outline cannot measure as the tokenizer does.
_UNMEASURABLE = re.compile(r"^[ ]*[\t\f]", re.MULTILINE)
_BLOCK = 2048
_SEPARATOR = r"(?:[ \t]|\\\n)+"
_HEADER_NAME = re.compile(rf"(?:async{_SEPARATOR})?(def|class){_SEPARATOR}(\w+)")
#: The first word of a compound statement's header (``@``: a decorator).
_COMPOUND = re.compile(
    r"(?:if|elif|else|for|while|try|except|finally|with|async|def|class)\b|@"
)
#: A clause that continues a compound statement: parsed after a stand-in opener.
_CONTINUATION = {
    "elif": "if 0:\n pass\n",
    "else": "if 0:\n pass\n",
    "except": "try:\n pass\n",
    "finally": "try:\n pass\n",
}


def _lexemes(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each comment and string literal of ``text``, in
    order. A quote that starts no literal (an unterminated string) is skipped
    and stays in the text."""
    find, nowhere = text.find, len(text)
    comment, double, single = (_LEXEME_AT[char].match for char in "#\"'")

    def after(char: str, offset: int) -> int:
        found = find(char, offset)
        return nowhere if found < 0 else found

    at_hash, at_double, at_single = after("#", 0), after('"', 0), after("'", 0)
    while True:
        if at_hash < at_double and at_hash < at_single:
            start, found = at_hash, comment(text, at_hash)
        elif at_double < at_single:
            start, found = at_double, double(text, at_double)
        elif at_single < nowhere:
            start, found = at_single, single(text, at_single)
        else:
            return
        end = start + 1 if found is None else found.end()
        if found is not None:
            yield start, end
        if at_hash < end:
            at_hash = after("#", end)
        if at_double < end:
            at_double = after('"', end)
        if at_single < end:
            at_single = after("'", end)


def _net_brackets(code: str, start: int, end: int) -> int:
    """Brackets opened less brackets closed in ``code[start:end]``."""
    count = code.count
    return (
        count("(", start, end)
        + count("[", start, end)
        + count("{", start, end)
        - count(")", start, end)
        - count("]", start, end)
        - count("}", start, end)
    )


def _whole_words(text: str, word: str, start: int, stop: int) -> Iterator[int]:
    """Offsets of ``word`` in ``text[start:stop]`` not inside a longer word."""
    size = len(word)
    while (found := text.find(word, start, stop)) >= 0:
        start = found + size
        if not (_is_word(text[found - 1 : found]) or _is_word(text[start : start + 1])):
            yield found


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _after_self_dot(code: str, offset: int) -> bool:
    """Whether ``self.`` ends at ``offset`` of ``code`` (blanks, line
    continuations and, after ``self``, closing brackets between)."""
    offset = _skip_back(code, offset, " \n\\")
    if not code.endswith(".", 0, offset):
        return False
    offset = _skip_back(code, offset - 1, " \n\\)")
    return code.endswith("self", 0, offset) and not (
        _is_word(code[offset - 5 : offset - 4]) or code[offset - 5 : offset - 4] == "."
    )


def _skip_back(code: str, offset: int, blanks: str) -> int:
    while offset > 0 and code[offset - 1] in blanks:
        offset -= 1
    return offset


#: What may follow an assignment target.
_TARGET_END = re.compile(r"[\s\\)]*(?:=(?!=)|\*\*=|//=|>>=|<<=|[-+*/%&|^@<>]=|:|,|\])")


@functools.lru_cache(maxsize=16)
def _at_indent(indent: int) -> re.Pattern[str]:
    """A newline, then exactly ``indent`` spaces before code (a literal prefix,
    which the regex engine finds fast)."""
    return re.compile(rf"\n {{{indent}}}(?=[^ \n])")


class OutlineError(ValueError):
    """The text is outside what the outline places exactly: parse it whole."""


class Span(NamedTuple):
    """Lines ``[first, end)`` (0-based) of one statement or a run of them."""

    first: int
    end: int
    indent: int
    #: A definition's ``def``/``class`` line (after its decorators).
    header: int = -1


class Outline:
    """Statement boundaries of one module's source text."""

    def __init__(self, text: str) -> None:
        if "\r" in text or (
            ("\t" in text or "\f" in text) and _UNMEASURABLE.search(text)
        ):
            raise OutlineError("carriage returns, tabs or form feeds in indentation")
        self.text = text
        self._string_starts: list[int] = []
        self._string_ends: list[int] = []
        #: A string that may be an f-string (whose fields are code) is not ASCII.
        self._formatted_not_ascii = False
        self.code = self._blank_strings_and_comments(text)
        lengths = [len(line) + 1 for line in text.split("\n")]
        self._line_starts = list(itertools.accumulate(lengths, initial=0))[:-1]
        self._block_depths = self._depths_at_blocks()
        self._top_level = [
            line
            for line in self._lines_at_indent(0, 0, len(self._line_starts))
            if self.starts_statement(line)
        ]
        self._members: dict[int, tuple[list[int], int]] = {}
        #: Per list of statement lines (kept alive here): the first index of
        #: each definition's ``(kind, name)``.
        self._headers: dict[int, tuple[list[int], dict[tuple[str, str], int]]] = {}
        self._hides_identifiers: bool | None = None

    # -- lexical structure -------------------------------------------------------

    def _blank_strings_and_comments(self, text: str) -> str:
        """``text`` with each string literal and comment blanked (newlines kept)."""
        pieces: list[str] = []
        done = 0
        for start, end in _lexemes(text):
            pieces.append(text[done:start])
            lexeme = text[start:end]
            if lexeme[0] != "#":
                self._string_starts.append(start)
                self._string_ends.append(end)
                if not lexeme.isascii() and "f" in text[start - 2 : start].lower():
                    self._formatted_not_ascii = True
            if "\n" in lexeme:
                pieces.append(
                    "\n".join([" " * len(line) for line in lexeme.split("\n")])
                )
            else:
                pieces.append(" " * len(lexeme))
            done = end
        pieces.append(text[done:])
        code = "".join(pieces)
        if "'" in code or '"' in code:
            raise OutlineError("an unterminated string literal")
        return code

    def _depths_at_blocks(self) -> list[int]:
        depths = [0]
        depth = 0
        code = self.code
        for start in range(0, len(code), _BLOCK):
            depth += _net_brackets(code, start, start + _BLOCK)
            depths.append(depth)
        return depths

    def _depth(self, offset: int) -> int:
        """Brackets open before ``offset`` (outside strings and comments)."""
        block = offset // _BLOCK
        start, code = block * _BLOCK, self.code
        return self._block_depths[block] + _net_brackets(code, start, offset)

    def _in_string(self, offset: int) -> bool:
        index = bisect.bisect_left(self._string_starts, offset) - 1
        return index >= 0 and self._string_ends[index] > offset

    @property
    def line_count(self) -> int:
        return len(self._line_starts)

    def indent(self, line: int) -> int:
        start = self._line_starts[line]
        end = self._line_end(line)
        return end - start - len(self.text[start:end].lstrip(" "))

    def _line_end(self, line: int) -> int:
        if line + 1 < len(self._line_starts):
            return self._line_starts[line + 1] - 1
        return len(self.code)

    def starts_statement(self, line: int) -> bool:
        """Whether a logical line (a statement, or a compound one's header)
        starts on ``line``, as the tokenizer reads it."""
        start = self._line_starts[line]
        content = self.text[start : self._line_end(line)].lstrip(" ")
        if not content or content[0] == "#":
            return False
        if line and self.code[start - 2 : start - 1] == "\\":
            return False
        return not self._in_string(start) and self._depth(start) == 0

    def _lines_at_indent(self, indent: int, first: int, end: int) -> Iterator[int]:
        """Lines in ``[first, end)`` with code at exactly column ``indent``."""
        text, starts = self.text, self._line_starts
        if first == 0 and text[:indent] == " " * indent and text[indent:][:1].strip():
            yield 0
        start = starts[first] - 1 if first else 0
        stop = starts[end] - 1 if end < len(starts) else len(text)
        for found in _at_indent(indent).finditer(text, start, stop):
            yield bisect.bisect_right(starts, found.start() + 1) - 1

    def line_start(self, line: int) -> int:
        """The offset of ``line``'s first character."""
        return self._line_starts[line]

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self._line_starts, offset) - 1

    # -- statements ----------------------------------------------------------------

    def header(self, line: int) -> tuple[str, str] | None:
        """``("def"|"class", name)`` of a definition starting on ``line``."""
        start = self._line_starts[line] + self.indent(line)
        found = _HEADER_NAME.match(self.code, start)
        if found is None:
            return None
        kind, name = found.group(1), found.group(2)
        return kind, name if name.isascii() else unicodedata.normalize("NFKC", name)

    def next_statement(self, line: int, end: int, at_most: int) -> int:
        """The first line after ``line`` (before ``end``) starting a statement
        indented at most ``at_most``; ``end`` where none does."""
        for candidate in range(line + 1, end):
            if self.indent(candidate) <= at_most and self.starts_statement(candidate):
                return candidate
        return end

    def statement_at(self, offset: int) -> Span:
        """The logical line holding ``offset`` (with the comments after it)."""
        line = self.line_of(offset)
        first = line
        while first > 0 and not self.starts_statement(first):
            first -= 1
        # Before the first statement there are only comments and blank lines.
        indent = self.indent(first) if self.starts_statement(first) else 0
        end = line + 1
        while end < self.line_count and not self.starts_statement(end):
            end += 1
        return Span(first, end, indent)

    def top_level_statement(self, offset: int) -> Span:
        """The statement at column 0 that holds ``offset``."""
        line = self.line_of(offset)
        index = bisect.bisect_right(self._top_level, line) - 1
        first = self._top_level[index] if index >= 0 else 0
        end = (
            self._top_level[index + 1]
            if index + 1 < len(self._top_level)
            else self.line_count
        )
        return Span(first, end, 0)

    def top_level_definition(self, kind: str, name: str) -> Span | None:
        """The first ``kind`` (``def`` or ``class``) statement at column 0 named
        ``name``, decorators included; None where there is none."""
        return self._definition(kind, name, self._top_level, 0, self.line_count)

    def members(self, owner: Span) -> tuple[list[int], int]:
        """The lines starting a statement directly in the body of the class at
        ``owner``, and the body's indentation (no lines: a one-line body)."""
        header = max(owner.first, owner.header)
        if header not in self._members:
            body = self.next_statement(header, owner.end, 1 << 30)
            if body >= owner.end:
                self._members[header] = [], 0
            else:
                indent = self.indent(body)
                self._members[header] = (
                    [
                        line
                        for line in self._lines_at_indent(indent, body, owner.end)
                        if self.starts_statement(line)
                    ],
                    indent,
                )
        return self._members[header]

    def _definition(
        self, kind: str, name: str, starts: list[int], indent: int, end: int
    ) -> Span | None:
        """The first of ``starts`` (statement lines at ``indent``, up to
        ``end``) that defines ``kind`` ``name``, with its decorators."""
        key = id(starts)
        if key not in self._headers:
            headers: dict[tuple[str, str], int] = {}
            for index, line in enumerate(starts):
                header = self.header(line)
                if header is not None:
                    headers.setdefault(header, index)
            self._headers[key] = (starts, headers)
        index = self._headers[key][1].get((kind, name), -1)
        if index < 0:
            return None
        first = index
        while first > 0 and self.code.startswith(
            "@", self._line_starts[starts[first - 1]] + indent
        ):
            first -= 1
        last = starts[index + 1] if index + 1 < len(starts) else end
        return Span(starts[first], last, indent, header=starts[index])

    def member_definition(self, owner: Span, name: str) -> Span | None:
        """The first ``def`` named ``name`` directly in the body of the class
        at ``owner``; None where there is none."""
        members, indent = self.members(owner)
        return self._definition("def", name, members, indent, owner.end)

    def occurrences(self, word: str, within: Span | None = None) -> Iterator[int]:
        """Offsets where ``word`` appears as a whole word (code, strings and
        comments alike), in ``within`` or the whole text."""
        return _whole_words(self.text, word, *self._bounds(within))

    def _bounds(self, within: Span | None) -> tuple[int, int]:
        if within is None:
            return 0, len(self.text)
        stop = (
            len(self.text)
            if within.end >= self.line_count
            else self._line_starts[within.end]
        )
        return self._line_starts[within.first], stop

    def names(self, span: Span, word: str) -> bool:
        """Whether ``word`` appears as a whole word in ``span``."""
        return next(self.occurrences(word, span), None) is not None

    def self_attribute_targets(self, attribute: str, within: Span) -> Iterator[int]:
        """Offsets in ``within`` of ``self.<attribute>`` where an assignment
        target may end (followed by ``=``, an augmented ``op=``, ``:``, or a
        ``,``/``]`` of a tuple or list target, closing brackets between); an
        assignment to ``self.<attribute>`` is always among them."""
        code = self.code
        for offset in _whole_words(code, attribute, *self._bounds(within)):
            if _after_self_dot(code, offset) and _TARGET_END.match(
                code, offset + len(attribute)
            ):
                yield offset

    def opens_compound(self, line: int) -> bool:
        """Whether the statement on ``line`` is a compound statement's header
        or clause, or a decorator (``match`` aside, a soft keyword)."""
        start = self._line_starts[line] + self.indent(line)
        return _COMPOUND.match(self.code, start) is not None

    def hides_identifiers(self) -> bool:
        """Whether an identifier may be spelled with characters that Python
        reads as ASCII letters (its NFKC form), so a search would miss it."""
        if self._hides_identifiers is None:
            self._hides_identifiers = (
                not self.code.isascii() or self._formatted_not_ascii
            ) and any(
                re.search(r"\w", unicodedata.normalize("NFKC", run), re.ASCII)
                for run in set(re.findall(r"[^\x00-\x7f]+", self.text))
            )
        return self._hides_identifiers

    # -- parsing pieces --------------------------------------------------------------

    def source(self, span: Span) -> str:
        start = self._line_starts[span.first]
        stop = (
            self._line_starts[span.end]
            if span.end < self.line_count
            else len(self.text)
        )
        return self.text[start:stop]

    def parse(self, span: Span) -> list[ast.stmt] | None:
        """The statements of ``span`` as the whole module's parse has them
        (same line numbers and columns); None where they do not parse alone."""
        text = self.source(span)
        if span.indent == 0:
            tree = recognition.parse("\n" * span.first + text)
            return None if tree is None else tree.body
        if span.first == 0:
            return None
        tree = recognition.parse("\n" * (span.first - 1) + "if 1:\n" + text)
        if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.If):
            return None
        return tree.body[0].body

    def parse_clause(self, span: Span) -> list[ast.stmt] | None:
        """The nodes of one logical line, parsed alone (line numbers are not
        kept): a compound statement's header gets a ``pass`` body, a continuing
        clause (``else``, ``except``) a stand-in opener before it, a ``try`` a
        stand-in ``except`` after it; none of these holds a call or an
        assignment. None where it does not parse."""
        parsed = self.parse(span)
        if parsed is not None:
            return list(parsed)
        start = self._line_starts[span.first] + span.indent
        keyword = _COMPOUND.match(self.code, start)
        if keyword is None:
            return None
        word = keyword.group()
        text = self.source(span)[span.indent :].replace("\n" + " " * span.indent, "\n")
        if not text.endswith("\n"):
            text += "\n"
        opener = _CONTINUATION.get(word, "")
        body = "def _(): pass\n" if word == "@" else " pass\n"
        closer = "except BaseException:\n pass\n" if word == "try" else ""
        for attempt in (opener + text + closer, opener + text + body + closer):
            tree = recognition.parse(attempt)
            if tree is not None:
                return list(tree.body)
        return None
