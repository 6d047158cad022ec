"""Reading vLLM module source without importing it, as text and as parsed code.

Each read keeps the file's identity (its path and the SHA-256 of its bytes),
and yes/no questions about the code (``calls``, ``defines``, ``sets_attribute``)
keep their answers, so that a judgement can be kept with what it read
(:mod:`vllm_graphsafe.verdicts`).

A question parses only the statements it is about, found by the module's
:class:`~vllm_graphsafe.outline.Outline` (a function, the logical lines that
mention a name); where the outline cannot place them exactly, or a piece does
not parse as the statement it should be, the whole module is parsed instead.
Either way the answer is what the module's parsed code says.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from vllm_graphsafe import recognition
from vllm_graphsafe.outline import Outline, OutlineError, Span
from vllm_graphsafe.source_files import read_source, read_tree_source


class SourceReader:
    """Reads vLLM module source without importing it, as text and as parsed code.

    With ``root`` it reads ``<root>/vllm/...py`` (a vLLM source tree) instead
    of the installed package, so a patch can judge an edited tree.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = None if root is None else Path(root)
        self._texts: dict[str, str | None] = {}
        self._identities: dict[str, tuple[str, str] | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._outlines: dict[str, Outline | None] = {}
        self._functions: dict[tuple[str, str], recognition.FunctionNode | None] = {}
        self._classes: dict[tuple[str, str], ast.ClassDef | None] = {}
        self._bindings: dict[tuple[str, str], ast.stmt | None] = {}
        self._sites: dict[tuple[str, str], ast.stmt | DefinitionSite | None] = {}
        #: Yes/no answers about the code (``calls``, ``defines``), by question.
        self._answers: dict[str, bool] = {}
        self._recordings: list[Reading] = []
        #: Modules parsed in pieces (how many pieces) rather than whole.
        self.pieces_parsed: dict[str, int] = {}
        #: The code these sources hold, compiled for the fixes' judgements
        #: (``behaviour.compiled.shared_code``), kept with them.
        self.compiled: object | None = None

    def exists(self, module: str) -> bool:
        return self.text(module) is not None

    def text(self, module: str) -> str | None:
        for recording in self._recordings:
            recording.modules.add(module)
        if module not in self._texts:
            found = (
                read_source(module)
                if self.root is None
                else read_tree_source(self.root, module)
            )
            self._texts[module] = None if found is None else found[0]
            self._identities[module] = None if found is None else found[1]
        return self._texts[module]

    def identity(self, module: str) -> tuple[str, str] | None:
        """``(file path, SHA-256 of its bytes)`` of ``module``; None: no source."""
        self.text(module)
        return self._identities.get(module)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Reading]:
        """Collect every module read, and every yes/no answer given, in the block."""
        reading = Reading()
        self._recordings.append(reading)
        try:
            yield reading
        finally:
            self._recordings.remove(reading)

    def know(self, answers: Mapping[str, bool]) -> None:
        """Take ``answers`` given before on sources with these same bytes."""
        self._answers.update(answers)

    def _answer(self, module: str, question: str, work: Callable[[], bool]) -> bool:
        self.text(module)
        if question not in self._answers:
            self._answers[question] = work()
        for recording in self._recordings:
            recording.answers[question] = self._answers[question]
        return self._answers[question]

    def kept_answer(
        self, module: str, kind: str, names: tuple[str, ...], work: Callable[[], bool]
    ) -> bool:
        """A yes/no question of a fix's own about ``module``'s code, answered by
        ``work`` once and kept with the verdicts like the built-in questions."""
        return self._answer(module, question(kind, module, *names), work)

    def tree(self, module: str) -> ast.Module | None:
        """The whole module, parsed (the outline's questions avoid this)."""
        if module not in self._trees:
            text = self.text(module)
            self._trees[module] = None if text is None else recognition.parse(text)
        return self._trees[module]

    def outline(self, module: str) -> Outline | None:
        """Where ``module``'s statements are; None where it has no source, is
        parsed whole already, or is text the outline cannot place exactly."""
        if module not in self._outlines:
            text = self.text(module)
            outline = None
            if text is not None and module not in self._trees:
                try:
                    outline = Outline(text)
                except OutlineError:
                    outline = None
            self._outlines[module] = outline
        return self._outlines[module] if module not in self._trees else None

    def _parse(
        self, outline: Outline, module: str, span: Span
    ) -> list[ast.stmt] | None:
        self.pieces_parsed[module] = self.pieces_parsed.get(module, 0) + 1
        return outline.parse(span)

    def _clause(
        self, outline: Outline, module: str, span: Span
    ) -> list[ast.stmt] | None:
        self.pieces_parsed[module] = self.pieces_parsed.get(module, 0) + 1
        return outline.parse_clause(span)

    def _searchable(self, module: str) -> Outline | None:
        """The outline, where a search for a name finds every place that names it."""
        outline = self.outline(module)
        return None if outline is None or outline.hides_identifiers() else outline

    def defines(self, module: str, qualname: str) -> bool:
        """Whether ``module`` defines ``qualname`` in code (a method, or a
        module-level def, class, import or assignment)."""
        return self._answer(
            module,
            question("defines", module, qualname),
            lambda: self._defines(module, qualname),
        )

    def _defines(self, module: str, qualname: str) -> bool:
        if "." in qualname:
            outline = self.outline(module)
            if outline is not None and qualname.count(".") == 1:
                # The def's header, found where the parse of its lines would
                # find it (a method is not parsed just to say it exists).
                return _definition_span(outline, qualname) is not None
            return self.function_node(module, qualname) is not None
        outline = self._searchable(module)
        if outline is not None:
            binds = self._binds_at_top_level(outline, module, qualname)
            if binds is not None:
                return binds
        tree = self.tree(module)
        return tree is not None and recognition.module_binds(tree, qualname)

    def _binds_at_top_level(
        self, outline: Outline, module: str, name: str
    ) -> bool | None:
        """``recognition.module_binds`` from the top-level statements that
        mention ``name``; None: parse the module whole."""
        seen: set[int] = set()
        for offset in outline.occurrences(name):
            span = outline.top_level_statement(offset)
            if span.first in seen:
                continue
            seen.add(span.first)
            header = outline.header(span.first)
            if header is not None:
                if header[1] == name:
                    return True
                continue
            if outline.opens_compound(span.first):
                continue  # binds nothing directly at module level
            statements = self._parse(outline, module, span)
            if statements is None:
                return None
            if recognition.module_binds(ast.Module(statements, []), name):
                return True
        return False

    def function_node(
        self, module: str, qualname: str
    ) -> recognition.FunctionNode | None:
        """The ``def`` of ``qualname`` (``Class.method`` or a module-level name)."""
        key = (module, qualname)
        if key not in self._functions:
            found = self._function_piece(module, qualname)
            if found is _UNSURE:
                tree = self.tree(module)
                found = (
                    None if tree is None else recognition.find_function(tree, qualname)
                )
            self._functions[key] = found  # type: ignore[assignment]
        return self._functions[key]

    def _function_piece(self, module: str, qualname: str) -> object:
        """The def from its own lines; ``_UNSURE`` where the outline cannot tell."""
        outline = self.outline(module)
        *owners, leaf = qualname.split(".")
        if outline is None or len(owners) > 1:
            return _UNSURE
        span = _definition_span(outline, qualname)
        if span is None:
            return None
        statements = self._parse(outline, module, span)
        if (
            statements is None
            or len(statements) != 1
            or not isinstance(statements[0], ast.FunctionDef | ast.AsyncFunctionDef)
            or statements[0].name != leaf
        ):
            return _UNSURE
        return statements[0]

    def definition_text(self, module: str, qualname: str) -> DefinitionText | None:
        """The lines of the ``def`` of ``qualname`` as the file has them, and
        its decorators' source, found by the outline without parsing; None
        where there is no such def or the outline cannot place it."""
        found = self._definition_lines(module, qualname)
        if found is None or found[1] is None:
            return None
        outline, span = found[0], found[1]
        header = max(span.header, span.first)
        decorators: list[str] = []
        for line in range(span.first, header):
            text = outline.source(Span(line, line + 1, span.indent))
            if text[span.indent :].startswith("@"):
                decorators.append(text)
            elif decorators:
                decorators[-1] += text
        return DefinitionText(
            text=outline.source(Span(header, span.end, span.indent)),
            line=header,
            indent=span.indent,
            decorators=tuple(decorators),
        )

    def mentions(self, module: str, qualname: str, word: str) -> bool | None:
        """Whether the text of the ``def`` of ``qualname`` (decorators
        included) holds ``word`` as a whole word, in code, strings or comments.
        False: no code of the def names ``word``, so a question about its uses
        is answered without parsing the def. None where there is no such def or
        the outline cannot tell (the caller parses the def instead)."""
        found = self._definition_lines(module, qualname)
        if found is None or found[1] is None:
            return None
        return found[0].names(found[1], word)

    def _definition_lines(
        self, module: str, qualname: str
    ) -> tuple[Outline, Span | None] | None:
        """The searchable outline and the lines of the ``def`` of ``qualname``
        in it (None: no such def); None where the outline cannot tell."""
        outline = self._searchable(module)
        if outline is None or qualname.count(".") > 1:
            return None
        return outline, _definition_span(outline, qualname)

    def function(self, module: str, qualname: str) -> str | None:
        """Source text of the ``def`` of ``qualname``, decorators excluded."""
        node = self.function_node(module, qualname)
        text = self.text(module)
        if node is None or text is None:
            return None
        lines = text.splitlines(keepends=True)
        return "".join(lines[node.lineno - 1 : node.end_lineno])

    def class_node(self, module: str, name: str) -> ast.ClassDef | None:
        """The module-level ``class`` named ``name`` (the first one)."""
        key = (module, name)
        if key not in self._classes:
            found: object = _UNSURE
            outline = self.outline(module)
            if outline is not None:
                span = outline.top_level_definition("class", name)
                found = (
                    None
                    if span is None
                    else self._class_piece(outline, module, span, name)
                )
            if found is _UNSURE:
                tree = self.tree(module)
                found = None if tree is None else recognition.find_class(tree, name)
            self._classes[key] = found  # type: ignore[assignment]
        return self._classes[key]

    def _class_piece(
        self, outline: Outline, module: str, span: Span, name: str
    ) -> object:
        statements = self._parse(outline, module, span)
        if (
            statements is None
            or len(statements) != 1
            or not isinstance(statements[0], ast.ClassDef)
            or statements[0].name != name
        ):
            return _UNSURE
        return statements[0]

    def class_header(self, module: str, name: str) -> ast.ClassDef | None:
        """The module-level ``class`` named ``name`` with its body left out
        (bases, keywords and decorators only), parsed from its header lines."""
        outline = self.outline(module)
        if outline is not None:
            span = outline.top_level_definition("class", name)
            if span is None:
                return None
            members, _ = outline.members(span)
            if members:
                header = Span(span.first, members[0], 0)
                text = outline.source(header).rstrip() + "\n    pass\n"
                self.pieces_parsed[module] = self.pieces_parsed.get(module, 0) + 1
                parsed = recognition.parse("\n" * span.first + text)
                if (
                    parsed is not None
                    and len(parsed.body) == 1
                    and isinstance(parsed.body[0], ast.ClassDef)
                    and parsed.body[0].name == name
                ):
                    return parsed.body[0]
        return self.class_node(module, name)

    def top_level_binding(self, module: str, name: str) -> ast.stmt | None:
        """The first statement that binds ``name`` when ``module`` runs: a def,
        class, import or assignment at module level, or inside a module-level
        ``if``, ``try`` or ``with`` (never under ``if TYPE_CHECKING:``)."""
        key = (module, name)
        if key not in self._bindings:
            found: object = _UNSURE
            outline = self._searchable(module)
            if outline is not None:
                found = self._binding_in_pieces(outline, module, name)
            if found is _UNSURE:
                tree = self.tree(module)
                found = (
                    None
                    if tree is None
                    else recognition.binding_statement(tree.body, name)
                )
            self._bindings[key] = found  # type: ignore[assignment]
        return self._bindings[key]

    def binding_site(self, module: str, name: str) -> ast.stmt | DefinitionSite | None:
        """:meth:`top_level_binding`, except that a ``def`` or ``class`` found
        by its header line is named (:class:`DefinitionSite`), not parsed: a
        caller that only needs to know a class from a def, or compiles a def
        from its text, is spared parsing a long body."""
        key = (module, name)
        if key in self._bindings:
            return self._bindings[key]
        if key not in self._sites:
            found: object = _UNSURE
            outline = self._searchable(module)
            if outline is not None:
                found = self._binding_in_pieces(
                    outline, module, name, parse_definitions=False
                )
            if found is _UNSURE:
                found = self.top_level_binding(module, name)
            self._sites[key] = found  # type: ignore[assignment]
        return self._sites[key]

    def _binding_in_pieces(
        self, outline: Outline, module: str, name: str, parse_definitions: bool = True
    ) -> object:
        seen: set[int] = set()
        for offset in outline.occurrences(name):
            span = outline.top_level_statement(offset)
            if span.first in seen:
                continue
            seen.add(span.first)
            header = outline.header(span.first)
            if header is not None:
                if header[1] != name:
                    continue  # a def or class binds only its own name
                if not parse_definitions:
                    return DefinitionSite(header[0], name)
                span = outline.top_level_definition(header[0], name) or span
            elif self._decorator_line(outline, span.first):
                continue
            statements = self._parse(outline, module, span)
            if statements is None:
                return _UNSURE
            found = recognition.binding_statement(statements, name)
            if found is not None:
                return found
        return None

    @staticmethod
    def _decorator_line(outline: Outline, line: int) -> bool:
        return outline.code.startswith("@", outline.line_start(line))

    def has_class(self, module: str, name: str) -> bool:
        """Whether ``module`` defines a class ``name`` at module level."""

        def work() -> bool:
            outline = self.outline(module)
            if outline is not None:
                return outline.top_level_definition("class", name) is not None
            return self.class_node(module, name) is not None

        return self._answer(module, question("has_class", module, name), work)

    def sets_attribute(self, module: str, owner: str, attribute: str) -> bool:
        """Whether instances of class ``owner`` get ``attribute`` from its own
        code (:func:`recognition.class_sets_attribute`); False without the class."""

        def work() -> bool:
            found = self._sets_attribute_in_pieces(module, owner, attribute)
            if found is not None:
                return found
            cls = self.class_node(module, owner)
            return cls is not None and recognition.class_sets_attribute(cls, attribute)

        return self._answer(
            module, question("sets_attribute", module, owner, attribute), work
        )

    def _sets_attribute_in_pieces(
        self, module: str, owner: str, attribute: str
    ) -> bool | None:
        """From the class's statements that name ``attribute`` at its top, and
        the logical lines that may assign ``self.<attribute>``; None: unsure."""
        outline = self._searchable(module)
        if outline is None:
            return None
        span = outline.top_level_definition("class", owner)
        if span is None:
            return False
        members, indent = outline.members(span)
        if not members:
            return None  # a one-line body: the class parsed whole says it
        for index, line in enumerate(members):
            header = outline.header(line)
            if header is not None:
                if header == ("def", attribute):
                    return True
                continue
            end = members[index + 1] if index + 1 < len(members) else span.end
            member = Span(line, end, indent)
            if outline.opens_compound(line) or not outline.names(member, attribute):
                continue
            statements = self._parse(outline, module, member)
            if statements is None:
                return None
            if any(recognition.class_statement_binds(s, attribute) for s in statements):
                return True
        targets = outline.self_attribute_targets(attribute, span)
        for nodes in self._each_line_at(outline, module, targets):
            if nodes is None:
                return None
            if any(recognition.assigns_self_attribute(n, attribute) for n in nodes):
                return True
        return False

    def calls(self, module: str, caller: str, callee: str) -> bool:
        """Whether ``caller`` (a qualname in ``module``) calls ``callee`` by name."""

        def work() -> bool:
            lines = self.lines_naming(module, caller, callee)
            if lines is not None:
                return any(
                    recognition.calls_name(node, callee)
                    for line in lines
                    for node in line
                )
            node = self.function_node(module, caller)
            return node is not None and recognition.calls_name(node, callee)

        return self._answer(module, question("calls", module, caller, callee), work)

    def module_calls(self, module: str, callee: str) -> bool:
        """Whether any code of ``module`` calls ``callee`` by name."""

        def work() -> bool:
            found = self._calls_in_pieces(module, callee)
            if found is not None:
                return found
            tree = self.tree(module)
            return tree is not None and recognition.calls_name(tree, callee)

        return self._answer(module, question("module_calls", module, callee), work)

    def _calls_in_pieces(self, module: str, callee: str) -> bool | None:
        """From each logical line that names ``callee``; None: unsure."""
        outline = self._searchable(module)
        if outline is None:
            return None
        for nodes in self._each_line_naming(outline, module, callee, None):
            if nodes is None:
                return None
            if any(recognition.calls_name(node, callee) for node in nodes):
                return True
        return False

    def lines_naming(
        self, module: str, qualname: str, word: str
    ) -> list[list[ast.stmt]] | None:
        """The logical lines of the ``def`` of ``qualname`` (decorators
        included) that name ``word``, each parsed alone, in the file's order;
        empty where there is no such def. None where the outline cannot tell
        or a line does not parse alone (the caller parses the def instead)."""
        found = self._definition_lines(module, qualname)
        if found is None:
            return None
        outline, span = found
        if span is None:
            return []
        lines: list[list[ast.stmt]] = []
        for nodes in self._each_line_naming(outline, module, word, span):
            if nodes is None:
                return None
            lines.append(nodes)
        return lines

    def _each_line_naming(
        self, outline: Outline, module: str, word: str, within: Span | None
    ) -> Iterator[list[ast.stmt] | None]:
        """Each logical line in ``within`` (None: the module) that names
        ``word``, parsed alone (None for one that does not parse alone)."""
        return self._each_line_at(outline, module, outline.occurrences(word, within))

    def _each_line_at(
        self, outline: Outline, module: str, offsets: Iterator[int]
    ) -> Iterator[list[ast.stmt] | None]:
        """Each logical line holding one of ``offsets``, once, parsed alone
        (None for one that does not parse alone)."""
        seen: set[int] = set()
        for offset in offsets:
            span = outline.statement_at(offset)
            if span.first in seen:
                continue
            seen.add(span.first)
            yield self._clause(outline, module, span)


#: A piece the outline could not place: the whole module is parsed instead.
_UNSURE = object()


def _definition_span(outline: Outline, qualname: str) -> Span | None:
    """The lines of the first ``def`` of ``qualname`` (``Class.method`` or a
    module-level name), decorators included; None where there is none."""
    owner_name, _, leaf = qualname.rpartition(".")
    if not owner_name:
        return outline.top_level_definition("def", leaf)
    owner = outline.top_level_definition("class", owner_name)
    return None if owner is None else outline.member_definition(owner, leaf)


class DefinitionSite(NamedTuple):
    """A module-level ``def`` or ``class`` that binds a name, found by its
    header line (see :meth:`SourceReader.binding_site`)."""

    kind: str
    name: str


class DefinitionText(NamedTuple):
    """A ``def`` as its file spells it (see :meth:`SourceReader.definition_text`)."""

    #: From the ``def`` line to the end of its body, indentation kept.
    text: str
    #: The ``def`` line (0-based).
    line: int
    indent: int
    #: Each decorator's lines, ``@`` and indentation included, in order.
    decorators: tuple[str, ...]


@dataclass
class Reading:
    """What a judgement read: modules, and yes/no answers by question."""

    modules: set[str] = field(default_factory=set)
    answers: dict[str, bool] = field(default_factory=dict)


def question(kind: str, module: str, *names: str) -> str:
    """A yes/no question's key: its kind, the module it is about, then names."""
    return "|".join((kind, module, *names))


def question_module(key: str) -> str:
    return key.split("|")[1]
