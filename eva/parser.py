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

import difflib
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer_NonRecursive, v_args
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
_STRING = re.compile(r'"([^"\\\n]|\\.)*"')


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
        try:
            return parse_span(str(token))
        except ValueError as exc:
            raise self._error(str(exc), _start(token)) from None

    def _int(self, token: Token, digits: str, what: str) -> int:
        significant = digits.lstrip("0")
        if not significant:
            raise self._error(f"found {_quote(str(token))}, expected an index of at least 1: "
                              f"{what} starts at 1", _start(token))
        if len(significant) > 19 or int(significant) > ast.MAX_INT:
            raise self._error(f"found {_quote(str(token))}, expected an index of at most "
                              f"{ast.MAX_INT}: {what} is a 64-bit integer", _start(token))
        return int(significant)

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
        text = str(token)
        if any(c in text for c in ".eE"):
            value = float(text)
            if not math.isfinite(value):
                raise self._error(f"found {_quote(text)}, expected a finite number: numbers "
                                  "are 64-bit floats (at most about 1.8e308)", _start(token))
            return value
        digits = text.lstrip("-").lstrip("0")
        if len(digits) > 19 or not -ast.MAX_INT - 1 <= int(text) <= ast.MAX_INT:
            raise self._error(f"found {_quote(text)}, expected an integer from {-ast.MAX_INT - 1} "
                              f"to {ast.MAX_INT}: integers are 64-bit", _start(token))
        return int(text)

    def true(self, _: list[Any]) -> bool:
        return True

    def false(self, _: list[Any]) -> bool:
        return False

    def null(self, _: list[Any]) -> None:
        return None

    def _string(self, token: Token) -> str:
        """Decode a string literal's JSON escapes; a bad one is an error at its position."""
        text, base = str(token), token.start_pos or 0
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
                    raise self._error(f"found the escape {_quote(text[i:i + 2])}, expected one "
                                      r"of \" \\ \/ \b \f \n \r \t \uXXXX", base + i)
                digits = text[i + 2:i + 6]
                if not _HEX4.fullmatch(digits):
                    raise self._error(f"found {_quote(text[i:i + 6])}, expected \\u and four "
                                      "hexadecimal digits", base + i)
                code = int(digits, 16)
                if 0xD800 <= code < 0xDC00 and _LOW.match(text, i + 6):
                    low = int(text[i + 8:i + 12], 16)
                    out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                    i += 12
                    continue
                if 0xD800 <= code < 0xE000:
                    raise self._error(f"found the lone surrogate {_quote(text[i:i + 6])}, "
                                      "expected a character: \\uD800–\\uDBFF must be followed "
                                      "by \\uDC00–\\uDFFF (a UTF-16 pair)", base + i)
                out.append(chr(code))
                i += 6
                continue
            if c < " " or "\ud800" <= c <= "\udfff":
                raise self._error(f"found the raw character U+{ord(c):04X} in a string, "
                                  r"expected it escaped (e.g. \t, \n or \u0009)", base + i)
            out.append(c)
            i += 1
        return "".join(out)


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
    problem = validate(doc)
    if problem is not None:
        message, line, column = problem
        raise ProfileError(message, line, column, source, filename)
    return doc
