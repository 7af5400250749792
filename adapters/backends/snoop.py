"""CG-2: Snoop (Chakravarthy et al., VLDB 1994) with its parameter contexts.

Language (docs/backends.md §CG-2)::

    query   := expr [CONTEXT unrestricted|recent|chronicle|continuous|cumulative]
    expr    := expr ; expr | expr AND expr | expr OR expr      (one precedence, left-associative)
             | NOT(expr)[expr, expr] | ( expr ) | TYPE
    TYPE    := an event type name (the CloudEvents ``type``), bare or "quoted"

Semantics are the normative node rules of research/snoop.md §3.2 (SEQ, AND, with the
same-instant batch rule) and §3.3 (OR, NOT). Every operator node keeps a store per child in the
layout of its context; a primitive event enters at the leaves of its type and the nodes'
output batches flow upward, children in index order. A detection's time is its terminator's
time; its constituents are the operands' constituents concatenated as in §3.4 (AND: the stored
one first; cumulative: every accumulated initiator first, in arrival order).

Snoop has no time frames and knows events only by type: the mediator applies any data test of
an EVA class itself (capability ``predicates="type"``) and uses a context only where the
verified mapping of research/snoop.md §5.3 holds (a flat operator over distinct types).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import chain
from typing import Any

from lark import Lark, Transformer

from adapters.backends.native import Untimed, Work, parse_lark
from eva.events import Event
from transforms.capability import CG2, Capability
from transforms.dialects.base import Detection
from transforms.dialects.snoop import TYPE_PATTERN

_GRAMMAR = r"""
start: expr context?
context: "CONTEXT" CONTEXT_NAME
?expr: expr ";" term -> seq
     | expr "AND" term -> conj
     | expr "OR" term -> disj
     | term
?term: "NOT" "(" expr ")" "[" expr "," expr "]" -> neg
     | "(" expr ")"
     | TYPE -> leaf
     | ESCAPED_STRING -> quoted
CONTEXT_NAME.2: "unrestricted" | "recent" | "chronicle" | "continuous" | "cumulative"
TYPE: /""" + TYPE_PATTERN + r"""/
%import common.ESCAPED_STRING
%import common.WS
%ignore WS
"""



@cache
def _parser() -> Lark:
    """Built when the language first reads a query, not at import (start-up time)."""
    return Lark(_GRAMMAR, parser="lalr", propagate_positions=True)


_DESCRIBE = {"TYPE": "an event type", "ESCAPED_STRING": "a quoted event type",
             "CONTEXT_NAME": "a context (unrestricted, recent, chronicle, continuous, cumulative)",
             "SEMICOLON": "';'", "LPAR": "'('", "RPAR": "')'"}


@dataclass(frozen=True)
class Leaf:
    type: str


@dataclass(frozen=True)
class Op:
    kind: str  # "seq", "and", "or", "not"
    children: tuple[Expr, ...]  # NOT(E2)[E1, E3] is stored as (E2, E1, E3)


Expr = Leaf | Op


class _Build(Transformer[Any, Any]):
    def start(self, items: list[Any]) -> tuple[Expr, str]:
        return items[0], (items[1] if len(items) > 1 else "unrestricted")

    def context(self, items: list[Any]) -> str:
        return str(items[0])

    def seq(self, items: list[Any]) -> Expr:
        return Op("seq", (items[0], items[1]))

    def conj(self, items: list[Any]) -> Expr:
        return Op("and", (items[0], items[1]))

    def disj(self, items: list[Any]) -> Expr:
        return Op("or", (items[0], items[1]))

    def neg(self, items: list[Any]) -> Expr:
        return Op("not", (items[0], items[1], items[2]))

    def leaf(self, items: list[Any]) -> Expr:
        return Leaf(str(items[0]))

    def quoted(self, items: list[Any]) -> Expr:
        return Leaf(str(items[0])[1:-1].replace('\\"', '"'))


# ------------------------------------------------------------------ occurrences and nodes


@dataclass(frozen=True)
class Occ:
    time: int
    constituents: tuple[Event, ...]

    @property
    def start(self) -> int:
        return min(e.time for e in self.constituents)


class _Node:
    work: Work
    """The evaluator's meter, shared by its nodes: every occurrence an operator makes is paid
    for with its constituents (Work.spend), so that nesting cannot multiply them unseen."""

    def feed(self, event: Event) -> list[Occ]:
        raise NotImplementedError

    def stored(self) -> int:
        return 0

    def _occ(self, time: int, *parts: Occ | list[Occ]) -> Occ:
        occs = [o for p in parts for o in (p if isinstance(p, list) else [p])]
        self.work.spend(sum(len(o.constituents) for o in occs))  # paid before it is built
        return Occ(time, tuple(chain.from_iterable(o.constituents for o in occs)))

    def _first(self, found: list[Occ], fits: Callable[[Occ], bool], last: bool = False) -> int:
        """The index of the first (``last``: the last) occurrence of ``found`` that ``fits``
        (-1: none), paid for by the occurrences looked at — most often one."""
        order = range(len(found) - 1, -1, -1) if last else range(len(found))
        looked = 0
        for i in order:
            looked += 1
            if fits(found[i]):
                self.work.spend(looked)
                return i
        self.work.spend(looked)
        return -1


class _Leaf(_Node):
    def __init__(self, type_: str) -> None:
        self.type = type_

    def feed(self, event: Event) -> list[Occ]:
        return [Occ(event.time, (event,))] if event.type == self.type else []


class _Or(_Node):
    def __init__(self, left: _Node, right: _Node) -> None:
        self.kids = (left, right)

    def feed(self, event: Event) -> list[Occ]:
        return self.kids[0].feed(event) + self.kids[1].feed(event)

    def stored(self) -> int:
        return self.kids[0].stored() + self.kids[1].stored()


class _Seq(_Node):
    """E1 ; E2 — E1 is stored (the initiator), E2 triggers (§3.2, first table)."""

    def __init__(self, left: _Node, right: _Node, context: str) -> None:
        self.kids = (left, right)
        self.context = context
        self.store: list[Occ] = []

    def stored(self) -> int:
        return len(self.store) + self.kids[0].stored() + self.kids[1].stored()

    def feed(self, event: Event) -> list[Occ]:
        initiators = self.kids[0].feed(event)
        terminators = self.kids[1].feed(event)
        if initiators:
            if self.context == "recent":
                self.store = [initiators[-1]]
            else:
                self.store.extend(initiators)
        out: list[Occ] = []
        if not terminators:
            return out
        ctx = self.context
        if ctx == "continuous":
            # Batch rule: every terminator pairs with the initiators present before the batch;
            # the used ones are deleted after it.
            before = list(self.store)
            used: set[int] = set()
            for x in terminators:
                self.work.spend(len(before))
                for i, y in enumerate(before):
                    if y.time < x.time:
                        out.append(self._occ(x.time, y, x))
                        used.add(i)
            self.store = [y for i, y in enumerate(before) if i not in used]
            return out
        for x in terminators:
            if ctx == "chronicle":  # the oldest eligible one: at the front, as a rule
                i = self._first(self.store, lambda y: y.time < x.time)  # noqa: B023
                if i >= 0:
                    out.append(self._occ(x.time, self.store.pop(i), x))
                continue
            self.work.spend(len(self.store))
            eligible = [y for y in self.store if y.time < x.time]
            if not eligible:
                continue
            if ctx in ("unrestricted", "recent"):
                out.extend(self._occ(x.time, y, x) for y in eligible)
            else:  # cumulative: every eligible one is consumed (those equal to one are too)
                out.append(self._occ(x.time, eligible, x))
                self.store = [y for y in self.store if y.time >= x.time]
        return out


class _And(_Node):
    """E1 AND E2 — symmetric: an arrival on one side meets the other side's store (§3.2)."""

    def __init__(self, left: _Node, right: _Node, context: str) -> None:
        self.kids = (left, right)
        self.context = context
        self.sides: tuple[list[Occ], list[Occ]] = ([], [])

    def stored(self) -> int:
        return (len(self.sides[0]) + len(self.sides[1]) + self.kids[0].stored()
                + self.kids[1].stored())

    def feed(self, event: Event) -> list[Occ]:
        batches = (self.kids[0].feed(event), self.kids[1].feed(event))
        out: list[Occ] = []
        for s in (0, 1):  # children in index order
            if batches[s]:
                out.extend(self._arrive(s, batches[s]))
        return out

    def _arrive(self, s: int, batch: list[Occ]) -> list[Occ]:
        mine, other = self.sides[s], self.sides[1 - s]
        ctx = self.context
        out: list[Occ] = []
        if ctx == "continuous":
            before = list(other)
            used: set[int] = set()
            for x in batch:
                self.work.spend(len(before))
                for i, y in enumerate(before):
                    if y != x:
                        out.append(self._occ(x.time, y, x))
                        used.add(i)
            other[:] = [y for i, y in enumerate(before) if i not in used]
            mine.extend(batch)  # a terminator that can initiate is kept
            return out
        for x in batch:
            if ctx in ("recent", "chronicle"):  # the newest or the oldest partner
                i = self._first(other, lambda y: y != x, last=ctx == "recent")  # noqa: B023
                if ctx == "recent":
                    if i >= 0:
                        out.append(self._occ(x.time, other[i], x))
                    mine[:] = [x]
                elif i >= 0:
                    out.append(self._occ(x.time, other.pop(i), x))
                else:
                    mine.append(x)
                continue
            self.work.spend(len(other))
            partners = [y for y in other if y != x]
            if ctx == "unrestricted":
                out.extend(self._occ(x.time, y, x) for y in partners)
                mine.append(x)
            elif partners:  # cumulative: every partner is consumed (those equal to one are too)
                out.append(self._occ(x.time, partners, x))
                other[:] = [y for y in other if y == x]
            else:
                mine.append(x)
        return out


class _Not(_Node):
    """NOT(E2)[E1, E3]: E1 opens an interval, E2 cancels the open ones, E3 closes them all and
    reports (e1, e3) for those still open (§3.3, close policy 'all')."""

    def __init__(self, negated: _Node, opener: _Node, closer: _Node, context: str) -> None:
        self.negated, self.opener, self.closer = negated, opener, closer
        self.context = context
        self.open: list[Occ] = []

    def stored(self) -> int:
        return (len(self.open) + self.negated.stored() + self.opener.stored()
                + self.closer.stored())

    def feed(self, event: Event) -> list[Occ]:
        cancels = self.negated.feed(event)
        closes = self.closer.feed(event)
        opens = self.opener.feed(event)
        for c in cancels:
            self.work.spend(len(self.open))
            self.open = [o for o in self.open if o.time > c.time]
        out: list[Occ] = []
        for x in closes:
            self.work.spend(len(self.open))
            live = [o for o in self.open if o.time <= x.time and o != x]
            if live:
                if self.context in ("unrestricted", "continuous"):
                    out.extend(self._occ(x.time, o, x) for o in live)
                elif self.context == "recent":
                    out.append(self._occ(x.time, live[-1], x))
                elif self.context == "chronicle":
                    out.append(self._occ(x.time, live[0], x))
                else:
                    out.append(self._occ(x.time, live, x))
            self.open = []
        if opens:
            if self.context == "recent":
                self.open = [opens[-1]]
            else:
                self.open.extend(opens)
        return out


def _build(expr: Expr, context: str, work: Work) -> _Node:
    node: _Node
    if isinstance(expr, Leaf):
        node = _Leaf(expr.type)
    else:
        kids = [_build(k, context, work) for k in expr.children]
        if expr.kind == "or":
            node = _Or(kids[0], kids[1])
        elif expr.kind == "seq":
            node = _Seq(kids[0], kids[1], context)
        elif expr.kind == "and":
            node = _And(kids[0], kids[1], context)
        else:
            node = _Not(kids[0], kids[1], kids[2], context)
    node.work = work
    return node


class Evaluator(Untimed):
    def __init__(self, expr: Expr, context: str) -> None:
        self._work = Work()
        self._root = _build(expr, context, self._work)

    def push(self, event: Event) -> list[Detection]:
        self._work.start()
        found = self._root.feed(event)
        self._work.kept(self._root.stored())
        return [Detection(o.time, o.constituents,
                          "{" + ", ".join(e.id for e in o.constituents) + f"}}@{o.time}")
                for o in found]


@dataclass(frozen=True)
class SnoopQuery:
    text: str
    expr: Expr
    context: str

    def evaluator(self) -> Evaluator:
        return Evaluator(self.expr, self.context)


class SnoopLanguage:
    name = "snoop"
    group = "cg2"
    capability: Capability = CG2

    def parse(self, text: str) -> SnoopQuery:
        expr, context = parse_lark(self.name, _parser(), text, _DESCRIBE, _Build())
        return SnoopQuery(text, expr, context)
