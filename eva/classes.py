"""Event classes: predicates compiled to Python closures, and time-class tick grids.

Every distinct predicate is compiled once; :class:`ClassIndex` tests an event only against the
predicates that can match its ``type`` (an index on the ``type == …`` / ``type in […]``
conjunct), so the cost of matching does not grow with profiles that watch other types.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

from eva import ast
from eva.events import Event, format_time, parse_time

Matcher = Callable[[Event], bool]

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def same(a: object, b: object) -> bool:
    """Equality of JSON values as a class predicate means it (the native dialects too)."""
    # JSON has one number type: 1 == 1.0, but True is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _compare(pred: ast.Compare) -> Matcher:
    path, op, value = pred.path, pred.op, pred.value
    if op == "==":
        return lambda e: same(e.field(path), value)
    if op == "!=":
        return lambda e: not same(e.field(path), value)
    if op == "in":
        options = tuple(value) if isinstance(value, tuple) else (value,)
        return lambda e: any(same(e.field(path), v) for v in options)
    compare = _ORDER[op]

    def ordered(e: Event) -> bool:
        got = e.field(path)
        # Ordering applies between numbers, or between strings; anything else does not match.
        if isinstance(got, bool) or isinstance(value, bool):
            return False
        if isinstance(got, (int, float)) and isinstance(value, (int, float)):
            return compare(got, value)
        if isinstance(got, str) and isinstance(value, str):
            return compare(got, value)
        return False

    return ordered


def compile_predicate(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> Matcher:
    if isinstance(pred, ast.Compare):
        return _compare(pred)
    if isinstance(pred, ast.ClassRef):
        body = classes[pred.name].body
        assert not isinstance(body, ast.Every)
        return compile_predicate(body, classes)
    if isinstance(pred, ast.Not):
        inner = compile_predicate(pred.operand, classes)
        return lambda e: not inner(e)
    left = compile_predicate(pred.left, classes)
    right = compile_predicate(pred.right, classes)
    if isinstance(pred, ast.And):
        return lambda e: left(e) and right(e)
    return lambda e: left(e) or right(e)


def required_types(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> frozenset[str] | None:
    """The ``type`` values an event must have to match, or None when any type may match."""
    return required_values(pred, classes, "type")


def required_values(pred: ast.Predicate, classes: dict[str, ast.ClassDef],
                    path: str) -> frozenset[str] | None:
    """The string values the attribute at ``path`` must have for an event to match (``type``,
    ``source``), or None when any value may match."""
    if isinstance(pred, ast.Compare) and pred.path == path:
        if pred.op == "==" and isinstance(pred.value, str):
            return frozenset([pred.value])
        if pred.op == "in" and isinstance(pred.value, tuple):
            return frozenset(v for v in pred.value if isinstance(v, str))
        return None
    if isinstance(pred, ast.ClassRef):
        body = classes[pred.name].body
        return None if isinstance(body, ast.Every) else required_values(body, classes, path)
    if isinstance(pred, ast.And):
        a = required_values(pred.left, classes, path)
        b = required_values(pred.right, classes, path)
        if a is None:
            return b
        return a if b is None else a & b
    if isinstance(pred, ast.Or):
        a = required_values(pred.left, classes, path)
        b = required_values(pred.right, classes, path)
        return None if a is None or b is None else a | b
    return None


def type_only(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> frozenset[str] | None:
    """The set of types when the predicate tests nothing but ``type`` (== / in / or), else None."""
    if isinstance(pred, ast.ClassRef):
        body = classes[pred.name].body
        return None if isinstance(body, ast.Every) else type_only(body, classes)
    if isinstance(pred, ast.Compare) and pred.path == "type":
        if pred.op == "==" and isinstance(pred.value, str):
            return frozenset([pred.value])
        if pred.op == "in" and isinstance(pred.value, tuple) and all(
                isinstance(v, str) for v in pred.value):
            return frozenset(pred.value)
        return None
    if isinstance(pred, ast.Or):
        a, b = type_only(pred.left, classes), type_only(pred.right, classes)
        return None if a is None or b is None else a | b
    return None



class ClassIndex:
    """Shared primitive-class matching for any number of documents' classes.

    Each structurally distinct predicate gets one integer id, so identical classes in many
    profiles are one entry; :meth:`match` returns the ids an event belongs to. Per ``type``,
    the index keeps the candidate predicates; a predicate that *is* a type test is decided by
    the index itself and never evaluated.
    """

    def __init__(self) -> None:
        self._ids: dict[ast.Predicate, int] = {}
        self._matchers: list[Matcher] = []
        self._exact: list[bool] = []
        self._by_type: dict[str, list[int]] = {}
        self._any_type: list[int] = []
        self._plans: dict[str, tuple[frozenset[int], tuple[tuple[int, Matcher], ...]]] = {}
        self.tests = 0  # predicate decisions made (for tests and benchmarks)

    def add(self, pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> int:
        """Register a predicate; returns the id under which :meth:`match` reports it."""
        key = resolve(pred, classes)
        found = self._ids.get(key)
        if found is not None:
            return found
        ident = len(self._matchers)
        self._ids[key] = ident
        self._matchers.append(compile_predicate(key, {}))
        types = required_types(key, {})
        self._exact.append(types is not None and _is_type_test(key))
        if types is None:
            self._any_type.append(ident)
        else:
            for t in types:
                self._by_type.setdefault(t, []).append(ident)
        self._plans.clear()
        return ident

    def predicates(self) -> dict[ast.Predicate, int]:
        """Every registered (resolved) predicate and its id."""
        return dict(self._ids)

    def plan(self, type_: str) -> tuple[frozenset[int], tuple[tuple[int, Matcher], ...]]:
        """(ids implied by the type alone, (id, matcher) pairs still to evaluate)."""
        found = self._plans.get(type_)
        if found is None:
            typed = self._by_type.get(type_, [])
            implied = frozenset(i for i in typed if self._exact[i])
            residual = tuple((i, self._matchers[i]) for i in [*typed, *self._any_type]
                             if not self._exact[i])
            found = (implied, residual)
            self._plans[type_] = found
        return found

    def match(self, event: Event) -> frozenset[int]:
        implied, residual = self.plan(event.type)
        self.tests += len(implied) + len(residual)
        if not residual:
            return implied
        hits = set(implied)
        for ident, matcher in residual:
            if matcher(event):
                hits.add(ident)
        return frozenset(hits)


def _is_type_test(pred: ast.Predicate) -> bool:
    return isinstance(pred, ast.Compare) and pred.path == "type" and (
        (pred.op == "==" and isinstance(pred.value, str)) or (
            pred.op == "in" and isinstance(pred.value, tuple)
            and all(isinstance(v, str) for v in pred.value)))


def resolve(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> ast.Predicate:
    """Inline class references: structurally equal classes share one key across documents, and
    a predicate can leave its document (a native dialect knows no EVA class names)."""
    if isinstance(pred, ast.ClassRef):
        body = classes[pred.name].body
        assert not isinstance(body, ast.Every)
        return resolve(body, classes)
    if isinstance(pred, ast.Not):
        return ast.Not(resolve(pred.operand, classes))
    if isinstance(pred, ast.And):
        return ast.And(resolve(pred.left, classes), resolve(pred.right, classes))
    if isinstance(pred, ast.Or):
        return ast.Or(resolve(pred.left, classes), resolve(pred.right, classes))
    return pred


# ------------------------------------------------------------------ time classes


def grid_origin(every: ast.Every) -> tuple[int, int | None]:
    """(a time on the tick grid, the first allowed tick or None) for a time class."""
    anchor = every.anchor
    if anchor is None:
        return 0, None
    if ":" in anchor and "T" not in anchor and "-" not in anchor:
        parts = [int(p) for p in anchor.split(":")]
        hours, minutes, seconds = [*parts, 0, 0][:3]
        return ((hours * 60 + minutes) * 60 + seconds) * 1_000_000, None
    start = parse_time(anchor)
    return start, start


def next_tick(every: ast.Every, after: int) -> int:
    """The first tick strictly after ``after``."""
    origin, first = grid_origin(every)
    t = origin + ((after - origin) // every.period + 1) * every.period
    return t if first is None or t >= first else first


def ticks_between(every: ast.Every, after: int, until: int) -> Iterable[int]:
    """Tick times t of a time class with after < t ≤ until, in order."""
    t = next_tick(every, after)
    while t <= until:
        yield t
        t += every.period


def label(micros: int) -> str:
    return format_time(micros)


__all__ = ["ClassIndex", "compile_predicate", "label", "next_tick", "ticks_between"]
