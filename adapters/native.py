"""What every native language of a base service shares: detections, query errors, evaluators.

A base service evaluates its *own* language with that language's *own* semantics (DESIGN §6);
the mediator only meets it through text: a native query in, native notifications out. Each
language module (``boolean``, ``snoop``, ``sql``, ``xchange``, ``peer``) provides a
:class:`Language`: ``parse`` (text → query, or :class:`NativeQueryError`), ``evaluator`` (a
fresh incremental evaluation of a query) and ``render`` (an EVA sub-profile → native text,
the dialect the mediator speaks to that service).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from mediator.eva import ast
from mediator.eva.events import Event
from transforms.capability import Capability


@dataclass(frozen=True)
class Detection:
    """One native notification: the occurrence time, the constituent events in the language's
    own order, a rendering in its own notation and language-specific detail."""

    time: int
    constituents: tuple[Event, ...]
    text: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class NativeQueryError(Exception):
    """A query the language rejects: where, and what was wrong (shown with the line and a caret)."""

    language: str
    message: str
    line: int = 1
    column: int = 1
    source: str = ""

    def __str__(self) -> str:
        text = f"{self.language} query:{self.line}:{self.column}: error: {self.message}"
        lines = self.source.splitlines()
        if 1 <= self.line <= len(lines):
            text += f"\n  {lines[self.line - 1]}\n  {' ' * (self.column - 1)}^"
        return text


class Evaluator(Protocol):
    """An incremental evaluation of one query. Events arrive in the service's total order."""

    def push(self, event: Event) -> list[Detection]: ...

    def advance(self, time: int) -> list[Detection]:
        """No event at or before ``time`` will come: clock-driven detections up to it."""
        ...


class Query(Protocol):
    @property
    def text(self) -> str: ...

    def evaluator(self) -> Evaluator: ...


class Language(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def capability(self) -> Capability: ...

    def parse(self, text: str) -> Query: ...

    def render(self, expr: ast.Expr, doc: ast.Document) -> str:
        """The EVA expression (over ``doc``'s classes) as a query of this language."""
        ...


def run(query: Query, events: Iterable[Event], until: int | None = None) -> list[Detection]:
    """A whole trace through one evaluator, in order; the clock runs to ``until`` at the end."""
    evaluator = query.evaluator()
    out: list[Detection] = []
    last: int | None = None
    for event in events:
        out.extend(evaluator.push(event))
        last = event.time
    end = until if until is not None else last
    if end is not None:
        out.extend(evaluator.advance(end))
    return out


class Unrenderable(ValueError):
    """The dialect cannot state this expression (the planner should not have asked)."""


def native_text(language: Language, expr: ast.Expr, doc: ast.Document,
                profile: ast.Profile | None = None, root_eoi: bool = False) -> str:
    """What the mediator subscribes at a service for a pushed subtree of ``profile``. A peer
    mediator gets a whole profile: the subtree with the profile's ``per`` and, at the root, its
    evaluation time; other languages get the subtree in their own notation."""
    render_profile = getattr(language, "render_profile", None)
    if render_profile is None:
        return language.render(expr, doc)
    evaluation = ast.Evaluation.END_OF_INTERVAL if root_eoi else ast.Evaluation.CONTINUOUS
    per = profile.per if profile is not None else None
    return str(render_profile(ast.Profile("R", expr, per, evaluation), doc))


# ------------------------------------------------------------------ parsing helpers


def syntax_error(language: str, exc: UnexpectedInput, source: str,
                 describe: dict[str, str], parser: Lark) -> NativeQueryError:
    """A lark error as 'found …, expected …' with the position, like the EVA parser's."""

    def words(names: Iterable[str]) -> str:
        out = set()
        for n in names:
            if n in describe:
                out.add(describe[n])
                continue
            try:
                pattern = parser.get_terminal(n).pattern
            except KeyError:
                out.add(n.lower())
                continue
            out.add(f"'{pattern.value}'" if pattern.type == "str" else n.lower())
        ordered = sorted(out)
        return ordered[0] if len(ordered) == 1 else ", ".join(ordered[:-1]) + " or " + ordered[-1]

    lines = source.splitlines() or [""]
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream or 0
        char = source[pos] if pos < len(source) else ""
        message = f"unexpected character {char!r}"
        if exc.allowed:
            message += f", expected {words(exc.allowed)}"
        return NativeQueryError(language, message, exc.line, exc.column, source)
    if isinstance(exc, UnexpectedEOF):
        return NativeQueryError(language, f"unexpected end of query, expected {words(exc.expected)}",
                                len(lines), len(lines[-1]) + 1, source)
    assert isinstance(exc, UnexpectedToken)
    token: Token = exc.token
    if token.type == "$END":
        return NativeQueryError(language, f"unexpected end of query, expected {words(exc.expected)}",
                                len(lines), len(lines[-1]) + 1, source)
    return NativeQueryError(language, f"found {token.value!r}, expected {words(exc.expected)}",
                            exc.line, exc.column, source)
