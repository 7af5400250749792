"""CG-3: streaming-SQL interval joins in the style of Flink SQL and ksqlDB.

Language (docs/backends.md §CG-3) — a restricted SELECT, parsed and printed with sqlglot::

    query  := select (UNION ALL select)*
    select := SELECT alias.id | NULL, …  FROM stream AS alias
              (JOIN stream AS alias ON condition)*  [WHERE condition]
    stream := events (every event) | "type" (the events of that CloudEvents type)

Columns are CloudEvents attributes of an alias (``a.id``, ``a.type``, ``a.source``, ``a.subject``,
``a.time`` in µs) and data fields via ``JSON_VALUE(a.data, '$.x.y')`` (the JSON value, typed).
Conditions: comparisons, ``IN``, ``IS [NOT] NULL``, ``AND``/``OR``/``NOT`` with SQL's
three-valued logic, ``+``/``-`` with ``INTERVAL 'n' UNIT`` (WEEK … MICROSECOND), ``ABS``,
``GREATEST``, ``TRUE``/``FALSE``.

Semantics: an inner join over the stream — every combination of events that satisfies the
conditions (all pairs; an event may be used in any number of rows). A row is emitted when its
last event arrives; its constituents are the projected ids in order, its time the latest of
theirs. ``UNION ALL`` concatenates (no duplicate elimination). The service keeps every event
that can still join: the time conditions, read as difference constraints, bound how far apart
the events of one row can be; older events are released (events are expected in time order,
as a watermark with no lateness). Without such a bound (a timeless join) every event is kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from adapters.filters import TICK_TYPE
from adapters.native import Detection, NativeQueryError, Unrenderable
from mediator.eva import ast
from mediator.eva.classes import resolve, type_only
from mediator.eva.events import Event
from transforms.capability import CG3, Capability

_UNITS = {"WEEK": 604_800_000_000, "DAY": 86_400_000_000, "HOUR": 3_600_000_000,
          "MINUTE": 60_000_000, "SECOND": 1_000_000, "MILLISECOND": 1_000, "MICROSECOND": 1}

Row = list[Event | None]
Value = Callable[[Row], Any]


class _Reject(Exception):
    def __init__(self, message: str, node: exp.Expression | None = None) -> None:
        super().__init__(message)
        self.node = node


# ------------------------------------------------------------------ expression compiler


def _sql_same(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _sql_order(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return None
    numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
    if not numbers and not (isinstance(a, str) and isinstance(b, str)):
        return None
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


_COMPARE: dict[type[exp.Expression], str] = {exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}


class _Compiler:
    def __init__(self, aliases: dict[str, int]) -> None:
        self.aliases = aliases
        self.used: set[int] = set()

    def alias(self, column: exp.Column) -> int:
        name = column.table
        if name not in self.aliases:
            raise _Reject(f"unknown alias {name!r}" if name else
                          f"column {column.name!r} needs an alias (a.{column.name})", column)
        index = self.aliases[name]
        self.used.add(index)
        return index

    def value(self, node: exp.Expression) -> Value:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.Column):
            index = self.alias(node)
            attr = node.name
            return lambda row: _attribute(row[index], attr)
        if isinstance(node, exp.Literal):
            literal: Any = node.this if node.is_string else json.loads(node.this)
            return lambda row: literal
        if isinstance(node, exp.Boolean):
            truth = bool(node.this)
            return lambda row: truth
        if isinstance(node, exp.Null):
            return lambda row: None
        if isinstance(node, exp.Interval):
            unit = str(node.unit.name if node.unit else "").upper().rstrip("S")
            if unit not in _UNITS:
                raise _Reject(f"unknown interval unit {unit!r}", node)
            try:
                amount = int(node.this.name)
            except ValueError:
                raise _Reject("an interval needs an integer amount", node) from None
            micros = amount * _UNITS[unit]
            return lambda row: micros
        if isinstance(node, exp.Anonymous) and str(node.this).upper() == "JSON_VALUE":
            args = node.expressions
            if len(args) != 2 or not isinstance(args[1], exp.Literal) or not args[1].is_string \
                    or not isinstance(args[0], exp.Column) or args[0].name != "data":
                raise _Reject("JSON_VALUE takes (alias.data, '$.path')", node)
            index = self.alias(args[0])
            path = args[1].this
            if not re.fullmatch(r"\$(\.[A-Za-z0-9_\-]+)+", path):
                raise _Reject(f"unsupported JSON path {path!r}", node)
            keys = path.split(".")[1:]
            return lambda row: _json_path(row[index], keys)
        if isinstance(node, (exp.Add, exp.Sub)):
            left, right = self.value(node.this), self.value(node.expression)
            sign = 1 if isinstance(node, exp.Add) else -1
            return lambda row: _arith(left(row), right(row), sign)
        if isinstance(node, exp.Abs):
            inner = self.value(node.this)
            return lambda row: None if (v := inner(row)) is None else abs(v)
        if isinstance(node, exp.Greatest):
            parts = [self.value(node.this), *(self.value(e) for e in node.expressions)]
            return lambda row: _greatest([p(row) for p in parts])
        if isinstance(node, exp.Neg):
            inner = self.value(node.this)
            return lambda row: None if (v := inner(row)) is None else -v
        return self.condition(node)

    def condition(self, node: exp.Expression) -> Value:
        if isinstance(node, exp.Paren):
            return self.condition(node.this)
        if isinstance(node, (exp.And, exp.Or)):
            left, right = self.condition(node.this), self.condition(node.expression)
            if isinstance(node, exp.And):
                return lambda row: _and3(left(row), right(row))
            return lambda row: _or3(left(row), right(row))
        if isinstance(node, exp.Not):
            inner = self.condition(node.this)
            return lambda row: None if (v := inner(row)) is None else not v
        if isinstance(node, (exp.EQ, exp.NEQ)):
            left, right = self.value(node.this), self.value(node.expression)
            if isinstance(node, exp.EQ):
                return lambda row: _sql_same(left(row), right(row))
            return lambda row: None if (v := _sql_same(left(row), right(row))) is None else not v
        if type(node) in _COMPARE:
            op = _COMPARE[type(node)]
            left, right = self.value(node.this), self.value(node.expression)
            return lambda row: _sql_order(op, left(row), right(row))
        if isinstance(node, exp.In):
            subject = self.value(node.this)
            options = [self.value(e) for e in node.expressions]
            if not options:
                raise _Reject("IN needs a list of values", node)
            return lambda row: _in3(subject(row), [o(row) for o in options])
        if isinstance(node, exp.Is):
            subject = self.value(node.this)
            if not isinstance(node.expression, exp.Null):
                raise _Reject("only IS [NOT] NULL is supported", node)
            return lambda row: subject(row) is None
        if isinstance(node, (exp.Boolean, exp.Column, exp.Anonymous)):
            inner = self.value(node)
            return lambda row: inner(row)
        raise _Reject(f"unsupported expression {node.sql()!r}", node)


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
    return value


def _arith(a: Any, b: Any, sign: int) -> Any:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    return a + sign * b


def _greatest(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(numbers) if len(numbers) == len(values) else None


def _and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or3(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _in3(subject: Any, options: list[Any]) -> bool | None:
    results = [_sql_same(subject, o) for o in options]
    if any(r is True for r in results):
        return True
    return None if any(r is None for r in results) else False


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


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.And):
        return _conjuncts(node.this)
    return [node]


def _branch(select: exp.Select) -> _Branch:
    if not isinstance(select, exp.Select):
        raise _Reject("each part of the query must be a SELECT", select)
    for clause in ("group", "having", "order", "limit", "distinct", "qualify", "with"):
        if select.args.get(clause):
            raise _Reject(f"{clause.upper()} is not part of this language", select)
    source = select.args.get("from_") or select.args.get("from")
    if source is None:
        raise _Reject("SELECT needs FROM", select)
    tables = [source.this] + [j.this for j in select.args.get("joins") or []]
    names: list[str] = []
    streams: list[str | None] = []
    for table in tables:
        if not isinstance(table, exp.Table):
            raise _Reject("FROM and JOIN take a stream name, not a subquery", table)
        alias = table.alias or table.name
        if alias in names:
            raise _Reject(f"alias {alias!r} is used twice", table)
        names.append(alias)
        streams.append(None if table.name == "events" and not table.this.quoted else table.name)
    aliases = {n: i for i, n in enumerate(names)}
    checks: list[list[Value]] = [[] for _ in names]
    conditions: list[exp.Expression] = []
    for join in select.args.get("joins") or []:
        if join.side or (join.kind and join.kind.upper() not in ("INNER",)):
            raise _Reject("only inner joins (all pairs) are supported", join)
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
        elif isinstance(item, exp.Column) and item.name == "id":
            projection.append(_Compiler(aliases).alias(item))
        else:
            raise _Reject("the projection lists alias.id (the constituents) or NULL", item)
    if not any(p is not None for p in projection):
        raise _Reject("the projection names no constituent", select)
    return _Branch(names, streams, checks, projection, _horizon(conditions, aliases))


# ------------------------------------------------------------------ retention


def _time_term(node: exp.Expression, aliases: dict[str, int]) -> frozenset[int] | None:
    """``a.time`` → {a}; ``GREATEST(a.time, b.time, …)`` → {a, b, …}; else None."""
    if isinstance(node, exp.Paren):
        return _time_term(node.this, aliases)
    if isinstance(node, exp.Column) and node.name == "time" and node.table in aliases:
        return frozenset([aliases[node.table]])
    if isinstance(node, exp.Greatest):
        parts = [_time_term(e, aliases) for e in [node.this, *node.expressions]]
        if any(p is None for p in parts):
            return None
        return frozenset().union(*parts)  # type: ignore[arg-type]
    return None


def _offset(node: exp.Expression, aliases: dict[str, int]) -> tuple[frozenset[int], int] | None:
    """A time term plus or minus a constant interval."""
    if isinstance(node, exp.Paren):
        return _offset(node.this, aliases)
    if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.expression, exp.Interval):
        inner = _offset(node.this, aliases)
        amount = _Compiler(aliases).value(node.expression)([])
        if inner is None or not isinstance(amount, int):
            return None
        return inner[0], inner[1] + (amount if isinstance(node, exp.Add) else -amount)
    term = _time_term(node, aliases)
    return None if term is None else (term, 0)


def _horizon(conditions: list[exp.Expression], aliases: dict[str, int]) -> int | None:
    """The largest time distance two events of one row can have, from the conditions read as
    difference constraints (x − y ≤ d) over alias times and GREATEST terms; None if some pair
    is unbounded. What an interval join needs to keep: events older than now − horizon can
    join nothing new (the service assumes events are published in time order)."""
    INF = float("inf")
    edges: dict[tuple[frozenset[int], frozenset[int]], float] = {}

    def bound(x: frozenset[int], y: frozenset[int], d: float) -> None:  # x − y ≤ d
        edges[(y, x)] = min(edges.get((y, x), INF), d)

    for cond in conditions:
        kind = type(cond)
        if kind not in (exp.LT, exp.LTE, exp.GT, exp.GTE, exp.EQ):
            continue
        left, right = _offset(cond.this, aliases), _offset(cond.expression, aliases)
        if left is None or right is None:
            continue
        (lx, a), (rx, b) = left, right  # lx + a  op  rx + b
        if kind in (exp.LT, exp.LTE, exp.EQ):
            bound(lx, rx, b - a)
        if kind in (exp.GT, exp.GTE, exp.EQ):
            bound(rx, lx, a - b)
    nodes = {frozenset([i]) for i in aliases.values()} | {n for pair in edges for n in pair}
    groups = [g for g in nodes if len(g) > 1]
    for g in groups:
        for m in g:
            bound(frozenset([m]), g, 0)  # every member is at most the greatest
    dist: dict[tuple[frozenset[int], frozenset[int]], float] = {}
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
    if isinstance(node, exp.Union):
        if node.args.get("distinct"):
            raise _Reject("UNION removes duplicates; this language has UNION ALL only", node)
        return _selects(node.this) + _selects(node.expression)
    if isinstance(node, (exp.Intersect, exp.Except)):
        raise _Reject(f"{node.key.upper()} is not part of this language", node)
    return [node]


# ------------------------------------------------------------------ evaluation


class Evaluator:
    def __init__(self, branches: list[_Branch]) -> None:
        self.branches = branches
        # Per branch and alias: the stored events that pass the alias's own checks.
        self.pools: list[list[list[Event]]] = [[[] for _ in b.names] for b in branches]

    def push(self, event: Event) -> list[Detection]:
        out: list[Detection] = []
        for b, branch in enumerate(self.branches):
            pools = self.pools[b]
            fits = [self._fits(branch, i, event) for i in range(len(branch.names))]
            for first in range(len(branch.names)):
                if not fits[first]:
                    continue
                # Rows whose first use of the new event is at ``first``: earlier aliases come
                # from stored events only, later ones from stored events or the new one.
                candidates = [
                    pools[i] if i < first else [event] if i == first else
                    pools[i] + ([event] if fits[i] else [])
                    for i in range(len(branch.names))]
                for row in _rows(branch, candidates):
                    constituents = tuple(row[p] for p in branch.projection if p is not None)
                    events = tuple(e for e in constituents if e is not None)
                    text = "(" + ", ".join(e.id for e in events) + ")"
                    out.append(Detection(max(e.time for e in events), events, text))
            for i in range(len(branch.names)):
                if fits[i]:
                    pools[i].append(event)
            if branch.horizon is not None:
                limit = event.time - branch.horizon
                for pool in pools:
                    expired = 0
                    while expired < len(pool) and pool[expired].time < limit:
                        expired += 1
                    del pool[:expired]
        return out

    def stored(self) -> int:
        return sum(len(pool) for pools in self.pools for pool in pools)

    @staticmethod
    def _fits(branch: _Branch, i: int, event: Event) -> bool:
        stream = branch.streams[i]
        return stream is None or event.type == stream

    def advance(self, time: int) -> list[Detection]:
        return []


def _rows(branch: _Branch, candidates: list[list[Event]]) -> list[Row]:
    out: list[Row] = []
    row: Row = [None] * len(candidates)

    def bind(i: int) -> None:
        if i == len(candidates):
            out.append(list(row))
            return
        for e in candidates[i]:
            row[i] = e
            if all(check(row) is True for check in branch.checks[i]):
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


# ------------------------------------------------------------------ the dialect


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return _quote(value)
    raise Unrenderable(f"no SQL literal for {value!r}")


def _column(alias: str, path: str) -> str:
    head, _, rest = path.partition(".")
    if head == "data" and rest:
        return f"JSON_VALUE({alias}.data, {_quote('$.' + rest)})"
    if head == "data":
        raise Unrenderable("a test on the whole data object")
    return f"{alias}.{head}"


def _condition(pred: ast.Predicate, alias: str) -> str | None:
    """The predicate as SQL, widened where SQL's NULL logic differs from EVA's (negative tests
    are dropped — the mediator re-applies the exact class to what comes back). None = TRUE."""
    if isinstance(pred, ast.Compare):
        if pred.op in ("!=",) or pred.value is None or (
                pred.op == "in" and not all(isinstance(v, (str, int, float)) for v in
                                            pred.value)):  # type: ignore[attr-defined]
            return None
        column = _column(alias, pred.path)
        if pred.op == "in":
            assert isinstance(pred.value, tuple)
            return f"{column} IN ({', '.join(_literal(v) for v in pred.value)})"
        op = "=" if pred.op == "==" else pred.op
        return f"{column} {op} {_literal(pred.value)}"
    if isinstance(pred, ast.Not):
        return None
    assert isinstance(pred, (ast.And, ast.Or))
    left, right = _condition(pred.left, alias), _condition(pred.right, alias)
    if isinstance(pred, ast.And):
        if left is None or right is None:
            return left or right
        return f"({left} AND {right})"
    if left is None or right is None:
        return None
    return f"({left} OR {right})"


def _interval(micros: int) -> str:
    for unit, size in _UNITS.items():
        if micros % size == 0:
            return f"INTERVAL '{micros // size}' {unit}"
    raise AssertionError("MICROSECOND divides every integer")


@dataclass(frozen=True)
class _Part:
    """An EVA subexpression as one flat join: streams and filters per alias, conditions that
    mention aliases as «k», and its occurrence time as SQL over «k»."""

    leaves: tuple[tuple[str | None, str | None], ...]
    conditions: tuple[str, ...]
    time: str


def _shift(text: str, by: int) -> str:
    return re.sub(r"«(\d+)»", lambda m: f"«{int(m.group(1)) + by}»", text)


def _parts(expr: ast.Expr, doc: ast.Document) -> list[_Part]:
    classes = doc.class_map()
    if isinstance(expr, ast.Prim):
        body = classes[expr.name].body
        if isinstance(body, ast.Every):
            return [_Part(((TICK_TYPE + expr.name, None),), (), "«0».time")]
        types = type_only(body, classes)
        if types is not None and len(types) == 1:
            return [_Part(((next(iter(types)), None),), (), "«0».time")]
        return [_Part(((None, _condition(resolve(body, classes), "«0»")),), (), "«0».time")]
    if isinstance(expr, ast.Disjunction):
        return _parts(expr.left.expr, doc) + _parts(expr.right.expr, doc)
    if not isinstance(expr, (ast.Conjunction, ast.Sequence)):
        raise Unrenderable(f"SQL interval joins cannot state {type(expr).__name__.lower()}")
    out = []
    for left in _parts(expr.left.expr, doc):
        for right0 in _parts(expr.right.expr, doc):
            by = len(left.leaves)
            right = _Part(tuple((s, None if f is None else _shift(f, by)) for s, f in right0.leaves),
                          tuple(_shift(c, by) for c in right0.conditions), _shift(right0.time, by))
            lt, rt = left.time, right.time
            conditions = [*left.conditions, *right.conditions]
            if isinstance(expr, ast.Sequence):
                conditions.append(f"{rt} > {lt}")
                if expr.span is not None:
                    conditions.append(f"{rt} <= {lt} + {_interval(expr.span)}")
                time = rt
            else:
                if expr.span is not None:
                    conditions.append(f"{rt} >= {lt} - {_interval(expr.span)}")
                    conditions.append(f"{rt} <= {lt} + {_interval(expr.span)}")
                time = f"GREATEST({lt}, {rt})"
            out.append(_Part(left.leaves + right.leaves, tuple(conditions), time))
    return out


def _select(part: _Part, width: int) -> str:
    names = [f"a{i + 1}" for i in range(len(part.leaves))]

    def named(text: str) -> str:
        return re.sub(r"«(\d+)»", lambda m: names[int(m.group(1))], text)

    def stream(s: str | None) -> str:
        return "events" if s is None else '"' + s.replace('"', '""') + '"'

    columns = [f"{n}.id" for n in names] + ["NULL"] * (width - len(names))
    text = f"SELECT {', '.join(columns)} FROM {stream(part.leaves[0][0])} AS {names[0]}"
    by_level: list[list[str]] = [[] for _ in names]
    for cond in part.conditions:
        level = max(int(k) for k in re.findall(r"«(\d+)»", cond))
        by_level[level].append(named(cond))
    for i in range(1, len(names)):
        on = " AND ".join(by_level[i]) or "TRUE"
        text += f" JOIN {stream(part.leaves[i][0])} AS {names[i]} ON {on}"
    where = [named(f) for _, f in part.leaves if f is not None] + by_level[0]
    if where:
        text += " WHERE " + " AND ".join(where)
    return text


class SqlLanguage:
    name = "sql"
    group = "cg3"
    capability: Capability = CG3

    def parse(self, text: str) -> SqlQuery:
        try:
            tree = sqlglot.parse_one(text)
        except ParseError as exc:
            err = exc.errors[0] if exc.errors else {}
            line = int(err.get("line") or 1)
            start = err.get("start")
            column = (start - (text.rfind("\n", 0, start) + 1) + 1) if isinstance(start, int) \
                else int(err.get("col") or 1)
            message = re.sub(r"<Token token_type: TokenType\.(\w+), text: (.*?), line.*?>",
                             lambda m: "end of query" if m.group(1) == "SENTINEL"
                             else repr(m.group(2)), str(err.get("description") or exc))
            if "end of query" in message:
                line, column = text.count("\n") + 1, len(text.splitlines()[-1] if text else "") + 1
            raise NativeQueryError(self.name, message, line, column, text) from None
        try:
            branches = tuple(_branch(s) for s in _selects(tree))  # type: ignore[arg-type]
        except _Reject as exc:
            line, column = _where(exc.node, text)
            raise NativeQueryError(self.name, str(exc), line, column, text) from None
        return SqlQuery(text, branches)

    def render(self, expr: ast.Expr, doc: ast.Document) -> str:
        parts = _parts(expr, doc)
        width = max(len(p.leaves) for p in parts)
        text = " UNION ALL ".join(_select(p, width) for p in parts)
        return sqlglot.parse_one(text).sql()  # printed by sqlglot: normalised, valid SQL


def _where(node: exp.Expression | None, text: str) -> tuple[int, int]:
    """Best-effort position of a rejected construct: the first occurrence of its SQL."""
    if node is None:
        return (1, 1)
    needle = node.key.upper() if isinstance(node, exp.Union) else node.sql().split(" ")[0]
    index = text.upper().find(needle.upper())
    if index < 0:
        return (1, 1)
    line = text.count("\n", 0, index) + 1
    return (line, index - (text.rfind("\n", 0, index) + 1) + 1)
