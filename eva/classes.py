"""Event classes: predicates compiled to Python closures, the predicate index, and time-class
tick grids.

Every distinct predicate is registered once; :class:`ClassIndex` considers for an event only
the predicates that can match its ``type`` (an index on the ``type == …`` / ``type in […]``
conjunct), so the cost of matching does not grow with profiles that watch other types, and
decides those by look-up — equality by hash, ranges by bisect, conjunctions counted — so it
hardly grows with thousands of subscribers on the same types either (docs/semantics.md §14).
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import Any

from eva import ast
from eva.events import Event, field_path, format_time, parse_time

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


INDEXED = True
"""Whether a :class:`ClassIndex` made from now on uses its predicate index (below); False: every
candidate predicate of an event's type is evaluated one by one, as before the index. A switch
for tests and benchmarks, which show that it changes no answer."""

_TRUE = object()
_FALSE = object()
"""The equality tables' keys for true and false: in a dict, True would be the key 1 is
(``True == 1``), while a class predicate tells them apart (:func:`same`)."""

_LOW = 0  # (>, >=) on numbers, by lower bound
_HIGH = 1  # (<, <=) on numbers, by upper bound
_SLOT = {">=": (_LOW, 0), ">": (_LOW, 2), "<": (_HIGH, 0), "<=": (_HIGH, 2)}
"""A range test's array (+2 for strings) and its flag in the entry ``(bound, flag, id)``: at a
bound equal to the event's value the probe ``(value, 1)`` sorts after ``>=`` and ``<`` (flag
0) and before ``>`` and ``<=`` (flag 2), so one bisect per array cuts the hits off."""

Bound = tuple[Any, int, int]


_TYPESETS: dict[frozenset[str], frozenset[str]] = {}


def _interned(types: frozenset[str]) -> frozenset[str]:
    """One object per distinct set of types (10⁵ predicates on type A keep one {"A"})."""
    return _TYPESETS.setdefault(types, types)


def _key(value: Any) -> tuple[bool, object]:
    """(whether it can be an equality table's key, the key) for a predicate's value: a
    string, number, null or bool (not NaN: it equals nothing, and hashes by identity)."""
    kind = type(value)
    if kind is bool:
        return True, _TRUE if value else _FALSE
    if kind is str or kind is int or value is None:
        return True, value
    if kind is float:
        return value == value, value
    return False, None


class _Parts:
    """A predicate's conjuncts sorted for the index: those on ``type`` alone (decided once per
    type), equality/``in`` tests by hash, range tests by bisect, and the rest (``residual``,
    evaluated)."""

    __slots__ = ("equal", "needed", "ranges", "residual", "statics", "types")

    def __init__(self, pred: ast.Predicate) -> None:
        statics: list[ast.Predicate] = []
        equal: list[tuple[str, tuple[object, ...]]] = []
        ranges: list[tuple[str, int, Bound]] = []
        rest: list[ast.Predicate] = []
        for part in _conjuncts(pred):
            if _on_type(part):
                statics.append(part)
                continue
            test = _equality(part)
            bound = _range(part) if test is None else None
            if test is not None:
                equal.append(test)
            elif bound is not None:
                ranges.append(bound)
            else:
                rest.append(part)
        # Tuples: a registration leaves few objects for the collector to go over.
        self.statics = tuple(statics)
        self.equal = tuple(equal)
        self.ranges = tuple(ranges)
        self.needed = len(equal) + len(ranges)
        # The types the conjuncts on ``type`` admit, when they are plain type tests (the
        # usual case: no evaluation to decide them per type).
        self.types: frozenset[str] | None = None
        for part in statics:
            values = required_types(part, {}) if _is_type_test(part) else None
            if values is None:
                self.types = None
                break
            self.types = _interned(values if self.types is None else self.types & values)
        self.residual: Matcher | None = None
        if rest:
            whole = rest[0]
            for part in rest[1:]:
                whole = ast.And(whole, part)
            self.residual = compile_predicate(whole, {})


def _equality(part: ast.Predicate) -> tuple[str, tuple[object, ...]] | None:
    """(path, table keys) of an ``==`` or ``in`` test the tables can answer for."""
    if not isinstance(part, ast.Compare) or part.op not in ("==", "in"):
        return None
    value = part.value
    options = value if part.op == "in" and isinstance(value, tuple) else (value,)
    keys: dict[object, None] = {}  # 1 and 1.0 are one key: one hit, counted once
    for option in options:
        ok, key = _key(option)
        if not ok:
            return None
        keys[key] = None
    return part.path, tuple(keys)


def _range(part: ast.Predicate) -> tuple[str, int, Bound] | None:
    """(path, array, entry with id 0) of a range test the bound arrays can answer for."""
    if not isinstance(part, ast.Compare) or part.op not in _SLOT:
        return None
    array, flag = _SLOT[part.op]
    value = part.value
    kind = type(value)
    if kind is str:
        return part.path, array + 2, (value, flag, 0)
    if kind is int or (kind is float and value == value):
        return part.path, array, (value, flag, 0)
    return None


def _conjuncts(pred: ast.Predicate) -> list[ast.Predicate]:
    out: list[ast.Predicate] = []
    stack = [pred]
    while stack:
        part = stack.pop()
        if isinstance(part, ast.And):
            stack.append(part.right)
            stack.append(part.left)
        else:
            out.append(part)
    return out


def _on_type(pred: ast.Predicate) -> bool:
    """Whether a (resolved) predicate reads ``type`` and nothing else."""
    if isinstance(pred, ast.Compare):
        return pred.path == "type"
    if isinstance(pred, ast.Not):
        return _on_type(pred.operand)
    if isinstance(pred, (ast.And, ast.Or)):
        return _on_type(pred.left) and _on_type(pred.right)
    return False  # a ClassRef: resolved away before it gets here


class _PathIndex:
    """One attribute path's tests within a type's plan: value → ids of the equality tests it
    passes, and four sorted arrays of range bounds (numbers, strings; lower, upper)."""

    __slots__ = ("bounds", "equal", "head", "path", "ranged", "rest", "sorted")

    def __init__(self, path: str) -> None:
        self.path = path
        self.head, self.rest = field_path(path)
        self.equal: dict[object, int | list[int]] = {}  # an id alone is the usual case
        self.bounds: list[list[Bound]] = [[], [], [], []]
        self.ranged = 0  # range entries held
        self.sorted = True  # bounds appended since the last sort are put in place lazily

    def add_bound(self, array: int, entry: Bound) -> None:
        self.bounds[array].append(entry)
        self.ranged += 1
        self.sorted = False

    def remove_bound(self, array: int, entry: Bound) -> None:
        self._sort()
        bounds = self.bounds[array]
        del bounds[bisect_left(bounds, entry)]
        self.ranged -= 1

    def _sort(self) -> None:
        # Timsort merges the sorted run with what was appended: O(n) after a few additions,
        # and one sort after a bulk registration (an insort each would be quadratic).
        if not self.sorted:
            for bounds in self.bounds:
                bounds.sort()
            self.sorted = True

    def collect(self, event: Event, hits: list[int]) -> bool:
        """Append the ids of the tests the event's value passes; False when the value is of a
        type the tables cannot answer for (then the caller evaluates)."""
        got = event.field_at(self.head, self.rest)
        kind = type(got)
        if kind is str or kind is int or kind is float or got is None:
            key: object = got
        elif kind is bool:
            key = _TRUE if got else _FALSE
        else:
            # A list or object equals no scalar and is ordered with none; a value of a type
            # JSON does not have is left to the caller to evaluate.
            return kind is dict or kind is list
        if self.equal:
            found = self.equal.get(key)
            if found is not None:
                if isinstance(found, int):
                    hits.append(found)
                else:
                    hits.extend(found)
        if self.ranged:
            if kind is str:
                low = 2
            elif (kind is int or kind is float) and got == got:
                low = 0
            else:
                return True  # NaN, null, a bool: no range test holds
            self._sort()
            probe = (got, 1)
            lower = self.bounds[low]
            if lower:
                for entry in lower[:bisect_right(lower, probe)]:
                    hits.append(entry[2])
            upper = self.bounds[low + 1]
            if upper:
                for entry in upper[bisect_left(upper, probe):]:
                    hits.append(entry[2])
        return True


class TypePlan:
    """How the index decides the candidate predicates of one event type: those the type alone
    implies (or rules out), those counted over the path indexes, those evaluated one by one. Kept
    up to date as predicates come and go (:meth:`count`, :meth:`remove`, …), never rebuilt
    whole: registering a predicate costs its own tests, not the index's size."""

    def __init__(self, type_: str, whole: Callable[[int], Matcher]) -> None:
        self.type = type_
        self._whole = whole  # a predicate compiled, by id
        self.decided = 0
        """Candidate predicates: every one is decided for every event of the type."""
        self.dynamic = False
        """Whether some candidate depends on more than the type (:meth:`extra` has work)."""
        self._implied: set[int] = set()
        self._frozen: frozenset[int] | None = frozenset()
        self._evaluated: dict[int, Matcher] = {}
        self._counted: dict[int, _Parts] = {}
        self._paths: dict[str, _PathIndex] = {}

    def implied(self) -> frozenset[int]:
        """The ids the type alone implies."""
        frozen = self._frozen
        if frozen is None:
            frozen = self._frozen = frozenset(self._implied)
        return frozen

    def evaluated(self) -> int:
        """How many candidates are evaluated one by one per event (for tests and benchmarks)."""
        return len(self._evaluated)

    def imply(self, ident: int) -> None:
        """A candidate the type alone decides true."""
        self._implied.add(ident)
        self._frozen = None
        self.decided += 1

    def never(self, ident: int) -> None:
        """A candidate the type alone decides false."""
        self.decided += 1

    def evaluate(self, ident: int, matcher: Matcher) -> None:
        """A candidate decided by evaluating ``matcher`` per event."""
        self._evaluated[ident] = matcher
        self.decided += 1
        self.dynamic = True

    def count(self, ident: int, parts: _Parts) -> None:
        """A candidate decided by counting its indexed tests."""
        self._counted[ident] = parts
        for path, keys in parts.equal:
            index = self._path(path)
            for key in keys:
                found = index.equal.get(key)
                if found is None:
                    index.equal[key] = ident
                elif isinstance(found, int):
                    index.equal[key] = [found, ident]
                else:
                    found.append(ident)
        for path, array, (bound, flag, _) in parts.ranges:
            self._path(path).add_bound(array, (bound, flag, ident))
        self.decided += 1
        self.dynamic = True

    def _path(self, path: str) -> _PathIndex:
        index = self._paths.get(path)
        if index is None:
            index = self._paths[path] = _PathIndex(path)
        return index

    def remove(self, ident: int) -> None:
        """Forget a candidate, whichever way it was decided."""
        self.decided -= 1
        if ident in self._implied:
            self._implied.discard(ident)
            self._frozen = None
        self._evaluated.pop(ident, None)
        parts = self._counted.pop(ident, None)
        if parts is not None:
            for path, keys in parts.equal:
                index = self._paths[path]
                for key in keys:
                    ids = index.equal[key]
                    if isinstance(ids, int):
                        del index.equal[key]
                    else:
                        ids.remove(ident)
                        if not ids:
                            del index.equal[key]
            for path, array, (bound, flag, _) in parts.ranges:
                self._paths[path].remove_bound(array, (bound, flag, ident))
            for path in [*(p for p, _ in parts.equal), *(p for p, _, _ in parts.ranges)]:
                left = self._paths.get(path)
                if left is not None and not left.equal and not left.ranged:
                    del self._paths[path]
        self.dynamic = bool(self._evaluated or self._counted)

    def extra(self, event: Event) -> set[int]:
        """The ids beyond :meth:`implied` the event matches."""
        out: set[int] = set()
        if self._evaluated:
            for ident, matcher in self._evaluated.items():
                if matcher(event):
                    out.add(ident)
        if not self._counted:
            return out
        hits: list[int] = []
        for index in self._paths.values():
            if not index.collect(event, hits):
                for ident in self._counted:  # a value of an unusual type
                    if self._whole(ident)(event):
                        out.add(ident)
                return out
        if hits:
            counts: dict[int, int] = {}
            for ident in hits:
                counts[ident] = counts.get(ident, 0) + 1
            for ident, n in counts.items():
                parts = self._counted[ident]
                if n == parts.needed and (parts.residual is None or parts.residual(event)):
                    out.add(ident)
        return out


class ClassIndex:
    """Shared primitive-class matching for any number of documents' classes.

    Each structurally distinct predicate gets one integer id, so identical classes in many
    profiles are one entry; :meth:`match` returns the ids an event belongs to. Per ``type``, a
    :class:`TypePlan` keeps the candidate predicates (those whose ``type`` conjunct admits it,
    and those with none), decided in the manner of content-based publish/subscribe matchers
    (the counting algorithm of Aguilera et al. 1999, Siena): conjuncts on ``type`` alone are
    decided once per type; equality and ``in`` tests on one path share one hash look-up from
    value to test ids; ``<``, ``<=``, ``>``, ``>=`` on one path share sorted bound arrays (a
    bisect per array); a conjunction holds when all its indexed tests hit (counted) and the
    rest of it, evaluated, holds; a predicate with nothing indexable is evaluated. The answers
    are :func:`compile_predicate`'s exactly (docs/semantics.md, "Matching").
    """

    def __init__(self, indexed: bool | None = None) -> None:
        self.indexed = INDEXED if indexed is None else indexed
        self._ids: dict[object, int] = {}  # by _identity
        self._exact: list[bool] = []  # a type test (decided by the type without the index)
        self._preds: list[ast.Predicate] = []  # by id
        self._matchers: dict[int, Matcher] = {}  # compiled when first needed
        self._types: list[frozenset[str] | None] = []
        self._parts: list[_Parts | None] = []
        self._active: list[bool] = []
        self._by_type: dict[str, dict[int, None]] = {}
        self._any_type: dict[int, None] = {}
        self._plans: dict[str, TypePlan] = {}
        self._statics: dict[tuple[ast.Predicate, str], bool] = {}
        self.tests = 0  # predicate decisions made (for tests and benchmarks)

    def add(self, pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> int:
        """Register a predicate (again, after :meth:`release`); returns the id under which
        :meth:`match` reports it."""
        key = resolve(pred, classes)
        identity = _identity(key)
        found = self._ids.get(identity)
        if found is not None:
            if not self._active[found]:
                self._activate(found)
            return found
        ident = len(self._preds)
        self._ids[identity] = ident
        self._preds.append(key)
        self._exact.append(_is_type_test(key))
        types = required_types(key, {})
        self._types.append(None if types is None else _interned(types))
        self._parts.append(_Parts(key) if self.indexed else None)
        self._active.append(False)
        self._activate(ident)
        return ident

    def release(self, ident: int) -> None:
        """Stop matching a predicate no profile uses any more (its id stays its own)."""
        if not self._active[ident]:
            return
        self._active[ident] = False
        types = self._types[ident]
        if types is None:
            del self._any_type[ident]
            plans = list(self._plans.values())
        else:
            for t in types:
                del self._by_type[t][ident]
            plans = [self._plans[t] for t in types if t in self._plans]
        for plan in plans:
            plan.remove(ident)

    def _activate(self, ident: int) -> None:
        self._active[ident] = True
        types = self._types[ident]
        if types is None:
            self._any_type[ident] = None
            plans = list(self._plans.values())
        else:
            for t in types:
                self._by_type.setdefault(t, {})[ident] = None
            plans = [self._plans[t] for t in types if t in self._plans]
        for plan in plans:
            self._insert(plan, ident)

    def _insert(self, plan: TypePlan, ident: int) -> None:
        parts = self._parts[ident]
        if parts is None:  # no index: a type test is implied, anything else evaluated
            if self._exact[ident]:
                plan.imply(ident)
            else:
                plan.evaluate(ident, self.matcher(ident))
        elif not self._admits(parts, plan.type):
            plan.never(ident)
        elif parts.needed:
            plan.count(ident, parts)
        elif parts.residual is None:
            plan.imply(ident)
        else:
            plan.evaluate(ident, parts.residual)

    def matcher(self, ident: int) -> Matcher:
        """The predicate of that id, compiled."""
        found = self._matchers.get(ident)
        if found is None:
            found = self._matchers[ident] = compile_predicate(self._preds[ident], {})
        return found

    def _admits(self, parts: _Parts, type_: str) -> bool:
        """Whether the conjuncts on ``type`` of a predicate hold for events of that type."""
        if parts.types is not None:
            return type_ in parts.types
        return all(self._static(part, type_) for part in parts.statics)

    def _static(self, part: ast.Predicate, type_: str) -> bool:
        """Whether a conjunct on ``type`` alone holds for events of that type."""
        found = self._statics.get((part, type_))
        if found is None:
            found = self._statics[(part, type_)] = compile_predicate(part, {})(
                Event("", "", type_, 0))
        return found

    def predicates(self) -> list[ast.Predicate]:
        """Every registered (resolved) predicate, in id order."""
        return list(self._preds)

    def plan(self, type_: str) -> TypePlan:
        """How the candidates of events of that type are decided."""
        found = self._plans.get(type_)
        if found is None:
            found = self._plans[type_] = TypePlan(type_, self.matcher)
            for ident in [*self._by_type.get(type_, {}), *self._any_type]:
                self._insert(found, ident)
        return found

    def match(self, event: Event) -> frozenset[int]:
        plan = self.plan(event.type)
        self.tests += plan.decided
        implied = plan.implied()
        if not plan.dynamic:
            return implied
        extra = plan.extra(event)
        return implied | extra if extra else implied


def _identity(pred: ast.Predicate) -> object:
    """What predicates share one id by: their structure, with true and false told from 1 and 0
    (which the AST's dataclass equality takes them for: ``True == 1``)."""
    return (pred, _typed(pred)) if _has_bool(pred) else pred


def _has_bool(pred: ast.Predicate | object) -> bool:
    if isinstance(pred, ast.Compare):
        return _has_bool(pred.value)
    if isinstance(pred, ast.Not):
        return _has_bool(pred.operand)
    if isinstance(pred, (ast.And, ast.Or)):
        return _has_bool(pred.left) or _has_bool(pred.right)
    if isinstance(pred, tuple):
        return any(_has_bool(v) for v in pred)
    return type(pred) is bool


def _typed(pred: ast.Predicate | object) -> object:
    """The predicate (or value) with every value paired with its type."""
    if isinstance(pred, ast.Compare):
        return (pred.path, pred.op, _typed(pred.value))
    if isinstance(pred, ast.Not):
        return ("not", _typed(pred.operand))
    if isinstance(pred, (ast.And, ast.Or)):
        return (type(pred).__name__, _typed(pred.left), _typed(pred.right))
    if isinstance(pred, tuple):
        return (tuple, tuple(_typed(v) for v in pred))
    return (type(pred), pred)


def _is_type_test(pred: ast.Predicate) -> bool:
    return isinstance(pred, ast.Compare) and pred.path == "type" and (
        (pred.op == "==" and isinstance(pred.value, str)) or (
            pred.op == "in" and isinstance(pred.value, tuple)
            and all(isinstance(v, str) for v in pred.value)))


def resolve(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> ast.Predicate:
    """Inline class references: structurally equal classes share one key across documents, and
    a predicate can leave its document (a native dialect knows no EVA class names). A part
    without references is returned as it is (not rebuilt)."""
    if isinstance(pred, ast.ClassRef):
        body = classes[pred.name].body
        assert not isinstance(body, ast.Every)
        return resolve(body, classes)
    if isinstance(pred, ast.Not):
        operand = resolve(pred.operand, classes)
        return pred if operand is pred.operand else ast.Not(operand)
    if isinstance(pred, (ast.And, ast.Or)):
        left, right = resolve(pred.left, classes), resolve(pred.right, classes)
        if left is pred.left and right is pred.right:
            return pred
        return ast.And(left, right) if isinstance(pred, ast.And) else ast.Or(left, right)
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
