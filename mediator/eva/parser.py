"""Parser for the profile language (DESIGN §4) with errors that point at the offending text.

Errors have the form ``FILE:LINE:COL: error: <what was found>, expected <what>`` followed by the
source line and a caret, so that a user can fix a profile without reading a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from mediator.eva import ast
from mediator.eva.units import parse_span


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
        lines = self.source.splitlines()
        if 1 <= self.line <= len(lines):
            code = lines[self.line - 1]
            text += f"\n  {code}\n  {' ' * (self.column - 1)}^"
        return text


_GRAMMAR = resources.files("mediator.eva").joinpath("grammar.lark").read_text()
_PARSER = Lark(_GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)

# What each terminal means to a user, for "expected ..." messages.
_DESCRIBE = {
    "NAME": "a name", "DUP": "a duplicate selection (first_dup, last_dup, all_dup, <n>_dup)",
    "PAIRS": "all_pairs, unique_pairs or repeated_pairs",
    "SPAN": "a time span (e.g. 5min, 2h, 4weeks, inf)", "CMP": "a comparison (== != < <= > >=)",
    "STRING": "a string", "SIGNED_NUMBER": "a number", "INT": "an integer",
    "EVAL_MODE": "continuous or end_of_interval", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['",
    "RSQB": "']'", "COMMA": "','", "SEMICOLON": "';'", "VBAR": "'|'", "EQUAL": "'='",
    "DOT": "'.'", "_": "'_'", "$END": "end of input",
}


def _describe(terminal: str) -> str:
    if terminal in _DESCRIBE:
        return _DESCRIBE[terminal]
    pattern = _PARSER.get_terminal(terminal).pattern if terminal in _TERMINALS else None
    if pattern is not None and pattern.type == "str":
        return f"'{pattern.value}'"
    return terminal.lower()


_TERMINALS = {t.name for t in _PARSER.terminals}


def _expected(names: set[str]) -> str:
    words = sorted({_describe(n) for n in names})
    if len(words) > 6:
        words = [*words[:6], "…"]
    return " or ".join(words) if len(words) <= 2 else ", ".join(words[:-1]) + " or " + words[-1]


def _found(token: Token | None) -> str:
    if token is None or token.type == "$END":
        return "end of input"
    return f"{token.value!r}"


def _syntax_error(exc: UnexpectedInput, source: str, filename: str) -> ProfileError:
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream or 0
        char = source[pos] if pos < len(source) else ""
        allowed = set(exc.allowed or ())
        message = f"unexpected character {char!r}"
        if allowed:
            message += f", expected {_expected(allowed)}"
        return ProfileError(message, exc.line, exc.column, source, filename)
    if isinstance(exc, UnexpectedEOF):
        lines = source.splitlines() or [""]
        return ProfileError(f"unexpected end of input, expected {_expected(set(exc.expected))}",
                            len(lines), len(lines[-1]) + 1, source, filename)
    assert isinstance(exc, UnexpectedToken)
    token = exc.token
    line, column = exc.line, exc.column
    if token.type == "$END":
        lines = source.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    return ProfileError(f"found {_found(token)}, expected {_expected(set(exc.expected))}",
                        line, column, source, filename)


def _dup(token: Token) -> ast.Dup:
    kind = str(token)[: -len("_dup")]
    return ast.Dup(kind) if kind in ("first", "last", "all") else ast.nth(int(kind))


class _Build(Transformer[Token, Any]):
    """Parse tree → AST. Positions are kept for later validation messages."""

    def start(self, items: list[Any]) -> ast.Document:
        classes = tuple(i for i in items if isinstance(i, ast.ClassDef))
        profiles = tuple(i for i in items if isinstance(i, ast.Profile))
        return ast.Document(classes, profiles)

    @v_args(meta=True)
    def class_def(self, meta: Any, items: list[Any]) -> ast.ClassDef:
        name, body = items
        return ast.ClassDef(str(name), body, meta.line, meta.column)

    def every(self, items: list[Any]) -> ast.Every:
        period = parse_span(str(items[0]))
        if period is None or period <= 0:
            raise _PositionedError("a time class needs a positive finite period", items[0])
        anchor = json.loads(str(items[1])) if len(items) > 1 else None
        return ast.Every(period, anchor)

    @v_args(meta=True)
    def profile_def(self, meta: Any, items: list[Any]) -> ast.Profile:
        name, *rest = items
        per = next((i[1] for i in rest if isinstance(i, tuple) and i[0] == "per"), None)
        mode = next((i[1] for i in rest if isinstance(i, tuple) and i[0] == "eval"),
                    ast.Evaluation.CONTINUOUS)
        return ast.Profile(str(name), rest[-1], per, mode, meta.line, meta.column)

    def per(self, items: list[Any]) -> tuple[str, str]:
        return ("per", items[0])

    def evaluation(self, items: list[Any]) -> tuple[str, ast.Evaluation]:
        return ("eval", ast.Evaluation(str(items[0])))

    @v_args(meta=True)
    def prim(self, meta: Any, items: list[Any]) -> ast.Prim:
        return ast.Prim(str(items[0]), meta.line, meta.column)

    def operand(self, items: list[Any]) -> ast.Operand:
        dup = _dup(items[0])
        if dup.kind == "nth" and dup.n < 1:
            raise _PositionedError("the index of <n>_dup starts at 1", items[0])
        return ast.Operand(dup, items[1])

    def disjunction(self, items: list[Any]) -> ast.Disjunction:
        return ast.Disjunction(items[0], items[1], ast.Pairs(str(items[2])))

    def conjunction(self, items: list[Any]) -> ast.Conjunction:
        return ast.Conjunction(items[0], items[1], parse_span(str(items[2])), ast.Pairs(str(items[3])))

    def sequence(self, items: list[Any]) -> ast.Sequence:
        return ast.Sequence(items[0], items[1], parse_span(str(items[2])), ast.Pairs(str(items[3])))

    def negation(self, items: list[Any]) -> ast.Negation:
        span = parse_span(str(items[1]))
        if span is None:
            raise _PositionedError("a negation needs a finite span (EVA Def. 4.8)", items[1])
        return ast.Negation(items[0], span, ast.Pairs(str(items[2])))

    def selection(self, items: list[Any]) -> ast.Selection:
        index = int(items[1])
        if index < 1:
            raise _PositionedError("the selection index starts at 1", items[1])
        return ast.Selection(items[0], index, ast.Pairs(str(items[2])))

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
    def class_ref(self, meta: Any, items: list[Any]) -> ast.ClassRef:
        path = items[0]
        if "." in path:
            raise ProfileError(f"found {path!r} alone, expected a comparison after an attribute path",
                               meta.end_line, meta.end_column)
        return ast.ClassRef(path)

    def path(self, items: list[Any]) -> str:
        return ".".join(str(i) for i in items)

    def string(self, items: list[Any]) -> str:
        return str(json.loads(str(items[0])))

    def number(self, items: list[Any]) -> int | float:
        text = str(items[0])
        return float(text) if any(c in text for c in ".eE") else int(text)

    def true(self, _: list[Any]) -> bool:
        return True

    def false(self, _: list[Any]) -> bool:
        return False

    def null(self, _: list[Any]) -> None:
        return None


class _PositionedError(Exception):
    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


def parse(source: str, filename: str = "<profiles>") -> ast.Document:
    """Parse and validate a profile document; raises :class:`ProfileError`."""
    try:
        tree = _PARSER.parse(source)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source, filename) from None
    try:
        doc: ast.Document = _Build().transform(tree)
    except Exception as exc:  # lark wraps transformer errors in VisitError
        inner = getattr(exc, "orig_exc", exc)
        if isinstance(inner, _PositionedError):
            token = inner.token
            raise ProfileError(inner.message, token.line or 0, token.column or 0, source,
                               filename) from None
        if isinstance(inner, ProfileError):
            raise ProfileError(inner.message, inner.line, inner.column, source, filename) from None
        raise
    from mediator.eva.validate import validate

    problem = validate(doc)
    if problem is not None:
        message, line, column = problem
        raise ProfileError(message, line, column, source, filename)
    return doc
