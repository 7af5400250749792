"""CG-3: streaming-SQL interval joins in the style of Flink SQL and ksqlDB.

Language (docs/backends.md §CG-3) — a restricted SELECT, parsed and printed with sqlglot::

    query  := select (UNION ALL select)*
    select := SELECT alias.id | NULL, …  FROM stream AS alias
              (JOIN stream AS alias ON condition)*  [WHERE condition]
    stream := events (every event) | "type" (the events of that CloudEvents type)

Columns are CloudEvents attributes of an alias (``a.id``, ``a.type``, ``a.source``, ``a.subject``,
``a.time`` in µs, extensions) and data fields via ``JSON_VALUE(a.data, '$.x.y')`` (the JSON
scalar, typed; NULL for an object, an array or a missing field — SQL:2016's NULL ON ERROR).
Identifiers are case-insensitive unless quoted: unquoted names (aliases, columns, ``events``, a
stream) fold to lower case, quoted ones keep theirs. Conditions: comparisons (``FALSE < TRUE``),
``[NOT] BETWEEN [SYMMETRIC]``, ``[NOT] IN (…)``, ``IS [NOT] NULL|TRUE|FALSE``, ``IS [NOT]
DISTINCT FROM``, ``AND``/``OR``/``NOT`` with SQL's three-valued logic, ``+``/``-`` with
``INTERVAL 'n' UNIT`` (WEEK … MICROSECOND), ``ABS``, ``GREATEST``, ``TRUE``/``FALSE``/``NULL``.

Semantics: an inner join over the stream — every combination of events that satisfies the
conditions (all pairs; an event may be used in any number of rows). A row is emitted when its
last event arrives; its constituents are the projected ids in order, its time the latest of
theirs. ``UNION ALL`` concatenates (no duplicate elimination). The service keeps every event
that can still join: the time conditions, read as difference constraints (``b.time <= a.time +
INTERVAL …``, ``BETWEEN``, ``b.time - a.time <= …``, ``ABS(a.time - b.time) <= …``), bound how
far apart the events of one row can be; older events are released. Events are expected in time
order (a watermark with no lateness): a join that releases events rejects an event older than
the newest one as ``late`` rather than answer without the partners it released. Without such a
bound (a timeless join) every event is kept and any order is fine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, SqlglotError
from sqlglot.tokenizer_core import Token, TokenType

from adapters.backends.native import (
    EventRejected,
    Lexical,
    NativeQueryError,
    Untimed,
    Work,
    check_text,
    depth_error,
    number,
    position,
    too_deep,
)
from eva.events import Event
from transforms.capability import CG3, Capability
from transforms.dialects.base import Detection
from transforms.dialects.sql import UNITS

_SQL = Lexical(quotes="'\"", backslash=False, multiline=True, line_comment="--",
               block_comment=("/*", "*/"), unterminated=True)
"""sqlglot's default dialect: 'strings' and "names" with doubled quotes, -- and /* */ comments."""

MAX_ALIASES = 64
"""Aliases per SELECT: rows are enumerated by nested loops, one level per alias."""

Row = list[Event | None]
Value = Callable[[Row], Any]


class _Reject(Exception):
    def __init__(self, message: str, node: exp.Expression | None = None) -> None:
        super().__init__(message)
        self.node = node


# ------------------------------------------------------------------ names


def _name(ident: exp.Expression | None) -> str:
    """An identifier as SQL reads it: an unquoted one folds to lower case, a quoted one keeps
    its case ("" when there is none)."""
    if not isinstance(ident, exp.Identifier):
        return ""
    return str(ident.this) if ident.quoted else str(ident.this).lower()


def _column_parts(column: exp.Column) -> tuple[str, str]:
    """(alias, attribute) of ``alias.attribute``, names folded."""
    if column.args.get("db") or column.args.get("catalog"):
        raise _Reject(f"a column is alias.attribute, not {column.sql()!r}", column)
    if not isinstance(column.this, exp.Identifier):
        raise _Reject("a column names one attribute (a.id, a.type, …), not *", column)
    return _name(column.args.get("table")), _name(column.this)


# ------------------------------------------------------------------ values and SQL's logic


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _sql_same(a: Any, b: Any) -> bool | None:
    """``=``: unknown with a NULL; values of different types (a number and a string) differ."""
    if a is None or b is None:
        return None
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def _sql_order(op: str, a: Any, b: Any) -> bool | None:
    """``< <= > >=`` within numbers, strings or booleans (``FALSE < TRUE``); unknown otherwise."""
    if a is None or b is None:
        return None
    if not (_is_number(a) and _is_number(b)) and not (
            type(a) is type(b) and isinstance(a, (str, bool))):
        return None
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _truth(v: Any) -> bool | None:
    """A value used as a condition: a boolean is itself, anything else is unknown."""
    return v if isinstance(v, bool) else None


def _not3(v: bool | None) -> bool | None:
    return None if v is None else not v


def _and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or3(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _chain3(checks: list[Value], row: Row, decisive: bool) -> bool | None:
    """A chain in three-valued logic: ``decisive`` if one check is (False for ``AND``, True for
    ``OR``; a check has no side effects, so the first one decides), else unknown if one is."""
    unknown = False
    for check in checks:
        truth = check(row)
        if truth is decisive:
            return decisive
        unknown = unknown or truth is None
    return None if unknown else not decisive


def _all3(checks: list[Value], row: Row) -> bool | None:
    """``c1 AND c2 AND …``."""
    return _chain3(checks, row, False)


def _any3(checks: list[Value], row: Row) -> bool | None:
    """``c1 OR c2 OR …``."""
    return _chain3(checks, row, True)


def _in3(subject: Any, options: list[Any]) -> bool | None:
    results = [_sql_same(subject, o) for o in options]
    if any(r is True for r in results):
        return True
    return None if any(r is None for r in results) else False


def _between3(x: Any, low: Any, high: Any) -> bool | None:
    return _and3(_sql_order(">=", x, low), _sql_order("<=", x, high))


def _distinct(a: Any, b: Any) -> bool:
    """``IS DISTINCT FROM``: never unknown, NULL is not distinct from NULL."""
    if a is None or b is None:
        return not (a is None and b is None)
    return _sql_same(a, b) is False


def _arith(a: Any, b: Any, sign: int) -> Any:
    if not _is_number(a) or not _is_number(b):
        return None
    return a + sign * b


def _abs(v: Any) -> Any:
    return abs(v) if _is_number(v) else None


def _neg(v: Any) -> Any:
    return -v if _is_number(v) else None


def _greatest(values: list[Any]) -> Any:
    numbers = [v for v in values if _is_number(v)]
    return max(numbers) if len(numbers) == len(values) else None


def _attribute(event: Event | None, attr: str) -> Any:
    if event is None:
        return None
    return event.field(attr) if attr != "time" else event.time


def _json_path(event: Event | None, keys: list[str]) -> Any:
    value: Any = None if event is None else event.data
    for k in keys:
        if not isinstance(value, dict) or k not in value:
            return None
        value = value[k]
    # JSON_VALUE returns scalars: an object or an array is an error, and SQL:2016's default
    # NULL ON ERROR makes it NULL (so `IS NULL` and `NOT (… = 1)` read it as a standard engine).
    return None if isinstance(value, (dict, list)) else value


def _micros(node: exp.Interval) -> int:
    unit = str(node.unit.name if node.unit else "").upper()
    unit = unit[:-1] if unit.endswith("S") else unit
    if unit not in UNITS:
        raise _Reject(f"unknown interval unit {unit!r}; expected one of {', '.join(UNITS)}", node)
    # Stripped once and read as checked: str.strip and int() disagree on what a blank is
    # (int() refuses '\x1e5', which strip() reduces to '5': found by fuzzing).
    amount = (node.this.name if isinstance(node.this, exp.Literal) else "").strip()
    if not re.fullmatch(r"[+-]?\d{1,12}", amount):
        raise _Reject("an interval needs an integer amount (at most 12 digits): "
                      "INTERVAL '5' MINUTE", node)
    return int(amount) * UNITS[unit]


# ------------------------------------------------------------------ expression compiler

_COMPARE: dict[type[exp.Expression], str] = {exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}

_CONDITIONS = (exp.And, exp.Or, exp.Not, exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.In,
               exp.Is, exp.Between, exp.NullSafeEQ, exp.NullSafeNEQ)
"""The nodes :meth:`_Compiler.condition` compiles; every other node is a value."""


class _Compiler:
    """sqlglot's tree → closures over a row. ``value`` and ``condition`` hand a node to each
    other only across :data:`_CONDITIONS`, so an unknown node is rejected, never looped on."""

    def __init__(self, aliases: dict[str, int]) -> None:
        self.aliases = aliases
        self.used: set[int] = set()

    def alias(self, column: exp.Column) -> int:
        name, attr = _column_parts(column)
        if not name:
            raise _Reject(f"column {attr!r} needs an alias (a.{attr})", column)
        if name not in self.aliases:
            raise _Reject(f"unknown alias {name!r}; the aliases are "
                          f"{', '.join(sorted(self.aliases))}", column)
        index = self.aliases[name]
        self.used.add(index)
        return index

    def value(self, node: exp.Expression) -> Value:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, _CONDITIONS):
            return self.condition(node)
        if isinstance(node, exp.Column):
            index = self.alias(node)
            attr = _column_parts(node)[1]
            if attr == "data":
                raise _Reject("a.data is the JSON payload; read a field with "
                              "JSON_VALUE(a.data, '$.field')", node)
            return lambda row: _attribute(row[index], attr)
        if isinstance(node, exp.Literal):
            literal: Any = node.this
            if not node.is_string:
                try:
                    literal = number(str(node.this))
                except ValueError as exc:
                    raise _Reject(str(exc), node) from None
            return lambda row: literal
        if isinstance(node, exp.Boolean):
            truth = bool(node.this)
            return lambda row: truth
        if isinstance(node, exp.Null):
            return lambda row: None
        if isinstance(node, exp.Interval):
            micros = _micros(node)
            return lambda row: micros
        if isinstance(node, exp.Anonymous) and str(node.this).upper() == "JSON_VALUE":
            return self.json_value(node)
        if isinstance(node, (exp.Add, exp.Sub)):
            left, right = self.value(node.this), self.value(node.expression)
            sign = 1 if isinstance(node, exp.Add) else -1
            return lambda row: _arith(left(row), right(row), sign)
        if isinstance(node, exp.Abs):
            inner = self.value(node.this)
            return lambda row: _abs(inner(row))
        if isinstance(node, exp.Neg):
            inner = self.value(node.this)
            return lambda row: _neg(inner(row))
        if isinstance(node, exp.Greatest):
            parts = [self.value(node.this), *(self.value(e) for e in node.expressions)]
            return lambda row: _greatest([p(row) for p in parts])
        if isinstance(node, exp.Func):
            name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
            raise _Reject(f"unknown function {name.upper()}(); the functions are JSON_VALUE, "
                          "ABS and GREATEST", node)
        raise _Reject(f"unsupported expression {type(node).__name__.upper()}: expected a "
                      "column, a literal, an INTERVAL, arithmetic or a condition", node)

    def json_value(self, node: exp.Anonymous) -> Value:
        args = node.expressions
        if len(args) != 2 or not isinstance(args[1], exp.Literal) or not args[1].is_string \
                or not isinstance(args[0], exp.Column) or _column_parts(args[0])[1] != "data":
            raise _Reject("JSON_VALUE takes (alias.data, '$.path')", node)
        index = self.alias(args[0])
        path = args[1].this
        if not re.fullmatch(r"\$(\.[A-Za-z0-9_\-]+)+", path):
            raise _Reject(f"unsupported JSON path {path!r}; expected '$.field' or "
                          "'$.field.subfield'", node)
        keys = path.split(".")[1:]
        return lambda row: _json_path(row[index], keys)

    def condition(self, node: exp.Expression) -> Value:
        if isinstance(node, exp.Paren):
            return self.condition(node.this)
        if isinstance(node, exp.And):  # a chain, however long, as one n-ary check
            every = [self.condition(c) for c in _chain(node, exp.And)]
            return lambda row: _all3(every, row)
        if isinstance(node, exp.Or):
            some = [self.condition(c) for c in _chain(node, exp.Or)]
            return lambda row: _any3(some, row)
        if isinstance(node, exp.Not):
            inner = self.condition(node.this)
            return lambda row: _not3(inner(row))
        if isinstance(node, (exp.EQ, exp.NEQ)):
            left, right = self.value(node.this), self.value(node.expression)
            if isinstance(node, exp.EQ):
                return lambda row: _sql_same(left(row), right(row))
            return lambda row: _not3(_sql_same(left(row), right(row)))
        if isinstance(node, (exp.NullSafeEQ, exp.NullSafeNEQ)):
            left, right = self.value(node.this), self.value(node.expression)
            if isinstance(node, exp.NullSafeNEQ):
                return lambda row: _distinct(left(row), right(row))
            return lambda row: not _distinct(left(row), right(row))
        if type(node) in _COMPARE:
            op = _COMPARE[type(node)]
            left, right = self.value(node.this), self.value(node.expression)
            return lambda row: _sql_order(op, left(row), right(row))
        if isinstance(node, exp.Between):
            subject, low = self.value(node.this), self.value(node.args["low"])
            high = self.value(node.args["high"])
            if node.args.get("symmetric"):
                return lambda row: _or3(_between3(x := subject(row), lo := low(row), hi := high(row)),
                                        _between3(x, hi, lo))
            return lambda row: _between3(subject(row), low(row), high(row))
        if isinstance(node, exp.In):
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                raise _Reject("IN takes a list of values: x IN (1, 2)", node)
            subject = self.value(node.this)
            options = [self.value(e) for e in node.expressions]
            if not options:
                raise _Reject("IN needs a list of values: x IN (1, 2)", node)
            return lambda row: _in3(subject(row), [o(row) for o in options])
        if isinstance(node, exp.Is):
            subject = self.value(node.this)
            test = node.expression
            if isinstance(test, exp.Null):
                return lambda row: subject(row) is None
            if isinstance(test, exp.Boolean):
                truth = bool(test.this)
                return lambda row: subject(row) is truth
            raise _Reject("IS takes NULL, TRUE or FALSE", node)
        inner = self.value(node)
        return lambda row: _truth(inner(row))


# ------------------------------------------------------------------ query structure


@dataclass
class _Branch:
    """One SELECT: aliases in join order, their streams, checks by the alias that completes
    them, projected alias indices (None for NULL)."""

    names: list[str]
    streams: list[str | None]  # None: every event
    checks: list[list[Value]]
    projection: list[int | None]
    horizon: int | None = None
    """No row spans more than this (µs) — derived from the time conditions; None: unbounded."""


def _unwrap(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _chain(node: exp.Expression, kind: type[exp.And | exp.Or]) -> list[exp.Expression]:
    """The operands of a (parenthesised) AND (or OR) chain, left to right; iterative, as a
    chain may be long (sqlglot reads ``a AND b AND c`` as ``(a AND b) AND c``)."""
    out: list[exp.Expression] = []
    stack = [node]
    while stack:
        item = _unwrap(stack.pop())
        if isinstance(item, kind):
            stack.extend([item.expression, item.this])
        else:
            out.append(item)
    return out


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    return _chain(node, exp.And)


def _chained(parent: exp.Expression, child: exp.Expression) -> bool:
    """``child`` continues ``parent``'s chain of AND, OR or UNION ALL: the same level of the
    query (each is compiled as one n-ary node)."""
    return type(child) is type(parent) and isinstance(parent, (exp.And, exp.Or, exp.Union))


def _only(node: exp.Expression, allowed: set[str]) -> None:
    """Refuse any clause of ``node`` this language does not have (ORDER BY, LIMIT, USING …)."""
    for key, value in node.args.items():
        if key not in allowed and value not in (None, False, [], ""):
            raise _Reject(f"{key.rstrip('_').upper()} is not part of this language",
                          value if isinstance(value, exp.Expression) else node)


def _stream(table: exp.Table) -> str | None:
    """``events`` (any case, unquoted) is every event; another name is a CloudEvents type,
    matched exactly when quoted and in lower case when not (SQL folds unquoted names)."""
    if table.args.get("db") or table.args.get("catalog"):
        dotted = ".".join(part.name for part in table.parts)
        raise _Reject(f"a type with dots is quoted: \"{dotted}\"", table)
    if not isinstance(table.this, exp.Identifier):
        raise _Reject("FROM and JOIN take a stream name", table)
    _only(table, {"this", "alias"})
    name = _name(table.this)
    return None if name == "events" and not table.this.quoted else name


def _branch(select: exp.Expression) -> _Branch:
    if not isinstance(select, exp.Select):
        raise _Reject("each part of the query must be a SELECT", select)
    _only(select, {"expressions", "from", "from_", "joins", "where"})
    source = select.args.get("from_") or select.args.get("from")
    if source is None:
        raise _Reject("SELECT needs FROM", select)
    joins = select.args.get("joins") or []
    tables = [source.this] + [j.this for j in joins]
    if len(tables) > MAX_ALIASES:
        raise _Reject(f"a SELECT joins at most {MAX_ALIASES} aliases", joins[MAX_ALIASES - 1])
    names: list[str] = []
    streams: list[str | None] = []
    for table in tables:
        if not isinstance(table, exp.Table):
            raise _Reject("FROM and JOIN take a stream name, not a subquery", table)
        alias_node = table.args.get("alias")
        if isinstance(alias_node, exp.TableAlias) and alias_node.columns:
            raise _Reject("an alias names an event, not its columns", alias_node)
        alias = _name(alias_node.this) if isinstance(alias_node, exp.TableAlias) else ""
        stream = _stream(table)
        alias = alias or _name(table.this)
        if alias in names:
            raise _Reject(f"alias {alias!r} is used twice", table)
        names.append(alias)
        streams.append(stream)
    aliases = {n: i for i, n in enumerate(names)}
    checks: list[list[Value]] = [[] for _ in names]
    conditions: list[exp.Expression] = []
    for join in joins:
        if join.side or (join.kind and join.kind.upper() not in ("INNER",)) or join.method:
            raise _Reject("only inner joins (all pairs) are supported", join)
        if join.args.get("using"):
            raise _Reject("JOIN takes ON, not USING", join)
        _only(join, {"this", "on", "kind"})
        on = join.args.get("on")
        if on is None:
            raise _Reject("JOIN needs ON", join)
        conditions.extend(_conjuncts(on))
    where = select.args.get("where")
    if where is not None:
        conditions.extend(_conjuncts(where.this))
    for cond in conditions:
        compiler = _Compiler(aliases)
        check = compiler.condition(cond)
        level = max(compiler.used, default=0)
        checks[level].append(check)
    projection: list[int | None] = []
    for item in select.expressions:
        if isinstance(item, exp.Null):
            projection.append(None)
        elif isinstance(item, exp.Column) and _column_parts(item)[1] == "id":
            projection.append(_Compiler(aliases).alias(item))
        else:
            raise _Reject("the projection lists alias.id (the constituents) or NULL", item)
    if not any(p is not None for p in projection):
        raise _Reject("the projection names no constituent", select)
    return _Branch(names, streams, checks, projection, _horizon(conditions, aliases))


# ------------------------------------------------------------------ retention

Term = frozenset[int]
"""A time term: the aliases whose latest time it is ({a} for a.time, GREATEST(a.time, …))."""

Linear = tuple[dict[Term, int], float]
"""Σ coefficient × term + constant (µs)."""


def _linear(node: exp.Expression, aliases: dict[str, int]) -> Linear | None:
    """A sum of time terms and constants (intervals, numbers: times are µs); None otherwise."""
    node = _unwrap(node)
    if isinstance(node, exp.Column):
        alias, attr = _column_parts(node)
        return ({frozenset([aliases[alias]]): 1}, 0.0) if attr == "time" else None
    if isinstance(node, exp.Greatest):
        members: set[int] = set()
        for part in [node.this, *node.expressions]:
            inner = _linear(part, aliases)
            if inner is None or inner[1] != 0 or list(inner[0].values()) != [1]:
                return None
            members |= next(iter(inner[0]))
        return {frozenset(members): 1}, 0.0
    if isinstance(node, exp.Interval):
        return {}, float(_micros(node))
    if isinstance(node, exp.Literal) and not node.is_string:
        return {}, float(number(str(node.this)))
    if isinstance(node, exp.Neg):
        inner = _linear(node.this, aliases)
        return None if inner is None else _scale(inner, -1)
    if isinstance(node, (exp.Add, exp.Sub)):
        left, right = _linear(node.this, aliases), _linear(node.expression, aliases)
        if left is None or right is None:
            return None
        return _plus(left, right if isinstance(node, exp.Add) else _scale(right, -1))
    return None


def _scale(form: Linear, k: int) -> Linear:
    return {t: k * c for t, c in form[0].items()}, k * form[1]


def _plus(a: Linear, b: Linear) -> Linear:
    terms = dict(a[0])
    for t, c in b[0].items():
        terms[t] = terms.get(t, 0) + c
    return {t: c for t, c in terms.items() if c}, a[1] + b[1]


def _at_most(small: exp.Expression, big: exp.Expression,
             aliases: dict[str, int]) -> list[Linear]:
    """``small <= big`` as forms that are ≤ 0; ``ABS(u) <= big`` is ``u <= big`` and
    ``-u <= big``. (``big >= ABS(u)`` alone says nothing bounded, nor does an unknown side.)"""
    small = _unwrap(small)
    b = _linear(big, aliases)
    if b is None:
        return []
    if isinstance(small, exp.Abs):
        u = _linear(small.this, aliases)
        return [] if u is None else [_plus(u, _scale(b, -1)), _plus(_scale(u, -1), _scale(b, -1))]
    s = _linear(small, aliases)
    return [] if s is None else [_plus(s, _scale(b, -1))]


def _differences(cond: exp.Expression,
                 aliases: dict[str, int]) -> list[tuple[Term, Term, float]]:
    """The difference constraints ``x − y ≤ d`` a conjunct states between two time terms."""
    cond = _unwrap(cond)
    forms: list[Linear] = []
    if isinstance(cond, (exp.LT, exp.LTE, exp.EQ)):  # < is read as <=: a safe, wider bound
        forms += _at_most(cond.this, cond.expression, aliases)
    if isinstance(cond, (exp.GT, exp.GTE, exp.EQ)):
        forms += _at_most(cond.expression, cond.this, aliases)
    if isinstance(cond, exp.Between) and not cond.args.get("symmetric"):
        forms += _at_most(cond.args["low"], cond.this, aliases)
        forms += _at_most(cond.this, cond.args["high"], aliases)
    out = []
    for terms, constant in forms:  # x − y + constant ≤ 0
        if sorted(terms.values()) == [-1, 1]:
            x = next(t for t, c in terms.items() if c == 1)
            y = next(t for t, c in terms.items() if c == -1)
            out.append((x, y, -constant))
    return out


def _horizon(conditions: list[exp.Expression], aliases: dict[str, int]) -> int | None:
    """The largest time distance two events of one row can have, from the conditions read as
    difference constraints (x − y ≤ d) over alias times and GREATEST terms; None if some pair
    is unbounded. What an interval join needs to keep: events older than the newest one minus
    the horizon can join nothing new."""
    INF = float("inf")
    edges: dict[tuple[Term, Term], float] = {}

    def bound(x: Term, y: Term, d: float) -> None:  # x − y ≤ d
        edges[(y, x)] = min(edges.get((y, x), INF), d)

    for cond in conditions:
        for x, y, d in _differences(cond, aliases):
            bound(x, y, d)
    nodes = {frozenset([i]) for i in aliases.values()} | {n for pair in edges for n in pair}
    groups = [g for g in nodes if len(g) > 1]
    for g in groups:
        for m in g:
            bound(frozenset([m]), g, 0)  # every member is at most the greatest
    dist: dict[tuple[Term, Term], float] = {}
    for _ in range(len(nodes) + 1):
        dist = {(u, v): 0.0 if u == v else edges.get((u, v), INF) for u in nodes for v in nodes}
        for k in nodes:
            for u in nodes:
                duk = dist[(u, k)]
                if duk == INF:
                    continue
                for v in nodes:
                    if duk + dist[(k, v)] < dist[(u, v)]:
                        dist[(u, v)] = duk + dist[(k, v)]
        changed = False
        for g in groups:  # greatest − y ≤ max over members of (member − y)
            for y in nodes:
                via_members = max(dist[(y, frozenset([m]))] for m in g)
                if via_members < edges.get((y, g), INF):
                    edges[(y, g)] = via_members
                    changed = True
        if not changed:
            break
    singles = [frozenset([i]) for i in aliases.values()]
    worst = max((dist[(y, x)] for x in singles for y in singles), default=0.0)
    return None if worst == INF else int(max(worst, 0))


def _selects(node: exp.Expression) -> list[exp.Expression]:
    """The SELECTs of a UNION ALL chain, left to right (iterative: a chain may be long)."""
    out: list[exp.Expression] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, exp.Union):
            if item.args.get("distinct"):
                raise _Reject("UNION removes duplicates; this language has UNION ALL only", item)
            _only(item, {"this", "expression", "distinct"})
            stack.extend([item.expression, item.this])
        elif isinstance(item, (exp.Intersect, exp.Except)):
            raise _Reject(f"{item.key.upper()} is not part of this language", item)
        else:
            out.append(item)
    return out


# ------------------------------------------------------------------ evaluation


class Evaluator(Untimed):
    def __init__(self, branches: list[_Branch]) -> None:
        self.branches = branches
        # Per branch and alias: the stored events that pass the alias's own checks.
        self.pools: list[list[list[Event]]] = [[[] for _ in b.names] for b in branches]
        self.newest: int | None = None
        """The latest event time seen: the watermark (no lateness) that retention runs on."""
        self._work = Work()

    def push(self, event: Event) -> list[Detection]:
        self._refuse_late(event)
        self._work.start()
        self.newest = event.time if self.newest is None else max(self.newest, event.time)
        out: list[Detection] = []
        for b, branch in enumerate(self.branches):
            pools = self.pools[b]
            fits = [self._fits(branch, i, event) for i in range(len(branch.names))]
            for first in range(len(branch.names)):
                if not fits[first] or any(not pools[i] for i in range(first)):
                    continue  # (an earlier alias without stored events: no row)
                # Rows whose first use of the new event is at ``first``: earlier aliases come
                # from stored events only, later ones from stored events or the new one.
                candidates: list[tuple[list[Event], Event | None]] = [
                    (pools[i], None) if i < first else ([], event) if i == first else
                    (pools[i], event if fits[i] else None)
                    for i in range(len(branch.names))]
                for row in _rows(branch, candidates, self._work):
                    constituents = tuple(row[p] for p in branch.projection if p is not None)
                    events = tuple(e for e in constituents if e is not None)
                    text = "(" + ", ".join(e.id for e in events) + ")"
                    out.append(Detection(max(e.time for e in events), events, text))
            for i in range(len(branch.names)):
                if fits[i] and len(branch.names) > 1:  # (a single alias never reads its pool)
                    pools[i].append(event)
            if branch.horizon is not None:
                limit = self.newest - branch.horizon
                for pool in pools:  # in time order: later events are never older (no lateness)
                    expired = 0
                    while expired < len(pool) and pool[expired].time < limit:
                        expired += 1
                    del pool[:expired]
        self._work.kept(self.stored())
        return out

    def _refuse_late(self, event: Event) -> None:
        """An event older than the newest one may need partners a bounded join has released
        already (those older than newest − horizon): rather than answer without them, refuse it.
        Only a join of two or more aliases releases anything; a single alias needs no partner."""
        if self.newest is None or event.time >= self.newest:
            return
        for branch in self.branches:
            if branch.horizon is not None and len(branch.names) > 1 and any(
                    self._fits(branch, i, event) for i in range(len(branch.names))):
                raise EventRejected(
                    "late", f"event {event.id!r} at {event.time} µs arrived after one at "
                    f"{self.newest} µs; this join keeps events only {branch.horizon} µs behind "
                    "the newest, so it takes events in time order")

    def stored(self) -> int:
        return sum(len(pool) for pools in self.pools for pool in pools)

    @staticmethod
    def _fits(branch: _Branch, i: int, event: Event) -> bool:
        stream = branch.streams[i]
        return stream is None or event.type == stream


def _rows(branch: _Branch, candidates: list[tuple[list[Event], Event | None]],
          work: Work) -> list[Row]:
    """The rows of the join over ``candidates`` (per alias: stored events, then the new one
    if it may stand there), each alias bound in turn and its checks applied as soon as it is
    bound; every check of every partial row tried is paid for (a join of many aliases whose
    checks fail late could otherwise try a product of its pools)."""
    out: list[Row] = []
    row: Row = [None] * len(candidates)

    def bind(i: int) -> None:
        if i == len(candidates):
            work.spend(len(row))
            out.append(list(row))
            return
        pool, extra = candidates[i]
        checks = branch.checks[i]
        work.spend((len(pool) + (extra is not None)) * (1 + len(checks)))
        for e in pool if extra is None else chain(pool, (extra,)):
            row[i] = e
            if all(check(row) is True for check in checks):
                bind(i + 1)
        row[i] = None

    bind(0)
    return out


@dataclass(frozen=True)
class SqlQuery:
    text: str
    branches: tuple[_Branch, ...]

    def evaluator(self) -> Evaluator:
        return Evaluator(list(self.branches))


class SqlLanguage:
    name = "sql"
    group = "cg3"
    capability: Capability = CG3

    def parse(self, text: str) -> SqlQuery:
        check_text(self.name, text, _SQL)
        tree = _parse_sql(self.name, text)
        deep = too_deep(tree, lambda node: list(node.iter_expressions()), chained=_chained)
        if deep is not None:
            raise depth_error(self.name, text, *_where(deep, text))
        try:
            branches = tuple(_branch(s) for s in _selects(tree))
        except _Reject as exc:
            line, column = _where(exc.node, text)
            raise NativeQueryError(self.name, str(exc), line, column, text) from None
        return SqlQuery(text, branches)


def _parse_sql(language: str, text: str) -> exp.Expression:
    """sqlglot's tree of the query; its errors as query errors with a position."""
    try:
        dialect = Dialect.get_or_raise(None)  # (what sqlglot.parse_one reads with)
        tokens = dialect.tokenize(text)  # once: the check and the parse read the same tokens
        _every_join_has_on(language, text, tokens)
        tree = _sqlglot_tree(language, text, dialect, tokens)
    except ParseError as exc:
        err = exc.errors[0] if exc.errors else {}
        line = int(err.get("line") or 1)
        start = err.get("start")
        column = position(text, start)[1] if isinstance(start, int) else int(err.get("col") or 1)
        message = re.sub(r"<Token token_type: TokenType\.(\w+), text: (.*?), line.*?>",
                         lambda m: "end of query" if m.group(1) == "SENTINEL"
                         else repr(m.group(2)), str(err.get("description") or exc))
        message = re.sub(r"\x1b\[[0-9;]*m", "", message)  # sqlglot underlines with ANSI codes
        if message.startswith("No expression was parsed"):
            message = "the query is empty; expected SELECT …"
        if "end of query" in message:
            line, column = position(text, len(text.rstrip()))
        raise NativeQueryError(language, message, line, column, text) from None
    except RecursionError:
        # Brackets are bounded before parsing; a chain of prefix operators (NOT NOT …) is not,
        # and sqlglot descends once per operator.
        raise NativeQueryError(language, "the query nests too deeply for the SQL parser (a "
                               "chain of NOT or of other prefix operators?)", 1, 1, text) from None
    except SqlglotError as exc:
        raise NativeQueryError(language, f"cannot read the query: {exc}", 1, 1, text) from None
    if not isinstance(tree, exp.Expression):
        raise NativeQueryError(language, "the query is empty; expected SELECT …", 1, 1, text)
    return tree


def _sqlglot_tree(language: str, text: str, dialect: Dialect, tokens: list[Token]
                  ) -> exp.Expr | None:
    """What ``sqlglot.parse_one`` does after tokenizing (``tokens``: ``text``'s), its own
    slips on some malformed text (a ``{…}`` with no key, ``AT`` after a parameter — found by
    fuzzing) refused like its ParseErrors. Only sqlglot's call is covered: such an error in
    this module's own code stays a bug, not a refusal."""
    try:
        result = dialect.parser().parse(tokens, text)
        if not result or result[0] is None:
            raise ParseError(f"No expression was parsed from '{text}'")
        return exp.Block(expressions=result) if len(result) > 1 else result[0]
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise NativeQueryError(language, "cannot read the query: the SQL parser failed on it "
                               f"({type(exc).__name__}: {exc}); expected SELECT … FROM … "
                               "in this language's subset", 1, 1, text) from exc


def _every_join_has_on(language: str, text: str, tokens: list[Token]) -> None:
    """Refuse a JOIN whose ON does not come before the next JOIN (``tokens``: ``text``'s).
    This language has no nested joins, and sqlglot tries them on each such JOIN and
    backtracks: its time doubles per JOIN (a 600-byte query took minutes). Tokenizing is
    linear."""
    pending = None
    for token in tokens:
        if token.token_type in (TokenType.JOIN, TokenType.STRAIGHT_JOIN):
            if pending is not None:
                break
            pending = token
        elif token.token_type in (TokenType.ON, TokenType.USING):
            pending = None
    else:
        return
    raise NativeQueryError(language, "JOIN needs ON before the next JOIN: JOIN stream AS alias "
                           "ON condition", *position(text, pending.start), text)


def _span(node: exp.Expression) -> tuple[int, int] | None:
    """First and last character index of the tokens under ``node`` (sqlglot keeps positions on
    identifiers, literals and function names)."""
    starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
    ends = [n.meta["end"] for n in node.walk() if "end" in n.meta]
    return (min(starts), max(ends)) if starts and ends else None


def _where(node: exp.Expression | None, text: str) -> tuple[int, int]:
    """The position of a rejected construct: its first token, or for a set operation its
    keyword (after the left operand)."""
    if node is None:
        return (1, 1)
    if isinstance(node, (exp.Union, exp.Intersect, exp.Except)):
        left = _span(node.this)
        index = text.upper().find(node.key.upper(), left[1] + 1 if left else 0)
        return position(text, index) if index >= 0 else (1, 1)
    span = _span(node)
    if span is None:
        return (1, 1)
    if isinstance(node, exp.Join):  # the join's keywords, before its stream
        index = text.upper().rfind("JOIN", 0, span[0])
        if index >= 0:
            # The words before JOIN, read backwards: matched on the reversed text from its
            # start, once. (A search for them before the end of the text tried every position
            # and, at each, the run of words after it: quadratic in a run of such words.)
            words = _JOIN_WORDS_REVERSED.match(text[index - 1::-1].upper() if index else "")
            return position(text, index - (words.end() if words else 0))
    return position(text, span[0])


_JOIN_WORDS_REVERSED = re.compile(
    r"(?:\s+(?:LARUTAN|TFEL|THGIR|LLUF|RETUO|RENNI|SSORC|IMES|ITNA)\b)*+")
"""NATURAL, LEFT, RIGHT, FULL, OUTER, INNER, CROSS, SEMI and ANTI, each after blanks, spelt
backwards: the join keywords right before a JOIN, read from it towards the start."""
