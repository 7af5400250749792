"""The operator rules of EVA in one place: occurrence times, time frames, duplicate selection,
pair eligibility. The reference evaluator and the incremental engine both call these.

Vocabulary (EVA §4.1): a node's *trace view* merges the occurrence streams of its operands in
total order; each view element carries the roles it can play (``L`` anterior/left operand,
``R`` posterior/right operand, or both when the same occurrence belongs to both operand
classes). The view is cut into *duplicate lists* (Def. 4.2–4.3): maximal runs of elements with
the same single role. An element playing both roles forms a list of its own — see
docs/semantics.md, "Same class on both sides".
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from eva import ast
from eva.events import PASSIVE, TIME_EVENT, Event, Key, tick_id

__all__ = [
    "CLOSE",
    "LR",
    "PASSIVE",
    "TIME_EVENT",
    "Element",
    "Key",
    "L",
    "Notification",
    "Occ",
    "R",
    "Result",
    "Stream",
    "binary_results",
    "composite",
    "conjunction_holds",
    "conjunction_pairs",
    "cut",
    "frame_end",
    "merge",
    "negation_picks",
    "negation_window",
    "occurrence",
    "partition_key",
    "passive",
    "primitive",
    "result_order",
    "select_anterior",
    "select_posterior",
    "selected_single",
    "selection_picks",
    "sequence_holds",
    "sequence_pairs",
    "time_event",
]

L = 1
R = 2
LR = L | R

CLOSE = 3
"""Phase of the clock step at which end-of-interval results whose frame ended are emitted."""


class Occ:
    """An occurrence in a node's stream: a primitive event, a time event or a composite.

    ``key`` is the total-order key (time, phase, tiebreak). ``ident`` says when two streams
    carry *the same* occurrence. ``events`` are the contributing primitive/time event ids in
    operand order (anterior first, nested operands flattened left to right, DESIGN §5).
    ``anchor`` is set on passive events of an anchored negation: the ident of their anchor.

    A slotted class rather than a NamedTuple: the compiled engine builds one per composite,
    and a native class is several times cheaper to construct.
    """

    __slots__ = ("anchor", "events", "ident", "key", "time")

    def __init__(self, time: int, key: tuple[int, int, Any], ident: Hashable,
                 events: tuple[str, ...], anchor: Hashable = None) -> None:
        self.time = time
        self.key = key
        self.ident = ident
        self.events = events
        self.anchor = anchor

    def _fields(self) -> tuple[Any, ...]:
        return (self.time, self.key, self.ident, self.events, self.anchor)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Occ) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Occ(time={self.time}, key={self.key}, events={self.events})"


class Notification:
    """A composite reported for a profile: the occurrence, its partition, when it was reported."""

    __slots__ = ("emitted", "occ", "partition", "profile")

    def __init__(self, profile: str, partition: Any, occ: Occ, emitted: tuple[int, int, Any]) -> None:
        self.profile = profile
        self.partition = partition
        self.occ = occ
        self.emitted = emitted

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Notification) and (
            self.profile, self.partition, self.occ, self.emitted) == (
            other.profile, other.partition, other.occ, other.emitted)

    def __hash__(self) -> int:
        return hash((self.profile, self.occ, self.emitted))

    def __repr__(self) -> str:
        return f"Notification({self.profile!r}, {self.partition!r}, {self.occ!r})"


# ------------------------------------------------------------------ occurrence construction


def primitive(event_id: str, source: str, time: int, key: tuple[int, int, Any]) -> Occ:
    """A primitive event as an occurrence. CloudEvents make (source, id) unique, but the door
    remembers ids for a bounded time: an event re-sent once it is forgotten is taken again, so
    its identity holds its time too — a copy at another time is another occurrence, with
    composites of their own, not ones lost as repeats of the first (docs/semantics.md §17).
    Nested as ``((source, id), time)``: no other identity is a pair."""
    return Occ(time, key, ((source, event_id), time), (event_id,))


def source_and_id(ident: Hashable) -> tuple[str, str] | None:
    """The (source, id) a primitive's identity names — ``((source, id), time)``, or the bare
    pair of a checkpoint written before identities held the time —; None for any other."""
    if type(ident) is not tuple or len(ident) != 2:
        return None
    first, second = ident
    if type(first) is tuple and len(first) == 2 and type(second) is int:
        first, second = first
    if type(first) is str and type(second) is str:
        return (first, second)
    return None


def occurrence(event: Event) -> Occ:
    """An event as the occurrence of a primitive class, at its own key."""
    return primitive(event.id, event.source, event.time, event.key)


def partition_key(value: Any) -> Hashable:
    """A hashable key for a ``per`` attribute value (JSON objects and arrays included)."""
    cls = type(value)
    if cls is str:  # the common values first, spelt as below without looking up the type's name
        return ("str", value)
    if cls is int:
        return ("int", value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, float):
        # -0.0 and 0.0 are one key already; one spelling too, for whatever hashes its text.
        return ("float", value + 0.0)
    return (type(value).__name__, value)


def composite(tag: str, left: Occ, right: Occ, key: tuple[int, int, Any]) -> Occ:
    """A binary composite; its identity is the node and its two operand occurrences."""
    return Occ(key[0], key, (tag, left.ident, right.ident), left.events + right.events)


def time_event(name: str, index: int, time: int, label: str) -> Occ:
    """A tick of a time class (EVA's time events, Def. 3.2 𝔼_t)."""
    return Occ(time, (time, TIME_EVENT, index), ("tick", name, time), (tick_id(name, label),))


def passive(tag: str, time: int, label: str, anchor: Occ | None) -> Occ:
    """A passive event of a negation (Def. 4.8) at ``time``; anchored ones sort by anchor."""
    if anchor is None:
        return Occ(time, (time, PASSIVE, ()), ("not", tag, time), (f"absence@{label}",))
    return Occ(time, (time, PASSIVE, anchor.key), ("not", tag, time, anchor.ident),
               (f"absence@{label}",), anchor.ident)


# ------------------------------------------------------------------ time frames (Defs. 4.5, 4.6)


def sequence_holds(t1: int, t2: int, span: int | None) -> bool:
    """t(e2) ∈ (t(e1), t(e1) + T]: strictly after, inclusive bound (Def. 4.6)."""
    return t1 < t2 and (span is None or t2 - t1 <= span)


def conjunction_holds(t1: int, t2: int, span: int | None) -> bool:
    """|t(e2) − t(e1)| ≤ T (Def. 4.5)."""
    return span is None or abs(t2 - t1) <= span


def negation_window(tick: int, span: int) -> tuple[int, int]:
    """The closed interval [t − T, t] in which no negated event may lie (Def. 4.8)."""
    return (tick - span, tick)


# ------------------------------------------------------------------ duplicate selection (Fig. 6)


def select_anterior(dup: ast.Dup, length: int) -> range:
    """Indices (0-based) that the anterior operand's EIS selects in a list of ``length``."""
    if dup.kind == "first":
        return range(0, min(1, length))
    if dup.kind == "last":
        return range(length - 1, length) if length else range(0)
    if dup.kind == "all":
        return range(length)
    return range(dup.n - 1, dup.n) if dup.n <= length else range(0)


def frame_end(times: Sequence[int], t1: int, span: int | None) -> int:
    """m of Fig. 6: every element after the m-th lies beyond t(e1) + T.

    Counted from the end because a list's times need not be sorted: a repeated_pairs operand
    can report a composite of older occurrences after a newer one.
    """
    m = len(times)
    if span is None:
        return m
    limit = t1 + span
    while m and times[m - 1] > limit:
        m -= 1
    return m


def select_posterior(dup: ast.Dup, times: Sequence[int], t1: int, span: int | None) -> range:
    """Indices the posterior operand's EIS selects, relative to the anterior event at ``t1``.

    ``last`` is the last element still inside the frame (``m``); ``first`` and ``<i>`` are
    fixed positions whose time condition the operator checks afterwards (Fig. 6 caption).
    """
    m = frame_end(times, t1, span)
    if dup.kind == "first":
        return range(0, min(1, len(times)))
    if dup.kind == "last":
        return range(m - 1, m) if m else range(0)
    if dup.kind == "all":
        return range(m)
    return range(dup.n - 1, dup.n) if dup.n <= len(times) else range(0)


def selected_single(dup: ast.Dup, index: int, length: int) -> bool:
    """Whether element ``index`` of a list of ``length`` is selected, with no frame (disjunction)."""
    return index in select_anterior(dup, length)


# ------------------------------------------------------------------ pair eligibility (Fig. 7)


def sequence_pairs(roles: Sequence[int], pairs: ast.Pairs) -> list[tuple[int, int]]:
    """(anterior list, posterior list) pairs a sequence may combine (Def. 4.6: tr[x], tr[y+1]).

    all_pairs: any anterior list with any later posterior list; unique_pairs: a list only with
    the list immediately after it (x = y).
    """
    n = len(roles)
    if pairs is ast.Pairs.ALL:
        return [(x, y) for x in range(n) if roles[x] & L for y in range(x + 1, n) if roles[y] & R]
    return [(x, x + 1) for x in range(n - 1) if roles[x] & L and roles[x + 1] & R]


def conjunction_pairs(roles: Sequence[int], pairs: ast.Pairs) -> list[tuple[int, int]]:
    """(anterior list, posterior list) pairs a conjunction may combine (Def. 4.5).

    all_pairs: any left-operand list with any right-operand list; unique_pairs: consecutive
    blocks of two lists in order of appearance, (1,2), (3,4), … (Def. 4.5's tr[2x−1], tr[2y]
    read symmetrically, so a view may start with either operand). Two lists that can each play
    both roles combine once, the earlier one as anterior.
    """
    n = len(roles)
    if pairs is ast.Pairs.ALL:
        out = []
        for x in range(n):
            if not roles[x] & L:
                continue
            for y in range(n):
                if y == x or not roles[y] & R:
                    continue
                if roles[x] == LR and roles[y] == LR and y < x:
                    continue
                out.append((x, y))
        return out
    out = []
    for a in range(0, n - 1, 2):
        b = a + 1
        if roles[a] & L and roles[b] & R:
            out.append((a, b))
        elif roles[a] & R and roles[b] & L:
            out.append((b, a))
    return out


def selection_picks(index: int, count: int, pairs: ast.Pairs) -> bool:
    """Whether the ``count``-th occurrence (1-based) is selected by (E[index])_pairs (Fig. 4).

    UA (all_pairs, keep): every occurrence from the index-th on; UB (unique_pairs, consume): the
    index-th only; UC (repeated_pairs, consume and re-apply): every index-th.
    """
    if pairs is ast.Pairs.ALL:
        return count >= index
    if pairs is ast.Pairs.UNIQUE:
        return count == index
    return count % index == 0


def negation_picks(count: int, pairs: ast.Pairs) -> bool:
    """Which passive events a negation reports (Def. 4.8: v_min = v_max = 1 for unique)."""
    return count == 1 if pairs is ast.Pairs.UNIQUE else True


# ------------------------------------------------------------------ trace views (Defs. 4.1–4.3)


class Element(NamedTuple):
    """A trace-view element: when it was reported, the occurrence, the roles it plays."""


    emitted: Key
    occ: Occ
    role: int




def merge(left: Stream, right: Stream) -> list[Element]:
    """The trace view tr(E1, E2) (Def. 4.1): both streams in report order, an occurrence that
    both operands report at the same step appearing once with both roles."""
    tagged = [(emit, 0, i, occ) for i, (emit, occ) in enumerate(left)]
    tagged += [(emit, 1, i, occ) for i, (emit, occ) in enumerate(right)]
    tagged.sort(key=lambda t: (t[0], t[1], t[2]))
    view: list[Element] = []
    index: dict[tuple[Key, Hashable], int] = {}
    for emit, side, _, occ in tagged:
        role = L if side == 0 else R
        seen = index.get((emit, occ.ident))
        if seen is not None:
            view[seen] = Element(emit, occ, view[seen].role | role)
            continue
        index[(emit, occ.ident)] = len(view)
        view.append(Element(emit, occ, role))
    return view


def cut(view: Sequence[Element]) -> list[tuple[int, int]]:
    """Duplicate lists (Defs. 4.2–4.3) as (first view index, end index) — maximal runs of one
    role; an element with both roles is a list of its own."""
    out: list[tuple[int, int]] = []
    for i, element in enumerate(view):
        if out and element.role != LR and view[out[-1][0]].role == element.role:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


# ------------------------------------------------------------------ one evaluation of a definition


Stream = list[tuple[Key, Occ]]
"""A node's reports, in order: (emit key, occurrence)."""

Result = tuple[Occ, int, int, int, int]
"""A binary result: composite, view index of e1, view index of e2, list of e1, list of e2."""


def binary_results(node: ast.Binary, view: Sequence[Element], tag: str) -> list[Result]:
    """All results of Def. 4.4 / 4.5 / 4.6 with the node's EIS and EIC on ``view``."""
    lists = cut(view)
    roles = [view[a].role for a, _ in lists]
    out: list[Result] = []
    if isinstance(node, ast.Disjunction):
        for li, (a, b) in enumerate(lists):
            for j in range(a, b):
                dups = []
                if roles[li] & L:
                    dups.append(node.left.dup)
                if roles[li] & R:
                    dups.append(node.right.dup)
                if any(selected_single(d, j - a, b - a) for d in dups):
                    out.append((view[j].occ, j, j, li, li))
        return out
    pairs = node.pairs if node.pairs is not ast.Pairs.REPEATED else ast.Pairs.UNIQUE
    if isinstance(node, ast.Sequence):
        eligible = sequence_pairs(roles, pairs)
        holds = sequence_holds
    else:
        eligible = conjunction_pairs(roles, pairs)
        holds = conjunction_holds
    anchored = isinstance(node, ast.Sequence) and isinstance(node.right.expr, ast.Negation)
    for x, y in eligible:
        ax, bx = lists[x]
        ay, by = lists[y]
        times_y = [view[j].occ.time for j in range(ay, by)]
        for v in select_anterior(node.left.dup, bx - ax):
            e1 = view[ax + v].occ
            for w in select_posterior(node.right.dup, times_y, e1.time, node.span):
                e2 = view[ay + w].occ
                if not holds(e1.time, e2.time, node.span):
                    continue
                if anchored and e2.anchor != e1.ident:
                    continue
                key = e2.key if isinstance(node, ast.Sequence) else max(e1.key, e2.key)
                out.append((composite(tag, e1, e2, key), ax + v, ay + w, x, y))
    return out


def result_order(result: Result) -> tuple[int, int]:
    """Results of one step are reported in order of (position of e1, position of e2)."""
    return (result[1], result[2])


