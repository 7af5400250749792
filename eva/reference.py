"""The reference evaluator: EVA Defs. 4.1–4.8 transcribed directly, over a finite trace.

It is slow on purpose. Every node's result is defined on *prefixes* of its trace view: in
continuous evaluation a node reports, at each view element, every result of the definition on
the view up to and including that element that it has not reported before (so a provisional
``last`` result stays reported when a later duplicate overwrites it, EVA §4.4).
``repeated_pairs`` is defined operationally, as DESIGN §3 pins it: after each element, match
unique pairs on the unconsumed view, remove the matched occurrences, and match again.

The limit on composites (``limit``; docs/semantics.md, "The limit on composites") is defined
here on the streams: a binary operator reports, at one emit key, the first ``limit`` results in
report order; the rest are never reported (nor later, as fresh), and at the end of the interval
only the results reported so are candidates — the first ``limit`` of them per closing key.

A stream is the list of ``(emit key, occurrence)`` a node reports, in the order it reports
them; a parent's trace view merges its operands' streams in that order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eva import ast
from eva import semantics as sem
from eva.classes import compile_predicate, label, ticks_between
from eva.events import Event
from eva.printer import expr_text
from eva.semantics import (
    Element,
    Key,
    L,
    Notification,
    Occ,
    R,
    Stream,
    binary_results,
    cut,
    merge,
    partition_key,
)

INF: Key = (2**62, 0, 0)


@dataclass
class Context:
    """One partition's trace and settings; ``with_events`` narrows it to a sub-trace."""

    events: list[Event]
    doc: ast.Document
    admit: Callable[[Key], bool]
    start: int
    end: int
    tick: int
    matchers: dict[str, Callable[[Event], bool]]
    partition: Any = None
    externals: Mapping[str, Stream] = field(default_factory=dict)
    """The streams of the profile's :class:`~eva.ast.External` leaves, by name."""
    limit: int | None = None
    """Composites a binary operator reports per emit key at most (None: no limit)."""
    limited: set[Key] = field(default_factory=set)
    """The emit keys at which an operator reached the limit (filled in as it evaluates)."""

    def with_events(self, events: list[Event]) -> Context:
        return Context(events, self.doc, self.admit, self.start, self.end, self.tick,
                       self.matchers, self.partition, self.externals, self.limit, self.limited)


# ------------------------------------------------------------------ nodes


def eval_expr(expr: ast.Expr, ctx: Context, anchors: Stream | None = None) -> Stream:
    if isinstance(expr, ast.Prim):
        return eval_prim(expr, ctx)
    if isinstance(expr, ast.External):
        return eval_external(expr, ctx)
    if isinstance(expr, ast.Negation):
        return eval_negation(expr, ctx, anchors)
    if isinstance(expr, ast.Selection):
        return eval_selection(expr, ctx)
    return eval_binary(expr, ctx)[0]


def eval_prim(expr: ast.Prim, ctx: Context) -> Stream:
    cls = ctx.doc.class_map()[expr.name]
    if isinstance(cls.body, ast.Every):
        index = [c.name for c in ctx.doc.classes].index(expr.name)
        out: Stream = []
        for t in ticks_between(cls.body, ctx.start, ctx.end):
            occ = sem.time_event(expr.name, index, t, label(t))
            if ctx.admit(occ.key):
                out.append((occ.key, occ))
        return out
    match = ctx.matchers[expr.name]
    return [(e.key, sem.occurrence(e)) for e in ctx.events if match(e)]


def eval_external(expr: ast.External, ctx: Context) -> Stream:
    """The caller's stream of the leaf, as the engine sees it: what is reported after the start
    and by the end of the trace."""
    stream = ctx.externals.get(expr.name)
    if stream is None:
        raise ValueError(f"no stream given for the external operand <{expr.name}> "
                         f"(externals has {sorted(ctx.externals)})")
    return [(emit, occ) for emit, occ in stream if ctx.admit(emit) and emit[0] <= ctx.end]


def eval_selection(expr: ast.Selection, ctx: Context) -> Stream:
    return select(expr, eval_expr(expr.expr, ctx))


def select(expr: ast.Selection, stream: Stream) -> Stream:
    """Def. 4.7 over the operand's stream."""
    out: Stream = []
    for count, (emit, occ) in enumerate(stream, start=1):
        if sem.selection_picks(expr.index, count, expr.pairs):
            out.append((emit, occ))
    return out


def eval_negation(expr: ast.Negation, ctx: Context, anchors: Stream | None) -> Stream:
    return negate(expr, eval_expr(expr.expr, ctx), ctx, anchors)


def negate(expr: ast.Negation, negated: Stream, ctx: Context, anchors: Stream | None) -> Stream:
    """Passive events (Def. 4.8) at the clock's ticks, or anchored after each anchor occurrence
    when the negation is the posterior operand of a sequence (DESIGN §3)."""
    tag = expr_text(expr)
    candidates: list[tuple[Key, Occ]] = []
    if anchors is None:
        for t in range(ctx.start - ctx.start % ctx.tick + ctx.tick, ctx.end + 1, ctx.tick):
            occ = sem.passive(tag, t, label(t), None)
            if not ctx.admit(occ.key):
                continue
            lo, hi = sem.negation_window(t, expr.span)
            if not any(emit <= occ.key and lo <= o.time <= hi for emit, o in negated):
                candidates.append((occ.key, occ))
    else:
        for emit_a, a in anchors:
            deadline = a.time + expr.span
            occ = sem.passive(tag, deadline, label(deadline), a)
            if occ.key <= emit_a or deadline > ctx.end:
                continue
            if not any(emit <= occ.key and a.time < o.time <= deadline for emit, o in negated):
                candidates.append((occ.key, occ))
        candidates.sort(key=lambda c: c[0])
    return [c for count, c in enumerate(candidates, start=1) if sem.negation_picks(count, expr.pairs)]


def operands(node: ast.Binary, ctx: Context) -> tuple[Stream, Stream]:
    left = eval_expr(node.left.expr, ctx)
    anchored = isinstance(node, ast.Sequence) and isinstance(node.right.expr, ast.Negation)
    return left, eval_expr(node.right.expr, ctx, anchors=left if anchored else None)


def eval_binary(node: ast.Binary, ctx: Context) -> tuple[Stream, list[Element]]:
    return combine(node, *operands(node, ctx), ctx.limit, ctx.limited)


class _Limit:
    """Counts reports per emit key against the limit; notes the keys where it was reached."""

    def __init__(self, limit: int | None, limited: set[Key] | None) -> None:
        self.limit = limit
        self.limited = limited if limited is not None else set()
        self.counts: dict[Key, int] = {}

    def admits(self, emitted: Key) -> bool:
        """Whether one more report at ``emitted`` is within the limit (counted if so)."""
        count = self.counts.get(emitted, 0)
        if self.limit is not None and count >= self.limit:
            self.limited.add(emitted)
            return False
        self.counts[emitted] = count + 1
        return True


def combine(node: ast.Binary, left: Stream, right: Stream, limit: int | None = None,
            limited: set[Key] | None = None) -> tuple[Stream, list[Element]]:
    """Defs. 4.4–4.6 over the operands' streams: the node's stream and its trace view; with
    ``limit``, at most that many reports per emit key (the keys cut are added to ``limited``)."""
    tag = expr_text(node)
    view = merge(left, right)
    out: Stream = []
    cap = _Limit(limit, limited)
    if node.pairs is ast.Pairs.REPEATED and not isinstance(node, ast.Disjunction):
        remaining: list[Element] = []
        for element in view:
            remaining.append(element)
            while True:
                found = sorted(binary_results(node, remaining, tag), key=sem.result_order)
                if not found:
                    break
                used = {i for r in found for i in (r[1], r[2])}
                # Beyond the limit a result is not reported, but its events are consumed.
                out.extend((element.emitted, r[0]) for r in found if cap.admits(element.emitted))
                remaining = [e for i, e in enumerate(remaining) if i not in used]
        return out, view
    seen: set[Hashable] = set()
    for k in range(len(view)):
        fresh = [r for r in binary_results(node, view[: k + 1], tag) if r[0].ident not in seen]
        for r in sorted(fresh, key=sem.result_order):
            seen.add(r[0].ident)  # reported, or cut by the limit: never fresh again
            if cap.admits(view[k].emitted):
                out.append((view[k].emitted, r[0]))
    return out, view


def eval_end_of_interval(node: ast.Binary, ctx: Context) -> Stream:
    return end_of_interval(node, *operands(node, ctx), ctx.end, ctx.limit, ctx.limited)


def end_of_interval(node: ast.Binary, left: Stream, right: Stream, end: int,
                    limit: int | None = None, limited: set[Key] | None = None) -> Stream:
    """Root results evaluated at the closing of their interval (EVA §4.4): the definition on
    the whole view, each result reported once nothing later can overwrite it — its ``last``
    lists closed and, for a posterior ``last``, its frame over. Unclosed ones are withheld.
    With ``limit``: only results the continuous evaluation reported within the limit, and at
    most ``limit`` per closing key."""
    stream, view = combine(node, left, right, limit, limited)
    if node.pairs is ast.Pairs.REPEATED and not isinstance(node, ast.Disjunction):
        return stream
    made = {occ.ident for _, occ in stream} if limit is not None else None
    lists = cut(view)
    tag = expr_text(node)

    def after(li: int) -> Key:
        end = lists[li][1]
        return view[end].emitted if end < len(view) else INF

    out: list[tuple[Key, int, int, Occ]] = []
    for occ, i, j, x, y in binary_results(node, view, tag):
        if made is not None and occ.ident not in made:
            continue  # cut by the limit when it was made
        close = max(view[i].emitted, view[j].emitted)
        if isinstance(node, ast.Disjunction):
            a, b = lists[x]
            dups = ([node.left.dup] if view[i].role & L else []) + (
                [node.right.dup] if view[i].role & R else [])
            if all(d.kind == "last" for d in dups if sem.selected_single(d, i - a, b - a)):
                close = max(close, after(x))
        else:
            if node.left.dup.kind == "last":
                close = max(close, after(x))
            if node.right.dup.kind == "last":
                frame = INF if node.span is None else (view[i].occ.time + node.span, sem.CLOSE, 0)
                close = max(close, min(after(y), frame))
        if close[0] <= end:
            out.append((close, i, j, occ))
    out.sort(key=lambda r: (r[0], r[1], r[2]))
    cap = _Limit(limit, limited)
    return [(close, occ) for close, _, _, occ in out if cap.admits(close)]


# ------------------------------------------------------------------ profiles


RootStream = Callable[[ast.Profile, "Context"], Stream]


def profile_stream(profile: ast.Profile, ctx: Context) -> Stream:
    """The reported stream of a profile in one partition (end-of-interval at the root)."""
    root = profile.expr
    if (profile.evaluation is ast.Evaluation.END_OF_INTERVAL
            and isinstance(root, (ast.Disjunction, ast.Conjunction, ast.Sequence))):
        return eval_end_of_interval(root, ctx)
    return eval_expr(root, ctx)


def evaluate_profile(profile: ast.Profile, doc: ast.Document, events: list[Event], *,
                     start: int, end: int, tick: int,
                     root: RootStream = profile_stream,
                     externals: Mapping[str, Stream] | None = None, limit: int | None = None,
                     limited: list[tuple[Any, Key]] | None = None) -> list[Notification]:
    """One profile over a trace, partition by partition; ``root`` computes the partition's
    stream (the definition by default; the transformation planner substitutes a plan).
    ``externals`` are the streams of the profile's external operands (unpartitioned profiles
    only: a stream names no partition). ``limit``: composites per operator and emit key at
    most; ``limited`` gets (partition value, key) of each step where one reached it."""
    if externals and profile.per is not None:
        raise ValueError(f"profile {profile.name!r} is partitioned (per {profile.per}): "
                         "external streams are given for unpartitioned profiles only")
    classes = doc.class_map()
    matchers = {c.name: compile_predicate(c.body, classes) for c in doc.classes
                if not isinstance(c.body, ast.Every)}
    used = {n.name for n in ast.walk(profile.expr) if isinstance(n, ast.Prim)}
    relevant = [matchers[n] for n in sorted(used) if n in matchers]
    # Only events of the profile's own classes can open a partition (and be seen at all).
    visible = sorted((e for e in events if start < e.time <= end and any(m(e) for m in relevant)),
                     key=lambda e: e.key)
    groups: list[tuple[Any, list[Event], Key | None]] = []
    if profile.per is None:
        groups.append((None, visible, None))
    else:
        index: dict[Hashable, int] = {}
        for e in visible:
            value = e.field(profile.per)
            if value is None:
                continue
            k = partition_key(value)
            if k not in index:
                index[k] = len(groups)
                groups.append((value, [], e.key))
            groups[index[k]][1].append(e)
    out: list[Notification] = []
    for value, group, created in groups:
        def admit(key: Key, created: Key | None = created) -> bool:
            return key[0] > start and (created is None or key >= created)

        ctx = Context(group, doc, admit, start, end, tick, matchers, value, externals or {},
                      limit)
        stream = root(profile, ctx)
        if limited is not None:
            limited.extend((value, key) for key in sorted(ctx.limited))
        out.extend(Notification(profile.name, value, occ, emit) for emit, occ in stream)
    return out


def evaluate(doc: ast.Document, events: Iterable[Event], *, profiles: Iterable[str] | None = None,
             start: int | None = None, end: int | None = None,
             tick: int = 1_000_000, limit: int | None = None,
             limited: list[tuple[Any, Key]] | None = None) -> list[Notification]:
    """Every profile's composites over a finite trace, in detection order.

    ``events`` carry their arrival order in ``seq``. Profiles are registered at ``start``
    (default: just before the first event) and see events with time > start (Def. 3.5); the
    trace ends at ``end`` (default: the last event's time). ``tick`` is the granularity (µs) of
    the default clock at which free-standing negations are evaluated. ``limit``: composites
    an operator reports per step at most (None: no limit); ``limited`` gets (partition value,
    key) of each step at which one reached it.
    """
    trace = list(events)
    if start is None:
        start = min((e.time for e in trace), default=0) - 1
    if end is None:
        end = max((e.time for e in trace), default=start)
    wanted = set(profiles) if profiles is not None else None
    out: list[Notification] = []
    for profile in doc.profiles:
        if wanted is None or profile.name in wanted:
            out.extend(evaluate_profile(profile, doc, trace, start=start, end=end, tick=tick,
                                        limit=limit, limited=limited))
    # Stable: profiles in document order, partitions in order of creation, at equal report keys.
    out.sort(key=lambda n: n.emitted)
    return out


__all__ = ["Context", "evaluate", "evaluate_profile"]
