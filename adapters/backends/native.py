"""What every native language of a base service shares: detections, query errors, evaluators.

A base service evaluates its *own* language with that language's *own* semantics (DESIGN §6);
the mediator only meets it through text: a native query in, native notifications out. Each
language module (``boolean``, ``snoop``, ``sql``, ``xchange``, ``peer``) provides a
:class:`Language`: ``parse`` (text → query, or :class:`NativeQueryError`) and ``evaluator`` (a
fresh incremental evaluation of a query). What the mediator speaks to a service — rendering EVA
as native text, reading notifications back — is the group's dialect (:mod:`transforms.dialects`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from lark import Lark, Token, Transformer, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from eva.events import Event
from transforms.capability import Capability
from transforms.dialects.base import Detection as Detection  # where it was defined before


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
            # A long line (a generated query can be one line of 64 KiB) is shown as a window
            # around the column, so that the message stays readable.
            code, caret = lines[self.line - 1], self.column - 1
            if len(code) > _SHOWN:
                start = max(0, min(caret - _SHOWN // 2, len(code) - _SHOWN))
                code = ("…" if start else "") + code[start:start + _SHOWN] + (
                    "…" if start + _SHOWN < len(code) else "")
                caret = caret - start + (1 if start else 0)
            text += f"\n  {code}\n  {' ' * caret}^"
        return text


_SHOWN = 100
"""Characters of the offending line shown with an error."""


class EventRejected(Exception):
    """An event the evaluator will not take (e.g. older than what its conditions keep): the
    service counts it in ``PublishReply.rejected`` with ``reason`` and goes on with the next."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


WORK_LIMIT = 100_000
"""Work an evaluator may do for one event or clock step: the intermediate results it makes
(occurrences, partial rows, combined answers), each counted with its constituents. A query
whose results multiply at every level (nested conjunctions keeping every occurrence) would
otherwise take minutes of the service's CPU for a handful of events. About 0.1 s of CPU."""
STORE_LIMIT = 1_000_000
"""Results an evaluator may keep between events (its operators' stores): what bounds the
memory of a query that keeps everything it ever matched."""


@contextlib.contextmanager
def limits(work: int, store: int) -> Iterator[None]:
    """Evaluators made meanwhile (in this thread's turn) have these limits: a restarted
    service replays a registration it ended with the limits it had then, so that the end
    comes at the same event, after no more work than then."""
    global WORK_LIMIT, STORE_LIMIT
    before = WORK_LIMIT, STORE_LIMIT
    WORK_LIMIT, STORE_LIMIT = work, store
    try:
        yield
    finally:
        WORK_LIMIT, STORE_LIMIT = before


class Exhausted(Exception):
    """An evaluation past WORK_LIMIT or STORE_LIMIT: the service ends the subscription with
    RESOURCE_EXHAUSTED and this message (what the query does is too much, not the event)."""


class Work:
    """The work meter of one evaluator: :meth:`start` before each event or clock step,
    :meth:`spend` as results are made, :meth:`kept` after the step with what is stored."""

    __slots__ = ("left", "limit", "store_limit")

    def __init__(self) -> None:
        # Read when the evaluator is made, so that a test (or an operator's patch) can lower them.
        self.limit, self.store_limit = WORK_LIMIT, STORE_LIMIT
        self.left = self.limit

    def start(self) -> None:
        self.left = self.limit

    def spend(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise Exhausted(f"work_limit: the query made more than {self.limit:,} intermediate "
                            "results (counted with their constituents) for one event; its "
                            "results multiply too fast — bound it (a time span, a context that "
                            "consumes)")

    def kept(self, stored: int) -> None:
        if stored > self.store_limit:
            raise Exhausted(f"store_limit: the query keeps more than {self.store_limit:,} "
                            "results between events; bound it (a time span, a context that "
                            "consumes)")


R = TypeVar("R")


def distinct(found: list[R], events: Callable[[R], tuple[Event, ...]], key: Callable[[R], Any],
             work: Work) -> list[R]:
    """``found`` without repeats, in order, in linear time: looked up by their events'
    identities (and ``key``), compared in full only with those that share them (an event's
    ``data`` may be a dict: events are not always hashable)."""
    work.spend(len(found))
    seen: dict[Any, list[R]] = {}
    out: list[R] = []
    for d in found:
        alike = seen.setdefault(
            (tuple((e.source, e.id, e.time, e.seq) for e in events(d)), key(d)), [])
        if d not in alike:
            alike.append(d)
            out.append(d)
    return out


class Evaluator(Protocol):
    """An incremental evaluation of one query. Events arrive in the service's total order."""

    def push(self, event: Event) -> list[Detection]:
        """The detections this event completes; :class:`EventRejected` if it cannot be taken."""
        ...

    def advance(self, time: int) -> list[Detection]:
        """No event at or before ``time`` will come: clock-driven detections up to it."""
        ...

    def next_instant(self) -> int | None:
        """The earliest time at which ``advance`` may report something (None: nothing until
        the next event). A caller that runs the clock across a quiet gap need not stop before
        it, so the gap costs what the evaluator reports, not its length."""
        ...



class Untimed:
    """The clock side of an evaluator whose language has no time-driven detections: nothing
    happens without an event, so a quiet gap costs nothing."""

    def advance(self, time: int) -> list[Detection]:
        return []

    def next_instant(self) -> int | None:
        return None

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


def run(query: Query, events: Iterable[Event], until: int | None = None,
        rejected: Callable[[Event, EventRejected], None] | None = None) -> list[Detection]:
    """A whole trace through one evaluator, in order; the clock runs to ``until`` at the end.
    An event the evaluator refuses is left out and the run goes on, as a base service does
    (``rejected`` is told about it)."""
    evaluator = query.evaluator()
    out: list[Detection] = []
    last: int | None = None
    for event in events:
        try:
            out.extend(evaluator.push(event))
        except EventRejected as exc:
            if rejected is not None:
                rejected(event, exc)
            continue
        last = event.time if last is None else max(last, event.time)
    end = until if until is not None else last
    if end is not None:
        out.extend(evaluator.advance(end))
    return out


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


# ------------------------------------------------------------------ limits every language applies

MAX_QUERY_BYTES = 64 * 1024
"""A longer query is refused before any parser sees it (a 1 MB query took 27 s and 257 MB)."""

MAX_NESTING = 32
"""Brackets ``( [ {`` nest at most this deep: the parsers (sqlglot's recursive descent the most)
and the evaluators recurse per level, and Python's stack is finite."""

MAX_DEPTH = 128
"""The parsed query is a tree at most this deep. A chain of an operator the language treats as
n-ary — CG-1's ``&``, ``|``, ``AND(…)``, ``OR(…)``, SQL's ``AND``, ``OR``, ``UNION ALL``,
XChange's ``and{…}``, ``or{…}`` — is one level however long (it is read, built and evaluated
without recursing per term); any other chain (Snoop's ``a ; b ; c``, ``NOT NOT …``) is a level
per operator, so this bounds what brackets alone do not."""


@dataclass(frozen=True)
class Lexical:
    """How a language writes strings and comments, so that brackets inside them are not counted."""

    quotes: str = '"'
    backslash: bool = True
    """``\\"`` escapes a quote (JSON); otherwise a doubled quote does (SQL)."""
    multiline: bool = False
    """A string may span lines; otherwise it ends at the line's end (lark's ESCAPED_STRING)."""
    line_comment: str = ""
    block_comment: tuple[str, str] | None = None
    unterminated: bool = False
    """Report an unterminated string or comment here (when the parser's own error is worse)."""


JSON_STRINGS = Lexical()
"""The lark languages: JSON strings in double quotes, no comments."""


def position(text: str, index: int) -> tuple[int, int]:
    """(line, column), both from 1, of a character index."""
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def check_size(language: str, text: str) -> None:
    """Refuse a query over :data:`MAX_QUERY_BYTES` before anything reads it."""
    size = len(text) if len(text) > MAX_QUERY_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_QUERY_BYTES:
        raise NativeQueryError(language, f"the query is {size:,} bytes; a native query may be at "
                               f"most {MAX_QUERY_BYTES:,} bytes (64 KiB)")


def check_text(language: str, text: str, lexical: Lexical = JSON_STRINGS) -> None:
    """Refuse, before parsing, a query over :data:`MAX_QUERY_BYTES` or with brackets nested
    deeper than :data:`MAX_NESTING` (one pass over the text, no recursion)."""
    check_size(language, text)
    depth, i, n = 0, 0, len(text)
    notable = _notable(lexical).search
    while (found := notable(text, i)) is not None:
        i = found.start()  # (what lies before is neither a quote, a comment nor a bracket)
        c = text[i]
        if c in lexical.quotes:
            end = _string_end(text, i, lexical)
            if end < 0:
                if lexical.unterminated:
                    raise NativeQueryError(language, f"unterminated quote: the {c} here is never "
                                           "closed", *position(text, i), text)
                end = n if lexical.multiline else _line_end(text, i)
            i = end + 1
        elif lexical.line_comment and text.startswith(lexical.line_comment, i):
            i = _line_end(text, i) + 1
        elif lexical.block_comment and text.startswith(lexical.block_comment[0], i):
            close = text.find(lexical.block_comment[1], i + len(lexical.block_comment[0]))
            if close < 0:
                if lexical.unterminated:
                    raise NativeQueryError(language, f"unterminated comment: the "
                                           f"{lexical.block_comment[0]} here is never closed",
                                           *position(text, i), text)
                return
            i = close + len(lexical.block_comment[1])
        else:
            if c in "([{":
                depth += 1
                if depth > MAX_NESTING:
                    raise NativeQueryError(
                        language, f"brackets nest deeper than {MAX_NESTING} levels here (the limit "
                        "of a native query)", *position(text, i), text)
            elif c in ")]}":
                depth = max(0, depth - 1)  # an unbalanced one is the parser's to report
            i += 1


@functools.cache
def _notable(lexical: Lexical) -> re.Pattern[str]:
    """Where :func:`check_text` has something to do: a quote, a comment's start, a bracket
    (the characters between are skipped in C, not one by one)."""
    starts = [re.escape(lexical.line_comment)] if lexical.line_comment else []
    if lexical.block_comment:
        starts.append(re.escape(lexical.block_comment[0]))
    return re.compile("|".join([f"[{re.escape(lexical.quotes + '([{)]}')}]", *starts]))


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _string_end(text: str, start: int, lexical: Lexical) -> int:
    """Index of the quote closing the string opened at ``start``; -1 if it is never closed."""
    quote, i, n = text[start], start + 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n" and not lexical.multiline:
            return -1
        if lexical.backslash and c == "\\":
            i += 2
            continue
        if c == quote:
            if not lexical.backslash and i + 1 < n and text[i + 1] == quote:
                i += 2  # a doubled quote stands for itself
                continue
            return i
        i += 1
    return -1


N = TypeVar("N")


def too_deep(root: N, children: Callable[[N], Iterable[N]], limit: int = MAX_DEPTH,
             chained: Callable[[N, N], bool] | None = None) -> N | None:
    """A node more than ``limit`` levels below ``root``, or None. Iterative: the tree may be far
    deeper than Python's stack. ``chained(parent, child)``: the child continues its parent's
    n-ary chain (``a AND b AND c`` parsed as ``(a AND b) AND c``), on the parent's level."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node
        stack.extend((c, depth if chained is not None and chained(node, c) else depth + 1)
                     for c in children(node))
    return None


def depth_error(language: str, text: str, line: int, column: int) -> NativeQueryError:
    return NativeQueryError(language, f"the query nests deeper than {MAX_DEPTH} levels here "
                            "(each operator of a chain counts; the limit of a native query)",
                            line, column, text)


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def number(text: str) -> int | float:
    """A numeric literal as SQL reads it: ``01`` is 1, ``5.`` is 5.0, ``1e3`` is 1000.0 (an
    integer only when written as one). ValueError for anything else or a non-finite value."""
    if len(text) > 1000 or not _NUMBER.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not a number this language reads "
                         "(digits, an optional fraction and exponent, at most 1000 characters)")
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


class BadToken(ValueError):
    """A transformer's objection to one token (a number out of range, a bad escape): the query
    error points at the token."""

    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


def number_token(token: Token) -> int | float:
    try:
        return number(str(token))
    except ValueError as exc:
        raise BadToken(str(exc), token) from None


def string_token(token: Token) -> str:
    """A double-quoted JSON string; lark's ESCAPED_STRING also lets through what JSON does not
    (``\\q``, a raw tab)."""
    try:
        value = json.loads(str(token))
    except ValueError as exc:
        raise BadToken(f"{str(token)[:40]} is not a valid string: {exc}", token) from None
    assert isinstance(value, str)
    return value


def _first_token(node: Tree[Token] | Token) -> Token | None:
    stack: list[Tree[Token] | Token] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Token):
            return item
        stack.extend(reversed(item.children))
    return None


def _place(node: Tree[Token] | Token | None) -> tuple[int, int]:
    if isinstance(node, Tree) and not node.meta.empty:
        return node.meta.line, node.meta.column
    token = None if node is None else _first_token(node)
    return (token.line or 1, token.column or 1) if token is not None else (1, 1)


def parse_lark(language: str, parser: Lark, text: str, describe: dict[str, str],
               build: Transformer[Token, Any]) -> Any:
    """The shared parsing path of the lark languages: the limits, the parse (syntax errors as
    'found …, expected …'), the depth of the tree, then ``build``; a ValueError the builder
    raises on a token becomes a query error at that token."""
    check_text(language, text)
    try:
        tree = parser.parse(text)
    except UnexpectedInput as exc:
        raise syntax_error(language, exc, text, describe, parser) from None
    deep = too_deep(tree, lambda t: [c for c in t.children if isinstance(c, Tree)])
    if deep is not None:
        raise depth_error(language, text, *_place(deep))
    try:
        return build.transform(tree)
    except VisitError as exc:
        inner = exc.orig_exc
        if isinstance(inner, BadToken):
            raise NativeQueryError(language, inner.message, inner.token.line or 1,
                                   inner.token.column or 1, text) from None
        if isinstance(inner, ValueError):
            raise NativeQueryError(language, str(inner), *_place(exc.obj), text) from None
        raise
