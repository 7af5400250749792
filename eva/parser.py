"""Parser for the profile language (DESIGN §4) with errors that point at the offending text.

Every rejection is a :class:`ProfileError` of the form ``FILE:LINE:COL: error: found <what>,
expected <what>[: <the rule>]`` followed by the source line and a caret, so that a user can fix a
profile without reading a traceback. Nothing here recurses on the input: the parse tree is
transformed without recursion and :mod:`eva.validate` bounds nesting (docs/language.md,
Limits) before anything that recurses sees the document.

The grammar reads composite expressions loosely (see grammar.lark); :class:`_Build` turns each
parenthesised group into an operator or names what is missing — a duplicate selection, a span,
a consumption, a pair of parentheses.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError
from lark.lexer import TerminalDef
from lark.tree import Meta

from eva import ast
from eva.units import parse_span


@dataclass
class ProfileError(Exception):
    """A malformed profile file: where, what was found, what was expected."""

    message: str
    line: int
    column: int
    source: str = ""
    filename: str = "<profiles>"

    def __str__(self) -> str:
        text = f"{self.filename}:{self.line}:{self.column}: error: {self.message}"
        # Lines as the lexer counts them (only "\n" ends one), not str.splitlines().
        lines = self.source.split("\n")
        if 1 <= self.line <= len(lines):
            code, caret = _window(lines[self.line - 1].rstrip("\r"), self.column)
            text += f"\n  {code}\n  {caret}^"
        return text


def _window(line: str, column: int, width: int = 100) -> tuple[str, str]:
    """The source line (cut around the column when long) and the indentation of the caret."""
    start = 0
    if len(line) > width:
        start = max(0, min(column - 1 - width // 2, len(line) - width))
        line = ("…" if start else "") + line[start:start + width] + (
            "…" if start + width < len(line) else "")
        start -= 1 if start else 0
    shown = "".join(c if c.isprintable() or c == "\t" else "?" for c in line)
    prefix = shown[:max(0, column - 1 - start)]
    return shown, "".join(c if c == "\t" else " " for c in prefix)


_OPTIONS: dict[str, object] = {"parser": "lalr", "propagate_positions": True,
                               "maybe_placeholders": False}


@functools.cache
def _parser() -> Lark:
    """The profile parser, made on first use, not at import: building the LALR tables takes
    25–90 ms, which a command that parses nothing (``--help``) should not pay. It is not kept
    on disk between runs: lark's serialisation is a pickle, and loading one from a directory
    another process can write would run its code — for a saving of ~25 ms per run
    (docs/performance.md, Start-up)."""
    return Lark(resources.files("eva").joinpath("grammar.lark").read_text(), **_OPTIONS)


_EMPTY: Tree[Any] = Tree("_", [])


class _Nothing(Transformer[Any, Any]):
    """Every rule reduces to one empty tree: nothing of the input is kept."""

    def __default__(self, data: Any, children: Any, meta: Any) -> Any:
        return _EMPTY


@functools.cache
def _checker() -> Lark:
    """The grammar's parser building nothing: a syntax error is found holding O(1) per token.
    lark's tree of a document with a list of 500,000 values took ~500 bytes per byte of text
    (5 MB: 2.5 GB) only to be refused (issue 29)."""
    options = {k: v for k, v in _OPTIONS.items() if k != "propagate_positions"}
    return Lark(resources.files("eva").joinpath("grammar.lark").read_text(),
                transformer=_Nothing(), **options)


# What each terminal means to a user, for "expected ..." messages.
_DESCRIBE = {
    "NAME": "a name", "DUP": "a duplicate selection (first_dup, last_dup, all_dup, <n>_dup)",
    "SPAN": "a time span (e.g. 5min, 2h, 4weeks, inf)",
    "PAIRS": "a consumption (all_pairs, unique_pairs, repeated_pairs)",
    "CMP": "a comparison (== != < <= > >=)", "STRING": "a string", "SIGNED_NUMBER": "a number",
    "INT": "an integer", "EVAL_MODE": "an evaluation (continuous, end_of_interval)",
    "$END": "end of input",
}


@functools.cache
def _terminals() -> dict[str, TerminalDef]:
    return {t.name: t for t in _parser().terminals}


def _describe(terminal: str) -> str:
    if terminal in _DESCRIBE:
        return _DESCRIBE[terminal]
    found = _terminals().get(terminal)
    if found is not None and found.pattern.type == "str":
        return f"'{found.pattern.value}'"
    return terminal.lower()


def _expected(names: set[str]) -> str:
    # Described terminals in the order above (a span before a consumption, as written), then
    # keywords and punctuation alphabetically, then the end of input.
    order = [*_DESCRIBE][:-1]
    ranked = sorted(names, key=lambda n: (order.index(n) if n in order else len(order) + (
        n == "$END"), _describe(n)))
    words = list(dict.fromkeys(_describe(n) for n in ranked))
    if not words:
        return "nothing more here"
    return " or ".join(words) if len(words) <= 2 else ", ".join(words[:-1]) + " or " + words[-1]


def _quote(text: str, limit: int = 40) -> str:
    """``text`` in quotes for a message: escaped when not printable, shortened when long."""
    if len(text) > limit:
        text = f"{text[:limit - 12]}…{text[-10:]}"
    if not text.isprintable():
        return repr(text)
    return f'"{text}"' if "'" in text and '"' not in text else f"'{text}'"


_WORD = re.compile(r"[A-Za-z0-9_.]+|==|!=|<=|>=|\S")
_SKIP = re.compile(r"(?:[\t \f\r\n]+|#[^\n]*)*")
_STRING = re.compile(r'"(?:[^"\\\n]++|\\.)*+"')  # STRING of grammar.lark


def _found_at(source: str, pos: int) -> str:
    """What the user wrote at ``pos``, for "found …": a word, a string, or one character."""
    if pos >= len(source):
        return "end of input"
    if source[pos] == '"':
        string = _STRING.match(source, pos)
        if string is None:
            return "an unterminated string (it must end with '\"' on the same line)"
        return _quote(string.group())
    word = _WORD.match(source, pos)
    return _quote(word.group() if word else source[pos])


def _start(token: Token) -> int:
    return token.start_pos or 0


def _position(source: str, pos: int) -> tuple[int, int]:
    """(line, column) of a position; the end of input is shown right after the last text."""
    if pos >= len(source):
        pos = len(source.rstrip())
    line = source.count("\n", 0, pos) + 1
    return line, pos - (source.rfind("\n", 0, pos) + 1) + 1


# Words a user may have misspelt, by the terminal that expects them.
_WORDS = {"PAIRS": ["all_pairs", "unique_pairs", "repeated_pairs"],
          "DUP": ["first_dup", "last_dup", "all_dup"],
          "EVAL_MODE": ["continuous", "end_of_interval"]}


def _hint(source: str, pos: int, found: str, expected: set[str]) -> str:
    """The rule behind a few common slips, appended to the message."""
    if found == "'='" and "CMP" in expected:
        return ": equality is written '=='"
    if found == "\"'\"":
        return ": strings are written in double quotes"
    if found in ("'and'", "'or'"):
        return (": and/or combine predicates in a class definition; a profile combines classes "
                "with the operators |, ',', ';', not and [i] (docs/language.md)")
    if found == "'not'":
        return ": a negation is written ((not E)_span)_pairs"
    if re.search(r"\bnot\s*$", source[max(0, pos - 40):pos]):
        # `all_dup(not B)`: a negation needs its own span and consumption, also as an operand
        name = found.strip("'")
        return (f": a negation is written ((not E)_span)_pairs, also as an operand: "
                f"all_dup(((not {name})_10min)_all_pairs)")
    if found == "'('" and re.search(r"[A-Za-z0-9_]\s*$", source[max(0, pos - 40):pos]):
        return (": only a duplicate selection (first_dup, last_dup, all_dup, <n>_dup) is "
                "followed by '('")
    words = [w for t in expected for w in _WORDS.get(t, [])]
    words += [t.pattern.value for n, t in _terminals().items()
              if n in expected and t.pattern.type == "str" and t.pattern.value.isalpha()]
    close = difflib.get_close_matches(found.strip("'"), words, n=1)
    return f": did you mean '{close[0]}'?" if close else ""


def _syntax_error(exc: UnexpectedInput, source: str, filename: str) -> ProfileError:
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream or 0
        expected = set(exc.allowed or ())
        line, column = exc.line, exc.column
    elif isinstance(exc, UnexpectedEOF):
        pos = len(source)
        expected = set(exc.expected)
        line, column = _position(source, pos)
    else:
        token = getattr(exc, "token", None)
        expected = set(getattr(exc, "expected", ()) or ())
        if token is None or token.type == "$END":
            pos = len(source)
            line, column = _position(source, pos)
        else:
            pos = _start(token)
            line, column = token.line or 1, token.column or 1
    # The parser's own list can hold terminals that only a merged LALR state allows; feeding
    # each candidate to a copy of the parser keeps those that really continue the input.
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        expected = set(interactive.accepts()) or expected
    found = _found_at(source, pos)
    message = f"found {found}, expected {_expected(expected)}{_hint(source, pos, found, expected)}"
    return ProfileError(message, line, column, source, filename)


def decode(data: bytes, filename: str = "<profiles>") -> str:
    """A profile file's bytes as text; a byte that is not UTF-8 is an error at its position."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start].decode("utf-8").split("\n")
        line, column = len(before), len(before[-1]) + 1
        shown = data.decode("utf-8", errors="replace")
        raise ProfileError(f"found the byte 0x{data[exc.start]:02x}, which is not UTF-8, "
                           "expected a UTF-8 text file", line, column, shown, filename) from None
    return text


# ---------------------------------------------------------------- building the AST

# How each operator is written, for messages about a group that is not one.
_FORMS = {
    "disjunction": "a disjunction is written (D(E1) | D(E2))_pairs",
    "conjunction": "a conjunction is written ((D(E1), D(E2))_span)_pairs",
    "sequence": "a sequence is written ((D(E1); D(E2))_span)_pairs",
    "negation": "a negation is written ((not E)_span)_pairs",
    "selection": "a selection is written (E[i])_pairs",
}
_OPERATOR = {";": "sequence", ",": "conjunction", "|": "disjunction"}
_SUFFIX = {"SPAN": "a time span such as _5min, _2h or _inf",
           "PAIRS": "_all_pairs, _unique_pairs or _repeated_pairs"}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_LOW = re.compile(r"\\u[dD][c-fC-F][0-9A-Fa-f]{2}")


@dataclass(frozen=True)
class _Partial:
    """``(D(E1); D(E2))_T`` or ``(not E)_T``: an operator still waiting for its ``_Pairs``."""

    form: str
    make: Callable[[ast.Pairs], ast.Expr]
    start: int
    end: int


@dataclass(frozen=True)
class _Item:
    """One operand of a group as written: ``D(E)``, ``E``, ``not E`` or ``E[i]``."""

    kind: str
    value: ast.Expr | _Partial
    start: int
    end: int
    dup: ast.Dup | None = None
    index: int = 0


class _Build(Transformer_NonRecursive[Token, Any]):
    """Parse tree → AST, bottom-up and without recursion. Positions are kept for messages."""

    def __init__(self, source: str, filename: str) -> None:
        super().__init__()
        self.source = source
        self.filename = filename

    # ---- errors
    def _error(self, message: str, pos: int) -> ProfileError:
        line, column = _position(self.source, pos)
        return ProfileError(message, line, column, self.source, self.filename)

    def _text(self, start: int, end: int) -> str:
        return _quote(" ".join(self.source[start:end].split()), 60)

    def _next(self, pos: int) -> int:
        """The position of the next token at or after ``pos``."""
        skipped = _SKIP.match(self.source, pos)
        return skipped.end() if skipped else pos

    # ---- statements
    def start(self, items: list[Any]) -> ast.Document:
        classes = tuple(i for i in items if isinstance(i, ast.ClassDef))
        profiles = tuple(i for i in items if isinstance(i, ast.Profile))
        return ast.Document(classes, profiles)

    @v_args(meta=True)
    def class_def(self, meta: Meta, items: list[Any]) -> ast.ClassDef:
        name, body = items
        return ast.ClassDef(str(name), body, meta.line, meta.column)

    def every(self, items: list[Any]) -> ast.Every:
        period = self._span(items[0])
        if period is None or period <= 0:
            raise self._error(f"found the period {_quote(str(items[0]))}, expected a positive "
                              "finite span: a time class ticks every period", _start(items[0]))
        anchor = self._string(items[1]) if len(items) > 1 else None
        return ast.Every(period, anchor)

    @v_args(meta=True)
    def profile_def(self, meta: Meta, items: list[Any]) -> ast.Profile:
        name, *rest = items
        per = next((i[1] for i in rest if isinstance(i, tuple) and i[0] == "per"), None)
        mode = next((i[1] for i in rest if isinstance(i, tuple) and i[0] == "eval"),
                    ast.Evaluation.CONTINUOUS)
        return ast.Profile(str(name), self._complete(rest[-1]), per, mode, meta.line, meta.column)

    def per(self, items: list[Any]) -> tuple[str, str]:
        return ("per", items[0])

    def evaluation(self, items: list[Any]) -> tuple[str, ast.Evaluation]:
        return ("eval", ast.Evaluation(str(items[0])))

    # ---- composite expressions
    @v_args(meta=True)
    def prim(self, meta: Meta, items: list[Any]) -> ast.Prim:
        return ast.Prim(str(items[0]), meta.line, meta.column)

    @v_args(meta=True)
    def dup_item(self, meta: Meta, items: list[Any]) -> _Item:
        token = items[0]
        kind = str(token)[: -len("_dup")]
        if kind in ("first", "last", "all"):
            dup = ast.Dup(ast.DupKind(kind))
        else:
            dup = ast.nth(self._int(token, kind, "the index of <n>_dup"))
        return _Item("dup", self._complete(items[1]), meta.start_pos, meta.end_pos, dup)

    @v_args(meta=True)
    def bare_item(self, meta: Meta, items: list[Any]) -> _Item:
        return _Item("bare", items[0], meta.start_pos, meta.end_pos)

    @v_args(meta=True)
    def not_item(self, meta: Meta, items: list[Any]) -> _Item:
        return _Item("not", self._complete(items[0]), meta.start_pos, meta.end_pos)

    @v_args(meta=True)
    def index_item(self, meta: Meta, items: list[Any]) -> _Item:
        index = self._int(items[1], str(items[1]), "the selection index")
        return _Item("index", self._complete(items[0]), meta.start_pos, meta.end_pos,
                     index=index)

    def sep(self, items: list[Any]) -> Token:
        token: Token = items[0]
        return token

    def suffix(self, items: list[Any]) -> Token:
        token: Token = items[0]
        return token

    @v_args(meta=True)
    def group(self, meta: Meta, children: list[Any]) -> ast.Expr | _Partial:
        """``( item [sep item]… ) suffix…`` → the operator it spells, or what is missing."""
        items = [c for c in children if isinstance(c, _Item)]
        seps = [c for c in children if isinstance(c, Token) and c.type not in ("SPAN", "PAIRS")]
        suffixes = [c for c in children if isinstance(c, Token) and c.type in ("SPAN", "PAIRS")]
        start, end = meta.start_pos, meta.end_pos
        if len(items) > 2:
            raise self._error(f"found a third operand after {_quote(str(seps[1]))}, expected "
                              "')': an operator takes two operands (nest one operator in "
                              "another for more)", _start(seps[1]))
        if len(items) == 2:
            name = _OPERATOR[str(seps[0])]
            left, right = (self._operand(item, name) for item in items)
            if name == "disjunction":
                (pairs,) = self._suffixes(suffixes, ["PAIRS"], name, start, end)
                return ast.Disjunction(left, right, ast.Pairs(str(pairs)))
            (token,) = self._suffixes(suffixes, ["SPAN"], name, start, end)
            span = self._span(token)
            binary = ast.Sequence if name == "sequence" else ast.Conjunction
            return _Partial(name, lambda p: binary(left, right, span, p), start, end)
        item = items[0]
        if item.kind == "not":
            (token,) = self._suffixes(suffixes, ["SPAN"], "negation", start, end)
            finite = self._span(token)
            if finite is None:
                raise self._error("found the span 'inf', expected a finite span: a negation "
                                  "needs a finite span (EVA Def. 4.8)", _start(token))
            negated = item.value
            assert not isinstance(negated, _Partial)
            return _Partial("negation", lambda p: ast.Negation(negated, finite, p), start, end)
        if item.kind == "index":
            (pairs,) = self._suffixes(suffixes, ["PAIRS"], "selection", start, end)
            selected = item.value
            assert not isinstance(selected, _Partial)
            return ast.Selection(selected, item.index, ast.Pairs(str(pairs)))
        if item.kind == "dup":
            raise self._error(f"found {_found_at(self.source, self._next(item.end))} after "
                              f"the operand {self._text(item.start, item.end)}, expected ';', "
                              "',' or '|' and a second operand", self._next(item.end))
        inner = item.value
        if isinstance(inner, _Partial):
            (pairs,) = self._suffixes(suffixes, ["PAIRS"], inner.form, start, end)
            return inner.make(ast.Pairs(str(pairs)))
        raise self._error(f"found {self._text(item.start, item.end)} in parentheses, expected "
                          "an operator inside them or the expression alone", start)

    def _operand(self, item: _Item, operator: str) -> ast.Operand:
        if item.kind == "dup":
            assert item.dup is not None and not isinstance(item.value, _Partial)
            return ast.Operand(item.dup, item.value)
        text = " ".join(self.source[item.start:item.end].split())
        if item.kind == "not":
            wanted = f"all_dup((({text})_<span>)_all_pairs)"
            what = "a negation"
        elif item.kind == "index":
            wanted = f"all_dup(({text})_all_pairs)"
            what = "a selection"
        else:
            value = f"({text})_all_pairs" if isinstance(item.value, _Partial) else text
            wanted = f"all_dup({value})"
            what = "the operand"
        raise self._error(f"found {what} {_quote(text)} without a duplicate selection, expected "
                          f"{_quote(wanted, 80)} (or first_dup, last_dup, <n>_dup): every "
                          f"operand of a {operator} has one", item.start)

    def _suffixes(self, suffixes: list[Token], wanted: list[str], operator: str,
                  start: int, end: int) -> list[Token]:
        """Check the ``_span`` / ``_pairs`` suffixes of a group against what it needs."""
        form = _FORMS[operator]
        for i, kind in enumerate(wanted):
            if i >= len(suffixes):
                at = self._next(end)
                raise self._error(f"found {_found_at(self.source, at)} after "
                                  f"{self._text(start, end)}, expected {_SUFFIX[kind]}: {form}",
                                  at)
            if suffixes[i].type != kind:
                raise self._error(f"found '_{suffixes[i]}', expected {_SUFFIX[kind]}: {form}",
                                  _start(suffixes[i]) - 1)
        if len(suffixes) > len(wanted):
            extra, before = suffixes[len(wanted)], suffixes[len(wanted) - 1]
            where = "a ')' between them" if wanted == ["SPAN"] else "nothing more"
            raise self._error(f"found '_{extra}' right after '_{before}', expected {where}: "
                              f"{form}", _start(extra) - 1)
        return suffixes[:len(wanted)]

    def _complete(self, value: ast.Expr | _Partial) -> ast.Expr:
        """An expression where one is needed; an operator without its ``_Pairs`` is an error."""
        if isinstance(value, _Partial):
            text = " ".join(self.source[value.start:value.end].split())
            raise self._error(f"found {_quote(text)} without a consumption, expected "
                              f"{_quote(f'({text})_all_pairs', 80)} (or _unique_pairs, "
                              f"_repeated_pairs): {_FORMS[value.form]}", value.start)
        return value

    def _span(self, token: Token) -> int | None:
        return _span_value(str(token), _start(token), self._error)

    def _int(self, token: Token, digits: str, what: str) -> int:
        return _index_value(str(token), digits, what, _start(token), self._error)

    # ---- predicates
    def or_pred(self, items: list[Any]) -> ast.Predicate:
        out = items[0]
        for item in items[1:]:
            out = ast.Or(out, item)
        return out

    def and_pred(self, items: list[Any]) -> ast.Predicate:
        out = items[0]
        for item in items[1:]:
            out = ast.And(out, item)
        return out

    def not_(self, items: list[Any]) -> ast.Not:
        return ast.Not(items[0])

    def compare(self, items: list[Any]) -> ast.Compare:
        return ast.Compare(items[0], str(items[1]), items[2])

    def member(self, items: list[Any]) -> ast.Compare:
        return ast.Compare(items[0], "in", tuple(items[1:]))

    @v_args(meta=True)
    def class_ref(self, meta: Meta, items: list[Any]) -> ast.ClassRef:
        path = items[0]
        if "." in path:
            at = self._next(meta.end_pos)
            raise self._error(f"found {_found_at(self.source, at)} after the attribute path "
                              f"{_quote(path)}, expected a comparison (== != < <= > >=) or "
                              "'in': a class is a predicate", at)
        return ast.ClassRef(path)

    def path(self, items: list[Any]) -> str:
        return ".".join(str(i) for i in items)

    def string(self, items: list[Any]) -> str:
        return self._string(items[0])

    def number(self, items: list[Any]) -> int | float:
        token: Token = items[0]
        return _number_value(str(token), _start(token), self._error)

    def true(self, _: list[Any]) -> bool:
        return True

    def false(self, _: list[Any]) -> bool:
        return False

    def null(self, _: list[Any]) -> None:
        return None

    def _string(self, token: Token) -> str:
        return _string_value(str(token), token.start_pos or 0, self._error)


Raise = Callable[[str, int], Exception]
"""Makes the exception for a message at a position (the builder's ProfileError, the fast
path's giving up)."""


def _span_value(text: str, pos: int, error: Raise) -> int | None:
    try:
        return parse_span(text)
    except ValueError as exc:
        raise error(str(exc), pos) from None


def _index_value(text: str, digits: str, what: str, pos: int, error: Raise) -> int:
    significant = digits.lstrip("0")
    if not significant:
        raise error(f"found {_quote(text)}, expected an index of at least 1: {what} starts "
                    "at 1", pos)
    if len(significant) > 19 or int(significant) > ast.MAX_INT:
        raise error(f"found {_quote(text)}, expected an index of at most {ast.MAX_INT}: "
                    f"{what} is a 64-bit integer", pos)
    return int(significant)


def _number_value(text: str, pos: int, error: Raise) -> int | float:
    if any(c in text for c in ".eE"):
        value = float(text)
        if not math.isfinite(value):
            raise error(f"found {_quote(text)}, expected a finite number: numbers are 64-bit "
                        "floats (at most about 1.8e308)", pos)
        return value
    digits = text.lstrip("-").lstrip("0")
    if len(digits) > 19 or not -ast.MAX_INT - 1 <= int(text) <= ast.MAX_INT:
        raise error(f"found {_quote(text)}, expected an integer from {-ast.MAX_INT - 1} to "
                    f"{ast.MAX_INT}: integers are 64-bit", pos)
    return int(text)


def _string_value(text: str, base: int, error: Raise) -> str:
    """Decode a string literal's JSON escapes; a bad one is an error at its position."""
    if "\\" not in text and text.isprintable():
        return text[1:-1]  # nothing to decode, nothing to refuse: most strings
    out: list[str] = []
    i, end = 1, len(text) - 1
    while i < end:
        c = text[i]
        if c == "\\":
            e = text[i + 1]  # the grammar puts a character after every backslash
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                i += 2
                continue
            if e != "u":
                raise error(f"found the escape {_quote(text[i:i + 2])}, expected one "
                            r"of \" \\ \/ \b \f \n \r \t \uXXXX", base + i)
            digits = text[i + 2:i + 6]
            if not _HEX4.fullmatch(digits):
                raise error(f"found {_quote(text[i:i + 6])}, expected \\u and four "
                            "hexadecimal digits", base + i)
            code = int(digits, 16)
            if 0xD800 <= code < 0xDC00 and _LOW.match(text, i + 6):
                low = int(text[i + 8:i + 12], 16)
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
                continue
            if 0xD800 <= code < 0xE000:
                raise error(f"found the lone surrogate {_quote(text[i:i + 6])}, "
                            "expected a character: \\uD800–\\uDBFF must be followed "
                            "by \\uDC00–\\uDFFF (a UTF-16 pair)", base + i)
            out.append(chr(code))
            i += 6
            continue
        if c < " " or "\ud800" <= c <= "\udfff":
            raise error(f"found the raw character U+{ord(c):04X} in a string, "
                        r"expected it escaped (e.g. \t, \n or \u0009)", base + i)
        out.append(c)
        i += 1
    return "".join(out)


# ---------------------------------------------------------------- the fast path
#
# lark reads a document at about 2,500 profiles a second here (its lexer, parse tree and
# position propagation; issue 17 wants 10,000 in under 2 s). Most documents are well formed,
# so a direct reader takes them first: one pass over the text, the AST built as it goes, for
# well-formed text only. At anything it does not read — every error, and any form where lark's
# contextual lexer might read a word otherwise (a name that starts like a keyword of higher
# priority, a span followed by letters) — it gives up and lark reads the document, so errors
# and their messages are lark's and the builder's, unchanged. tests/test_language.py checks
# that both give the same AST (positions included) on random documents and mutations of them.
# Nesting deeper than _FAST_DEPTH is left to lark too: the reader recurses per parenthesis,
# bounded by that, and nothing unbounded recurses on the input.


class _GiveUp(Exception):
    """The fast path met what it does not read: lark reads the document. ``at``: where, when
    the tokens were not all read (else the token it stopped at says)."""

    def __init__(self, at: int | None = None) -> None:
        super().__init__()
        self.at = at


def _give_up(message: str, pos: int) -> Exception:
    return _GiveUp()


_FAST_DEPTH = 48
# One match per token, the blanks and comments before it skipped (lark's %ignore), each match
# anchored where the last ended, so every character is read once or twice: a search (finditer)
# retried a failed match at every later position, reading a run of blanks or a
# backslash-laden string from each of its characters again (quadratic; issue 28).
# Possessive (*+, ++): a run of blanks or comments is skipped one way only — with plain
# quantifiers a long run before the end of the input (or before what no token matches) was
# tried in exponentially many splits. The only match that can fail after reading far is a
# string without its closing quote: the reader gives up there (see _Fast), so no text is read
# more than twice.
_TOKEN = re.compile(r'(?:[\t \f\r\n]++|#[^\n]*+)*+(?:(?P<STRING>"(?:[^"\\\n]++|\\.)*+")'
                    r"|(?P<CMP>==|!=|<=|>=|<|>)|(?P<PUNCT>[()\[\],;|=._-])"
                    r"|(?P<WORD>[A-Za-z0-9][A-Za-z0-9_]*+)|(?P<OTHER>[^\t \f\r\n#]))")
_BLANK_END = re.compile(r"(?:[\t \f\r\n]++|#[^\n]*+)*+\Z")
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_KEYWORDS = frozenset(("class", "every", "from", "profile", "per", "evaluate", "not", "or", "and",
                       "in", "true", "false", "null"))
_PAIRS_WORDS = frozenset(("all_pairs", "unique_pairs", "repeated_pairs"))
_EVAL_WORDS = frozenset(("continuous", "end_of_interval"))
_DUP_WORD = re.compile(r"(?:first|last|all|[0-9]+)_dup")
_SPAN_WORD = re.compile(r"[0-9]+(?:us|ms|s|min|h|d|weeks)")
# Terminals of higher priority than NAME (grammar.lark): a word starting like one of them is
# not read as a name here.
_PRIORITY_PREFIX = re.compile(r"(?:first|last|all)_dup|all_pairs|unique_pairs|repeated_pairs|"
                              r"continuous|end_of_interval|inf")
_VALUES = {"true": True, "false": False, "null": None}
_DIGIT_CHARS = frozenset("0123456789")


def _word_kind(word: str) -> str:
    """The terminal a word is read as here ("OTHER": one the fast path leaves to lark)."""
    if word in _KEYWORDS:
        return word
    if word in _PAIRS_WORDS:
        return "PAIRS"
    if word in _EVAL_WORDS:
        return "EVAL_MODE"
    if word == "inf" or _SPAN_WORD.fullmatch(word):
        return "SPAN"
    if _DUP_WORD.fullmatch(word):
        return "DUP"
    if word.isdigit():
        return "INT"
    if word[0].isalpha() and not _PRIORITY_PREFIX.match(word):
        return "NAME"
    return "OTHER"


class _Fast:
    """The direct reader of a well-formed document (see above); raises _GiveUp."""

    def __init__(self, source: str) -> None:
        self.source = source
        kinds: dict[str, str] = {}  # a word's kind, once per distinct word
        tokens: list[tuple[str, str, int]] = []
        at = 0
        match = _TOKEN.match
        while (m := match(source, at)) is not None:
            at = m.end()
            group = m.lastgroup or ""  # every alternative is a group
            text = m.group(group)
            if group == "WORD":
                kind = kinds.get(text)
                if kind is None:
                    kind = kinds[text] = _word_kind(text)
            elif group == "PUNCT":
                kind = text
            elif group == "OTHER" and text == '"':
                raise _GiveUp(m.start(group))  # a string without its end: lark reports it
            else:
                kind = group
            tokens.append((kind, text, m.start(group)))
        # No token matched at ``at``: the skip took every blank and comment there, and any other
        # character is a token, so only blanks and comments are left (checked all the same).
        if not _BLANK_END.match(source, at):
            raise _GiveUp(at)
        tokens.append(("EOF", "", len(source)))
        self.tokens = tokens
        self.i = 0
        self.newlines = [m.start() for m in re.finditer("\n", source)]
        self.depth = 0

    # ---- tokens
    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def position(self, start: int) -> tuple[int, int]:
        """(line, column) of a token, as lark counts them."""
        line = bisect.bisect_right(self.newlines, start)
        return line + 1, start - (self.newlines[line - 1] + 1 if line else 0) + 1

    def take(self, kind: str) -> tuple[str, int]:
        """The next token's text and start, which must be of ``kind``."""
        found, text, start = self.tokens[self.i]
        if found != kind:
            raise _GiveUp
        self.i += 1
        return text, start

    def at(self, kind: str) -> bool:
        return self.tokens[self.i][0] == kind

    def enter(self) -> None:
        self.depth += 1
        if self.depth > _FAST_DEPTH:
            raise _GiveUp

    # ---- statements
    def document(self) -> ast.Document:
        classes: list[ast.ClassDef] = []
        profiles: list[ast.Profile] = []
        while True:
            kind = self.peek()[0]
            if kind == "class":
                classes.append(self.class_def())
            elif kind == "profile":
                profiles.append(self.profile_def())
            elif kind == "EOF":
                return ast.Document(tuple(classes), tuple(profiles))
            else:
                raise _GiveUp

    def class_def(self) -> ast.ClassDef:
        line, column = self.position(self.take("class")[1])
        name, _ = self.take("NAME")
        self.take("=")
        body: ast.Predicate | ast.Every
        if self.at("every"):
            self.take("every")
            text, at = self.take("SPAN")
            period = _span_value(text, at, _give_up)
            if period is None or period <= 0:
                raise _GiveUp
            anchor = None
            if self.at("from"):
                self.take("from")
                anchor = _string_value(*self.take("STRING"), _give_up)
            body = ast.Every(period, anchor)
        else:
            body = self.pred()
        return ast.ClassDef(name, body, line, column)

    def profile_def(self) -> ast.Profile:
        line, column = self.position(self.take("profile")[1])
        name, _ = self.take("NAME")
        per = None
        if self.at("per"):
            self.take("per")
            per = self.path()
        mode = ast.Evaluation.CONTINUOUS
        if self.at("evaluate"):
            self.take("evaluate")
            mode = ast.Evaluation(self.take("EVAL_MODE")[0])
        self.take("=")
        return ast.Profile(name, self.complete(), per, mode, line, column)

    def path(self) -> str:
        names = [self.take("NAME")[0]]
        while self.at("."):
            self.take(".")
            names.append(self.take("NAME")[0])
        return ".".join(names)

    # ---- composite expressions
    def complete(self) -> ast.Expr:
        value = self.expr()
        if isinstance(value, _Partial):
            raise _GiveUp
        return value

    def expr(self) -> ast.Expr | _Partial:
        kind, text, start = self.peek()
        if kind == "NAME":
            self.i += 1
            return ast.Prim(text, *self.position(start))
        self.enter()
        value = self.group()
        self.depth -= 1
        if self.at("_"):
            raise _GiveUp  # a suffix too many
        return value

    def group(self) -> ast.Expr | _Partial:
        self.take("(")
        kind = self.peek()[0]
        if kind == "DUP":
            left = self.operand()
            sep = self.peek()[0]
            if sep not in (";", ",", "|"):
                raise _GiveUp
            self.take(sep)
            right = self.operand()
            self.take(")")
            self.take("_")
            if sep == "|":
                return ast.Disjunction(left, right, ast.Pairs(self.take("PAIRS")[0]))
            span = _span_value(*self.take("SPAN"), _give_up)
            binary = ast.Sequence if sep == ";" else ast.Conjunction
            return _Partial("", lambda p: binary(left, right, span, p), 0, 0)
        if kind == "not":
            self.take("not")
            negated = self.complete()
            self.take(")")
            self.take("_")
            finite = _span_value(*self.take("SPAN"), _give_up)
            if finite is None:
                raise _GiveUp
            return _Partial("", lambda p: ast.Negation(negated, finite, p), 0, 0)
        inner = self.expr()
        if self.at("["):
            if isinstance(inner, _Partial):
                raise _GiveUp
            self.take("[")
            text, at = self.take("INT")
            index = _index_value(text, text, "the selection index", at, _give_up)
            self.take("]")
            self.take(")")
            self.take("_")
            return ast.Selection(inner, index, ast.Pairs(self.take("PAIRS")[0]))
        self.take(")")
        if not isinstance(inner, _Partial):
            raise _GiveUp  # an expression alone in parentheses
        self.take("_")
        return inner.make(ast.Pairs(self.take("PAIRS")[0]))

    def operand(self) -> ast.Operand:
        text, at = self.take("DUP")
        kind = text[: -len("_dup")]
        if kind in ("first", "last", "all"):
            dup = ast.Dup(ast.DupKind(kind))
        else:
            dup = ast.nth(_index_value(text, kind, "the index of <n>_dup", at, _give_up))
        self.take("(")
        value = self.complete()
        self.take(")")
        return ast.Operand(dup, value)

    # ---- predicates
    def pred(self) -> ast.Predicate:
        self.enter()
        out = self.conjunct()
        while self.at("or"):
            self.take("or")
            out = ast.Or(out, self.conjunct())
        self.depth -= 1
        return out

    def conjunct(self) -> ast.Predicate:
        out = self.negated()
        while self.at("and"):
            self.take("and")
            out = ast.And(out, self.negated())
        return out

    def negated(self) -> ast.Predicate:
        nots = 0
        while self.at("not"):
            self.take("not")
            nots += 1
        out = self.atom()
        for _ in range(nots):
            out = ast.Not(out)
        return out

    def atom(self) -> ast.Predicate:
        if self.at("("):
            self.take("(")
            inner = self.pred()
            self.take(")")
            return inner
        path = self.path()
        if self.at("CMP"):
            op = self.take("CMP")[0]
            return ast.Compare(path, op, self.value())
        if self.at("in"):
            self.take("in")
            self.take("[")
            values = [self.value()]
            while self.at(","):
                self.take(",")
                values.append(self.value())
            self.take("]")
            return ast.Compare(path, "in", tuple(values))
        if "." in path:
            raise _GiveUp
        return ast.ClassRef(path)

    def value(self) -> Any:
        kind, text, start = self.peek()
        if kind == "STRING":
            self.take("STRING")
            return _string_value(text, start, _give_up)
        if kind in _VALUES:
            self.take(kind)
            return _VALUES[kind]
        number = _NUMBER.match(self.source, start)
        if number is None or not (kind == "-" or text[:1] in _DIGIT_CHARS):
            raise _GiveUp
        end = number.end()
        if end < len(self.source) and (self.source[end].isalnum() or self.source[end] in "_."):
            raise _GiveUp
        while self.tokens[self.i][2] < end:  # the tokens the number is made of
            self.i += 1
        return _number_value(number.group(), start, _give_up)


def _fast_parse(source: str) -> ast.Document | None:
    """The document of well-formed ``source`` read directly, or None: lark is to read it."""
    return _fast_attempt(source)[0]


def _fast_attempt(source: str) -> tuple[ast.Document | None, int]:
    """The document of well-formed ``source`` read directly, or (None, where the direct reader
    gave up)."""
    reader: _Fast | None = None
    try:
        reader = _Fast(source)
        return reader.document(), 0
    except _GiveUp as exc:
        if exc.at is not None:
            return None, exc.at
        assert reader is not None
        return None, reader.tokens[min(reader.i, len(reader.tokens) - 1)][2]


_STATEMENT = re.compile(r"^[ \t]*(?:class|profile)\b", re.MULTILINE)


def _statement_alone(source: str, at: int, filename: str) -> None:
    """Read the statement around ``at`` alone (the rest blanked: lines and columns stay);
    raises its ProfileError. A long document's tree costs ~500 bytes per byte in lark; one
    statement's is what it costs — and the builder's refusals are about one statement."""
    start = 0
    for match in _STATEMENT.finditer(source, 0, at + 1):
        start = match.start()
    following = _STATEMENT.search(source, at + 1)
    end = following.start() if following is not None else len(source)
    if start == 0 and end == len(source):
        return  # the whole document is the statement: nothing to save
    piece = re.sub(r"[^\n]", " ", source[:start]) + source[start:end]
    try:
        tree = _parser().parse(piece)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source, filename) from None
    try:
        _Build(source, filename).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, ProfileError):
            raise exc.orig_exc from None
        raise


def _lark_parse(source: str, filename: str, near: int | None = None) -> ast.Document:
    """The document of ``source`` read by lark and the builder; raises ProfileError. It is
    first checked for a syntax error without a tree, then the statement around
    ``near`` (where the direct reader gave up) read alone: a refusal costs what its statement
    costs (docs/language.md, "Limits"). Every size alike, so reading stays linear in it."""
    try:
        _checker().parse(source)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source, filename) from None
    if near is not None:
        _statement_alone(source, near, filename)
    try:
        tree = _parser().parse(source)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source, filename) from None
    try:
        doc: ast.Document = _Build(source, filename).transform(tree)
    except VisitError as exc:  # lark wraps what the builder raises
        if isinstance(exc.orig_exc, ProfileError):
            raise exc.orig_exc from None
        raise
    return doc


def parse(source: str | bytes, filename: str = "<profiles>") -> ast.Document:
    """Parse and validate a profile document (text, or the bytes of a UTF-8 file); raises
    :class:`ProfileError`."""
    from eva.validate import MAX_DOCUMENT_BYTES, validate

    if len(source) > MAX_DOCUMENT_BYTES or (
            isinstance(source, str) and len(source) * 4 > MAX_DOCUMENT_BYTES
            and len(source.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES):
        raise ProfileError(f"found a document of more than {MAX_DOCUMENT_BYTES:,} bytes, expected "
                           "at most that (split it into several files)", 1, 1, "", filename)
    if isinstance(source, bytes):
        source = decode(source, filename)
    source = source.removeprefix("\ufeff")  # a byte-order mark some editors write
    doc, near = _fast_attempt(source)
    if doc is None:
        doc = _lark_parse(source, filename, near)
    problem = validate(doc)
    if problem is not None:
        message, line, column = problem
        raise ProfileError(message, line, column, source, filename)
    return doc
