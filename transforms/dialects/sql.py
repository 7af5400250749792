"""CG-3: streaming-SQL interval joins, built as sqlglot trees and printed by sqlglot.

An EVA expression becomes a UNION ALL of flat joins, one per combination of disjunction
operands: a leaf per primitive class (a stream per single type, else ``events`` with the class
as a WHERE filter), time conditions per operator (a sequence: ``later > earlier`` and, with a
span, ``later <= earlier + INTERVAL``; a conjunction with a span: ``±INTERVAL``), and the
occurrence time of a part as ``GREATEST`` of its operands' times. A class is widened where SQL's
NULL logic differs from EVA's (negative tests are dropped — the mediator re-applies the exact
class to what comes back). Leaves are numbered while the trees are built, so no placeholder is
ever renumbered in text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from sqlglot import exp

from eva import ast
from eva.classes import resolve, type_only
from transforms.capability import CG3
from transforms.dialects.base import TICK_TYPE, Dialect, PredicateRule, Rendering, operands

UNITS = {"WEEK": 604_800_000_000, "DAY": 86_400_000_000, "HOUR": 3_600_000_000,
         "MINUTE": 60_000_000, "SECOND": 1_000_000, "MILLISECOND": 1_000, "MICROSECOND": 1}
"""SQL's interval units in µs, largest first (the language reads them; the dialect writes the
largest that divides a span)."""

ATTRIBUTES = ("id", "type", "source", "subject", "time")
"""CloudEvents attributes written as plain columns; an extension is quoted (it keeps its case)."""

LEAF = "a1"
"""The alias a class's filter is written over, renamed when its place in the join is known."""

Condition = exp.Expression | None
"""A rendered predicate; None stands for TRUE (a widened test)."""


# ------------------------------------------------------------------ predicates


def _literal(r: Rendering, value: object) -> exp.Expression:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, float)):
        text = json.dumps(value)  # as SQL reads a number: -5 is a negation of 5
        return exp.Neg(this=exp.Literal.number(text[1:])) if text.startswith("-") else \
            exp.Literal.number(text)
    if isinstance(value, str):
        return exp.Literal.string(value)
    return r.unsupported(f"no SQL literal for {value!r}")


def _column(r: Rendering, path: str) -> exp.Expression:
    head, _, rest = path.partition(".")
    if head == "data" and rest:
        return exp.Anonymous(this="JSON_VALUE", expressions=[
            exp.column("data", LEAF), exp.Literal.string("$." + rest)])
    if head == "data":
        return r.unsupported("a test on the whole data object")
    return exp.column(exp.to_identifier(head, quoted=head not in ATTRIBUTES), LEAF)


_COMPARE: dict[str, Callable[..., exp.Expression]] = {"==": exp.EQ, "<": exp.LT, "<=": exp.LTE, ">": exp.GT,
                                         ">=": exp.GTE}


def _compare(r: Rendering, pred: ast.Compare) -> Condition:
    if pred.value is None:
        return _true(r, pred)  # SQL's = NULL is unknown, never true: widened
    return _COMPARE[pred.op](this=_column(r, pred.path), expression=_literal(r, pred.value))


def _in(r: Rendering, pred: ast.Compare) -> Condition:
    assert isinstance(pred.value, tuple)
    if not all(isinstance(v, (str, int, float)) for v in pred.value):
        return _true(r, pred)
    return exp.In(this=_column(r, pred.path),
                  expressions=[_literal(r, v) for v in pred.value])


def _true(r: Rendering, pred: ast.Predicate) -> Condition:
    """``!=`` and ``not``: SQL's three-valued logic differs from EVA's; widened to TRUE."""
    r.widen(pred)
    return None


def _and(r: Rendering, pred: ast.And) -> Condition:
    """A dropped (TRUE) conjunct leaves the others: a flat chain ``x AND y AND z`` (which the
    parser and the evaluator take as one n-ary node however long), an OR chain in brackets."""
    kept = [c for c in (r.predicate(p) for p in operands(pred)) if c is not None]
    if len(kept) <= 1:
        return kept[0] if kept else None
    return _chain(exp.And, [exp.Paren(this=c) if isinstance(c, exp.Or) else c for c in kept])


def _or(r: Rendering, pred: ast.Or) -> Condition:
    """A TRUE disjunct makes the whole TRUE; AND binds tighter than OR: no brackets."""
    noted = len(r.widened)
    parts = [r.predicate(p) for p in operands(pred)]
    if any(p is None for p in parts):
        del r.widened[noted:]  # the whole disjunction is left out, not only its part
        return _true(r, pred)
    return _chain(exp.Or, parts)


def _chain(connector: Callable[..., exp.Expression], parts: list[exp.Expression]) -> exp.Expression:
    """``p1 op p2 op …`` as sqlglot reads it: left-deep."""
    return reduce(lambda left, right: connector(this=left, expression=right), parts)


PREDICATES: dict[str, PredicateRule] = {
    **dict.fromkeys(_COMPARE, _compare), "in": _in, "!=": _true, "not": _true,
    "and": _and, "or": _or}


# ------------------------------------------------------------------ joins

Time = int | tuple["Time", "Time"]
"""A part's occurrence time: the time of leaf k, or GREATEST of two times."""


@dataclass(frozen=True)
class _Bound:
    """``later op earlier [± INTERVAL span]`` between two times of a part."""

    op: Callable[..., exp.Expression]
    later: Time
    earlier: Time
    span: int | None = None
    shift: Callable[..., exp.Expression] = exp.Add


@dataclass(frozen=True)
class _Leaf:
    stream: str | None
    """A single event type, or None: every event (``events``) with ``filter``."""
    filter: Condition = None


@dataclass(frozen=True)
class _Part:
    """An EVA subexpression as one flat join: its leaves, the bounds between their times and
    its occurrence time."""

    leaves: tuple[_Leaf, ...]
    bounds: tuple[_Bound, ...]
    time: Time


def _shifted(time: Time, by: int) -> Time:
    return time + by if isinstance(time, int) else (_shifted(time[0], by), _shifted(time[1], by))


def _leaf(r: Rendering, expr: ast.Prim) -> list[_Part]:
    body = r.classes[expr.name].body
    if isinstance(body, ast.Every):
        return [_Part((_Leaf(TICK_TYPE + expr.name),), (), 0)]
    types = type_only(body, r.classes)
    if types is not None and len(types) == 1:
        return [_Part((_Leaf(next(iter(types))),), (), 0)]
    r.leaf(expr.name)
    condition = r.predicate(resolve(body, r.classes))
    if isinstance(condition, exp.Or):
        condition = exp.Paren(this=condition)  # an operand of the WHERE's AND
    return [_Part((_Leaf(None, condition),), (), 0)]


def _union(r: Rendering, expr: ast.Disjunction) -> list[_Part]:
    return [*r.expr(expr.left.expr), *r.expr(expr.right.expr)]


def _join(r: Rendering, expr: ast.Conjunction | ast.Sequence) -> list[_Part]:
    out = []
    lefts: list[_Part] = r.expr(expr.left.expr)
    rights: list[_Part] = r.expr(expr.right.expr)
    for left in lefts:
        for right in rights:
            by = len(left.leaves)
            bounds = [*left.bounds, *(_Bound(b.op, _shifted(b.later, by), _shifted(b.earlier, by),
                                             b.span, b.shift) for b in right.bounds)]
            lt, rt = left.time, _shifted(right.time, by)
            time: Time
            if isinstance(expr, ast.Sequence):
                bounds.append(_Bound(exp.GT, rt, lt))
                if expr.span is not None:
                    bounds.append(_Bound(exp.LTE, rt, lt, expr.span))
                time = rt
            else:
                if expr.span is not None:
                    bounds.append(_Bound(exp.GTE, rt, lt, expr.span, exp.Sub))
                    bounds.append(_Bound(exp.LTE, rt, lt, expr.span))
                time = (lt, rt)
            out.append(_Part(left.leaves + right.leaves, tuple(bounds), time))
    return out


# ------------------------------------------------------------------ the statement


def interval(micros: int) -> exp.Interval:
    for unit, size in UNITS.items():
        if micros % size == 0:
            return exp.Interval(this=exp.Literal.string(str(micros // size)),
                                unit=exp.Var(this=unit))
    raise AssertionError("MICROSECOND divides every integer")


def _alias(index: int) -> str:
    return f"a{index + 1}"


def _time(time: Time) -> exp.Expression:
    if isinstance(time, int):
        return exp.column("time", _alias(time))
    return exp.Greatest(this=_time(time[0]), expressions=[_time(time[1])], ignore_nulls=True)


def _level(time: Time) -> int:
    """The last leaf a time mentions: a condition is stated where that leaf joins."""
    return time if isinstance(time, int) else max(_level(time[0]), _level(time[1]))


def _bound(bound: _Bound) -> exp.Expression:
    earlier = _time(bound.earlier)
    if bound.span is not None:
        earlier = bound.shift(this=earlier, expression=interval(bound.span))
    return bound.op(this=_time(bound.later), expression=earlier)


def _renamed(condition: exp.Expression, alias: str) -> exp.Expression:
    """A leaf's filter (written over :data:`LEAF`) over the alias its leaf joins as."""
    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            return exp.column(node.this.copy(), alias)
        return node

    return condition.transform(rename)


def _stream(leaf: _Leaf, index: int) -> exp.Table:
    name = (exp.to_identifier("events") if leaf.stream is None
            else exp.to_identifier(leaf.stream, quoted=True))
    return exp.Table(this=name, alias=exp.TableAlias(this=exp.to_identifier(_alias(index))))


def _select(part: _Part, width: int) -> exp.Select:
    names = [_alias(i) for i in range(len(part.leaves))]
    columns: list[exp.Expression] = [exp.column("id", n) for n in names]
    columns += [exp.Null() for _ in range(width - len(names))]
    by_level: list[list[exp.Expression]] = [[] for _ in names]
    for bound in part.bounds:
        by_level[max(_level(bound.later), _level(bound.earlier))].append(_bound(bound))
    joins = [exp.Join(this=_stream(part.leaves[i], i),
                      on=_chain(exp.And, by_level[i]) if by_level[i] else exp.Boolean(this=True))
             for i in range(1, len(names))]
    where = [_renamed(leaf.filter, names[i]) for i, leaf in enumerate(part.leaves)
             if leaf.filter is not None] + by_level[0]
    select = exp.Select(expressions=columns, from_=exp.From(this=_stream(part.leaves[0], 0)))
    if joins:
        select.set("joins", joins)
    if where:
        select.set("where", exp.Where(this=_chain(exp.And, where)))
    return select


def _statement(r: Rendering, expr: ast.Expr, parts: list[_Part]) -> str:
    width = max(len(p.leaves) for p in parts)
    selects: list[exp.Expression] = [_select(p, width) for p in parts]
    query = reduce(lambda left, right: exp.Union(this=left, expression=right, distinct=False),
                   selects)
    return query.sql()


SQL = Dialect("cg3", "sql", CG3,
              {ast.Prim: _leaf, ast.Disjunction: _union, ast.Conjunction: _join,
               ast.Sequence: _join},
              PREDICATES, _statement, cannot="SQL interval joins cannot state {node}",
              placeholder=[])
