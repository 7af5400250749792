"""CG-1: boolean composite filters — ``AND(a, b)``, ``OR(a, b)``, ``NOT(a)``, untimed.

Language (docs/backends.md §CG-1)::

    query  := AND(query, query, …) | OR(query, query, …) | NOT(query) | filter
    filter := [ condition ]        e.g. [type = "traffic.jam" & data.area = "A"]

Semantics — all combinations, nothing consumed, no time:

* a filter detects every single event it matches;
* ``OR(q1, q2)`` detects what either detects (a detection of both is reported once);
* ``AND(q1, q2)`` detects every pair of a q1 detection and a q2 detection that share no event,
  reported when the later one completes, time = the later time, constituents q1's then q2's;
* ``AND(q1, …, qn)`` and ``OR(q1, …, qn)`` are the nested binary ones (both are associative:
  ``AND(AND(q1, q2), q3)`` and ``AND(q1, AND(q2, q3))`` detect the same), evaluated as a
  balanced tree, so that a long one is not as deep as it is long;
* ``NOT(q)`` is **untimed**, so there is no span in which an absence could be observed: it is
  the complement of a single-event query — it detects every event that ``q`` does not. ``q``
  must be single-event (a filter, or OR/NOT of single-event queries); ``NOT`` of an ``AND`` is
  rejected. The mediator uses it only through class predicates (``not`` in an EVA class).

State is every detection so far (untimed: nothing ever becomes irrelevant); the service keeps
it per subscription until the subscription ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from lark import Lark

from adapters.backends.filters import FILTER_GRAMMAR, FILTER_TERMINALS, FilterBuild
from adapters.backends.native import NativeQueryError, Untimed, Work, distinct, parse_lark
from eva import ast
from eva.classes import compile_predicate
from eva.events import Event
from transforms.capability import CG0, CG1, Capability
from transforms.dialects.base import Detection, balanced

_GRAMMAR = r"""
start: query
?query: "AND" "(" query ("," query)+ ")" -> q_and
      | "OR" "(" query ("," query)+ ")" -> q_or
      | "NOT" "(" query ")" -> q_not
      | filter
""" + FILTER_GRAMMAR + r"""
%import common.WS
%ignore WS
"""



@cache
def _parser() -> Lark:
    """Built when the language first reads a query, not at import (start-up time)."""
    return Lark(_GRAMMAR, parser="lalr", propagate_positions=True)


@dataclass(frozen=True)
class Filter:
    predicate: ast.Predicate


@dataclass(frozen=True)
class And:
    left: Node
    right: Node


@dataclass(frozen=True)
class Or:
    left: Node
    right: Node


@dataclass(frozen=True)
class Not:
    operand: Node


Node = Filter | And | Or | Not


class _Build(FilterBuild):
    def start(self, items: list[Any]) -> Node:
        return items[0]

    def filter(self, items: list[Any]) -> Filter:  # type: ignore[override]
        return Filter(items[0])

    def q_and(self, items: list[Any]) -> Node:
        return balanced(items, And)

    def q_or(self, items: list[Any]) -> Node:
        return balanced(items, Or)

    def q_not(self, items: list[Any]) -> Node:
        return Not(items[0])


def single_event(node: Node) -> bool:
    if isinstance(node, Filter):
        return True
    if isinstance(node, Or):
        return single_event(node.left) and single_event(node.right)
    if isinstance(node, Not):
        return single_event(node.operand)
    return False


def _check(node: Node, text: str) -> None:
    if isinstance(node, Not):
        if not single_event(node.operand):
            raise NativeQueryError("boolean", "NOT applies to a single-event query (a filter, or "
                                   "OR/NOT of filters): an untimed NOT has no span in which an "
                                   "absence could be observed", 1, text.find("NOT") + 1, text)
        _check(node.operand, text)
    elif isinstance(node, (And, Or)):
        _check(node.left, text)
        _check(node.right, text)


def parse_node(text: str, language: str = "boolean") -> Node:
    node: Node = parse_lark(language, _parser(), text, FILTER_TERMINALS, _Build())
    _check(node, text)
    return node


# ------------------------------------------------------------------ evaluation

_Det = tuple[Event, ...]


class _Eval:
    """Per node: every detection so far; a step returns the detections containing the new event."""

    def __init__(self, node: Node, work: Work, keep: bool = False) -> None:
        self.node = node
        self.work = work  # the evaluator's meter, shared by its nodes
        self.keep = keep  # whether ``seen`` is kept: only an AND reads its operands'
        self.kids = [_Eval(k, work, isinstance(node, And)) for k in _kids(node)]
        self.seen: list[_Det] = []
        self.matcher = compile_predicate(_as_predicate(node), {}) if single_event(node) else None

    def step(self, event: Event) -> list[_Det]:
        new: list[_Det]
        if self.matcher is not None:  # single-event queries reduce to one predicate
            new = [(event,)] if self.matcher(event) else []
        elif isinstance(self.node, Or):
            new = distinct(self.kids[0].step(event) + self.kids[1].step(event),
                           lambda d: d, lambda d: None, self.work)
        else:
            left, right = self.kids
            old_left, old_right = list(left.seen), list(right.seen)
            new_left, new_right = left.step(event), right.step(event)
            # Paid before they are tried: a product of stored detections can be large.
            self.work.spend(len(new_left) * len(old_right) + len(old_left) * len(new_right))
            new = [a + b for a in new_left for b in old_right if _disjoint(a, b)]
            new += [a + b for a in old_left for b in new_right if _disjoint(a, b)]
            self.work.spend(sum(map(len, new)))
        if self.keep:
            self.seen.extend(new)
        return new

    def kept(self) -> int:
        """Detections stored here and below."""
        return len(self.seen) + sum(k.kept() for k in self.kids)


def _kids(node: Node) -> list[Node]:
    if isinstance(node, (And, Or)):
        return [node.left, node.right]
    if isinstance(node, Not):
        return [node.operand]
    return []


def _as_predicate(node: Node) -> ast.Predicate:
    if isinstance(node, Filter):
        return node.predicate
    if isinstance(node, Not):
        return ast.Not(_as_predicate(node.operand))
    if isinstance(node, Or):
        return ast.Or(_as_predicate(node.left), _as_predicate(node.right))
    raise AssertionError("AND is not a single-event query")


def _disjoint(a: _Det, b: _Det) -> bool:
    ids = {(e.source, e.id) for e in a}
    return not any((e.source, e.id) in ids for e in b)


class Evaluator(Untimed):
    def __init__(self, node: Node) -> None:
        self._work = Work()
        self._root = _Eval(node, self._work)

    def push(self, event: Event) -> list[Detection]:
        self._work.start()
        found = self._root.step(event)
        self._work.kept(self._root.kept())
        return [Detection(event.time, d, "{" + ", ".join(e.id for e in d) + "}")
                for d in found]


@dataclass(frozen=True)
class BooleanQuery:
    text: str
    node: Node

    def evaluator(self) -> Evaluator:
        return Evaluator(self.node)


class BooleanLanguage:
    name = "boolean"
    group = "cg1"
    capability: Capability = CG1

    def parse(self, text: str) -> BooleanQuery:
        return BooleanQuery(text, parse_node(text, self.name))


class FilterLanguage:
    """CG-0: one filter per subscription (what an MQTT or Redis adapter can select on)."""

    name = "filter"
    group = "cg0"
    capability: Capability = CG0

    def parse(self, text: str) -> BooleanQuery:
        node = parse_node(text, self.name)
        if not isinstance(node, Filter):
            raise NativeQueryError(self.name, "a primitive-filter service takes one [filter], "
                                   "no AND/OR/NOT", 1, 1, text)
        return BooleanQuery(text, node)
