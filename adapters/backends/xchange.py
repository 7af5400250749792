"""CG-4: XChange composite event queries (Bry & Eckert; research/bry_eckert.md §1.3).

Language (docs/backends.md §CG-4)::

    query := and{query, …} | andthen[query, …] | or{query, …}
           | without query during query | query within DURATION | term
    term  := label | label{{child, …}} (partial) | label{child, …} (total)
    child := var X | "string" | number | true | false | term
    label := an event type, bare or "quoted", or * (any type)

An event term matches a CloudEvent of its label's type; its children are matched against the
event's ``data`` as a term tree (an object's fields are children ``key{value}``, an array's
elements are children, a scalar is a leaf) by unordered simulation — partial ``{{ }}`` allows
extra data children, total ``{ }`` does not — giving a set of substitutions Σ for the variables.

Semantics ([XC], all combinations, nothing consumed; reception order = the service's total
order of events, reception time = CloudEvents ``time``):

* ``and{q1, q2}``: answers of each with compatible substitutions (Σ1 ⋈ Σ2 ≠ ∅); the events are
  the union (the s_i need not be distinct);
* ``andthen[q1, q2]``: as ``and``, and every event of q1's answer is received no later than the
  first of q2's (``end(s1) ≤ begin(s2)``, non-strict);
* ``or{…}``: any answer of any operand;
* ``q within d``: answers whose whole span, last − first reception time, is ≤ d (inclusive);
* ``without q during q'``: answers of q' for which no answer of q with a compatible
  substitution lies within the span of the q' answer ([XC]'s exclusion, closed span).

Answers are reported when their last event arrives. Stored answers below a ``within d`` are
released once ``begin(s) < now − d`` (the [XC] garbage-collection rule, TV-11).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from lark import Lark, Token, Transformer

from adapters.backends.native import (
    EventRejected,
    Untimed,
    Work,
    distinct,
    number_token,
    parse_lark,
    string_token,
)
from eva.classes import same
from eva.events import Event
from eva.units import UNITS
from transforms.capability import CG4, Capability
from transforms.dialects.base import Detection
from transforms.dialects.xchange import LABEL_PATTERN

_GRAMMAR = r"""
start: query
?query: "without" query "during" wq -> without
      | wq
?wq: wq "within" DURATION -> within
   | atom
?atom: "and" "{" query ("," query)* "}" -> q_and
     | "andthen" "[" query ("," query)* "]" -> q_andthen
     | "andthen" "[" "[" query ("," query)* "]" "]" -> q_partial
     | "or" "{" query ("," query)* "}" -> q_or
     | "(" query ")"
     | term
?term: braced
     | label -> bare
?braced: label "{" "{" [child ("," child)*] "}" "}" -> partial
       | label "{" [child ("," child)*] "}" -> total
label: LABEL | ESCAPED_STRING | STAR
?child: "var" VAR -> var
      | ESCAPED_STRING -> text
      | SIGNED_NUMBER -> number
      | "true" -> true
      | "false" -> false
      | braced
      | (LABEL | STAR) -> bare_child
STAR: "*"
DURATION.2: /\d+\s*(weeks?|days?|d|hours?|h|minutes?|min|seconds?|s|ms|us)\b/
LABEL: /""" + LABEL_PATTERN + r"""/
VAR: /[A-Z][A-Za-z0-9_]*/
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""



@cache
def _parser() -> Lark:
    """Built when the language first reads a query, not at import (start-up time)."""
    return Lark(_GRAMMAR, parser="lalr", propagate_positions=True)


_DESCRIBE = {"LABEL": "an event term", "ESCAPED_STRING": "a string", "STAR": "'*'",
             "DURATION": "a duration (e.g. 2h, 30 min)", "VAR": "a variable (capitalised)",
             "SIGNED_NUMBER": "a number", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['",
             "RSQB": "']'", "COMMA": "','", "LPAR": "'('", "RPAR": "')'"}
_WORDS = {"week": "weeks", "weeks": "weeks", "day": "d", "days": "d", "d": "d", "hour": "h",
          "hours": "h", "h": "h", "minute": "min", "minutes": "min", "min": "min",
          "second": "s", "seconds": "s", "s": "s", "ms": "ms", "us": "us"}


# ------------------------------------------------------------------ query AST


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Scalar:
    value: object


@dataclass(frozen=True)
class Term:
    label: str  # "*" matches any type
    children: tuple[Child, ...]
    partial: bool


Child = Var | Scalar | Term


@dataclass(frozen=True)
class Composite:
    kind: str  # "and", "andthen", "or"
    operands: tuple[Query, ...]


@dataclass(frozen=True)
class Within:
    query: Query
    span: int


@dataclass(frozen=True)
class Without:
    excluded: Query
    during: Query


Query = Term | Composite | Within | Without


def _duration(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([a-z]+)", text)
    assert m is not None
    return int(m.group(1)) * UNITS[_WORDS[m.group(2)]]


class _Build(Transformer[Any, Any]):
    def start(self, items: list[Any]) -> Query:
        return items[0]

    def without(self, items: list[Any]) -> Query:
        return Without(items[0], items[1])

    def within(self, items: list[Any]) -> Query:
        return Within(items[0], _duration(str(items[1])))

    def q_and(self, items: list[Any]) -> Query:
        return Composite("and", tuple(items))

    def q_andthen(self, items: list[Any]) -> Query:
        return Composite("andthen", tuple(items))

    def q_partial(self, items: list[Any]) -> Query:
        raise ValueError("partial andthen[[…]] (with the events in between) is not supported; "
                         "use andthen[…]")

    def q_or(self, items: list[Any]) -> Query:
        return Composite("or", tuple(items))

    def label(self, items: list[Any]) -> str:
        token: Token = items[0]
        return string_token(token) if token.type == "ESCAPED_STRING" else str(token)

    def partial(self, items: list[Any]) -> Term:
        return Term(items[0], tuple(i for i in items[1:] if i is not None), True)

    def total(self, items: list[Any]) -> Term:
        return Term(items[0], tuple(i for i in items[1:] if i is not None), False)

    def bare(self, items: list[Any]) -> Term:
        return Term(items[0], (), True)

    def bare_child(self, items: list[Any]) -> Term:
        return Term(str(items[0]), (), True)

    def var(self, items: list[Any]) -> Var:
        return Var(str(items[0]))

    def text(self, items: list[Any]) -> Scalar:
        return Scalar(string_token(items[0]))

    def number(self, items: list[Any]) -> Scalar:
        return Scalar(number_token(items[0]))

    def true(self, items: list[Any]) -> Scalar:
        return Scalar(True)

    def false(self, items: list[Any]) -> Scalar:
        return Scalar(False)


# ------------------------------------------------------------------ simulation unification

Binding = frozenset[tuple[str, str]]  # variable → JSON text of its value
Subst = frozenset[Binding]


def _data_children(value: Any) -> list[tuple[str | None, Any]]:
    """A JSON value as term children: fields as (key, value), elements and scalars as (None, v)."""
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items()]
    if isinstance(value, list):
        return [(None, v) for v in value]
    if value is None:
        return []
    return [(None, value)]


def _match_child(q: Child, key: str | None, value: Any, binding: dict[str, str],
                 work: Work) -> list[dict[str, str]]:
    if isinstance(q, Var):
        text = json.dumps({key: value} if key is not None else value, sort_keys=True)
        if q.name in binding and binding[q.name] != text:
            return []
        return [{**binding, q.name: text}]
    if isinstance(q, Scalar):
        return [binding] if key is None and not isinstance(value, (dict, list)) and same(
            value, q.value) else []
    if key != q.label and q.label != "*":
        return []
    return _match_children(q.children, _data_children(value), q.partial, binding, work)


def _match_children(queries: tuple[Child, ...], data: list[tuple[str | None, Any]], partial: bool,
                    binding: dict[str, str], work: Work) -> list[dict[str, str]]:
    """Injective, unordered: each query child to a distinct data child (all used if total).
    Every partial assignment tried is paid for: their number grows factorially with the
    children (``{{var A, …, var F}}`` against nine data fields: 60,480)."""
    if not partial and len(queries) != len(data):
        return []
    out: list[dict[str, str]] = []
    # Depth-first over (next query child, data children used, binding so far) with an explicit
    # stack: a term may list more children than Python's stack has frames.
    stack: list[tuple[int, frozenset[int], dict[str, str]]] = [(0, frozenset(), binding)]
    while stack:
        i, used, b = stack.pop()
        work.spend(1 + len(data))
        if i == len(queries):
            out.append(b)
            continue
        for j, (key, value) in enumerate(data):
            if j not in used:
                for b2 in _match_child(queries[i], key, value, b, work):
                    stack.append((i + 1, used | {j}, b2))
    return out


def match_term(term: Term, event: Event, work: Work) -> Subst:
    if term.label != "*" and term.label != event.type:
        return frozenset()
    found = _match_children(term.children, _data_children(event.data), term.partial, {}, work)
    return frozenset(frozenset(b.items()) for b in found)


def _join(a: Subst, b: Subst, work: Work) -> Subst:
    work.spend(len(a) * len(b))
    out = set()
    for x in a:
        dx = dict(x)
        for y in b:
            if all(dx.get(k, v) == v for k, v in y):
                out.add(x | y)
    return frozenset(out)


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class Answer:
    events: tuple[Event, ...]  # sorted by reception
    subst: Subst

    @property
    def begin(self) -> Event:
        return self.events[0]

    @property
    def end(self) -> Event:
        return self.events[-1]


def _distinct(answers: list[Answer], work: Work) -> list[Answer]:
    return distinct(answers, lambda a: a.events, lambda a: a.subst, work)


def _union(a: tuple[Event, ...], b: tuple[Event, ...]) -> tuple[Event, ...]:
    merged = {(e.key, e.source, e.id): e for e in a + b}
    return tuple(merged[k] for k in sorted(merged, key=lambda k: k[0]))


class _Node:
    def __init__(self, query: Query, horizon: int | None, work: Work, keep: bool = False) -> None:
        self.query = query
        self.horizon = horizon
        self.work = work
        """The evaluator's meter, shared by its nodes: every combination tried is paid for."""
        self.keep = keep
        """Whether its answers are stored: only where its parent reads them (a conjunction's
        operands, a ``without``'s excluded query) — the others would be kept for nothing."""
        span = query.span if isinstance(query, Within) else None
        inner = horizon if span is None else span if horizon is None else min(span, horizon)
        if isinstance(query, Composite):
            combines = query.kind != "or"
            self.kids = [_Node(q, inner, work, combines) for q in query.operands]
        elif isinstance(query, Within):
            self.kids = [_Node(query.query, inner, work)]
        elif isinstance(query, Without):
            # Excluded answers must be kept as long as the span they could fall into.
            self.kids = [_Node(query.excluded, inner, work, True),
                         _Node(query.during, inner, work)]
        else:
            self.kids = []
        self.stored: list[Answer] = []

    def step(self, event: Event) -> list[Answer]:
        q = self.query
        if isinstance(q, Term):
            subst = match_term(q, event, self.work)
            new = [Answer((event,), subst)] if subst else []
        elif isinstance(q, Within):
            new = [a for a in self.kids[0].step(event) if a.end.time - a.begin.time <= q.span]
        elif isinstance(q, Without):
            excluded = self.kids[0]
            excluded.step(event)
            new = []
            for a in self.kids[1].step(event):
                self.work.spend(len(a.subst) * len(excluded.stored))
                kept = frozenset(s for s in a.subst if not any(
                    a.begin.key <= x.begin.key and x.end.key <= a.end.key and _join(
                        frozenset([s]), x.subst, self.work) for x in excluded.stored))
                if kept:
                    new.append(Answer(a.events, kept))
        elif q.kind == "or":
            new = []
            for kid in self.kids:
                new.extend(kid.step(event))
            new = _distinct(new, self.work)
        else:
            new = self._conjoin(event, q.kind == "andthen")
        if self.keep:
            self.stored.extend(new)
        if self.horizon is not None and self.stored:
            limit = event.time - self.horizon
            self.stored = [a for a in self.stored if a.begin.time >= limit]
        return new

    def kept(self) -> int:
        """Answers stored here and below."""
        return len(self.stored) + sum(k.kept() for k in self.kids)

    def _conjoin(self, event: Event, ordered: bool) -> list[Answer]:
        """n-ary and/andthen as a left fold of binary ones over the operands' answers."""
        olds = [list(k.stored) for k in self.kids]
        news = [k.step(event) for k in self.kids]
        # Every combination with at least one new answer: the prefix folds of old and all.
        acc_old: list[Answer] = olds[0]
        acc_new: list[Answer] = news[0]
        last = len(self.kids) - 1
        for position, (old, new) in enumerate(zip(olds[1:], news[1:], strict=True), start=1):
            both = [*old, *new]
            fresh = [c for a in acc_old for b in new if (c := _combine(a, b, ordered, self.work))]
            fresh += [c for a in acc_new for b in both if (c := _combine(a, b, ordered, self.work))]
            if position < last:  # old × old is needed only to combine with later operands
                acc_old = [c for a in acc_old for b in old
                           if (c := _combine(a, b, ordered, self.work))]
            acc_new = _distinct(fresh, self.work)
        return acc_new


def _combine(a: Answer, b: Answer, ordered: bool, work: Work) -> Answer | None:
    work.spend(1)
    if ordered and not a.end.key <= b.begin.key:
        return None
    subst = _join(a.subst, b.subst, work)
    if not subst:
        return None
    work.spend(len(a.events) + len(b.events))
    return Answer(_union(a.events, b.events), subst)


def _released(node: _Node, combined: bool = False) -> list[Term]:
    """The terms whose answers a bounded node combines with stored ones — stored answers are
    released once older than the horizon, so an event of such a term older than the newest
    one may need a partner already released."""
    if isinstance(node.query, Term):
        return [node.query] if combined and node.horizon is not None else []
    combines = combined or not (isinstance(node.query, Within)
                                or (isinstance(node.query, Composite) and node.query.kind == "or"))
    return [t for kid in node.kids for t in _released(kid, combines)]


class Evaluator(Untimed):
    def __init__(self, query: Query) -> None:
        self._work = Work()
        self._root = _Node(query, None, self._work)
        self._bounded = _released(self._root)
        self._newest: int | None = None

    def push(self, event: Event) -> list[Detection]:
        self._work.start()
        self._refuse_late(event)
        if self._newest is None or event.time > self._newest:
            self._newest = event.time
        answers = self._root.step(event)
        self._work.kept(self._root.kept())
        out = []
        for a in answers:
            bindings = [dict(b) for b in sorted(a.subst, key=sorted)]
            extra = {"substitutions": [{k: json.loads(v) for k, v in b.items()} for b in bindings]}
            text = "⟨" + ", ".join(e.id for e in a.events) + "⟩"
            out.append(Detection(a.end.time, a.events, text, extra))
        return out


    def _refuse_late(self, event: Event) -> None:
        """An event older than the newest one may need partners a bounded node has released
        already: rather than answer without them (an incomplete answer), refuse it, as the
        SQL service does (CG-3)."""
        newest = self._newest
        if newest is None or event.time >= newest:
            return
        if any(match_term(term, event, self._work) for term in self._bounded):
            raise EventRejected(
                "late", f"event {event.id!r} at {event.time} µs arrived after one at {newest} µs; "
                "this query keeps answers only as long as its `within` span behind the newest "
                "event, so it takes events in time order")


@dataclass(frozen=True)
class XChangeQuery:
    text: str
    query: Query

    def evaluator(self) -> Evaluator:
        return Evaluator(self.query)


class XChangeLanguage:
    name = "xchange"
    group = "cg4"
    capability: Capability = CG4

    def parse(self, text: str) -> XChangeQuery:
        query: Query = parse_lark(self.name, _parser(), text, _DESCRIBE, _Build())
        return XChangeQuery(text, query)
