"""The transformation path against a real base service (``evamed replay --via G``), event by
event.

plan → render (the group's dialect) → native evaluation (the service's own language and
semantics) → notification transformation and post-filter → EVA occurrences, composed at the
mediator where the plan says so. The plan runner (:mod:`transforms.runner`) does everything
after the service; this module connects the runner's leaves to the service: it subscribes each
leaf's native query once (:mod:`adapters.client`: in process, or a running service over gRPC),
publishes every event to the subscriptions — and, for a service without a clock, the ticks of
the time classes a pushed subtree names (the transferring rule), after every event of their
instant — and streams the notifications to the runner. The mediator sees only what a service
sends back: native notifications with their constituent CloudEvents.

A service may refuse the query a pushed subtree renders as: a native language has its own
limits (size, nesting; docs/backends.md, Limits), narrower in places than EVA's. That is
:class:`PushRefused`, naming the profile, the group and the service's own message.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from adapters.backends.native import Language, NativeQueryError
from adapters.client import Connect, Subscription, in_process
from eva import ast
from eva.classes import label, next_tick
from eva.events import Event, tick_event
from eva.semantics import Notification
from transforms.dialects import dialect
from transforms.dialects.base import Detection
from transforms.planner import plan
from transforms.plans import Plan
from transforms.runner import Leaf, Runner

TICK_SEQ = 2**40
"""Ticks published to a service are numbered after any event of the trace."""


class PushRefused(ValueError):
    """The service refused a query the mediator would subscribe for a profile (one of its
    language's limits): the profile cannot be evaluated through this group."""


@dataclass
class _Query:
    """One subscribed native query, the leaves it answers, and the ticks it is published."""

    text: str
    subscription: Subscription
    leaves: list[Leaf]
    clocks: list[tuple[str, ast.Every]]
    next: list[int] = field(default_factory=list)  # each clock's next tick


class Federation:
    """A document's plans through one group's base service, as the trace streams through:
    ``push`` each admitted event (in time order), ``close`` at the end; both return the
    composites decided."""

    def __init__(self, language: Language, doc: ast.Document, plans: list[Plan],
                 connect: Connect, *, tick: int = 1_000_000, start: int | None = None,
                 end: int | None = None) -> None:
        self.dialect = dialect(language.group)
        self.group = language.group
        self.doc = doc
        self.start = start
        self.end = end
        spoken = self.dialect
        self.runner = Runner(plans, doc, spoken, tick=tick, start=start, end=end,
                             own_feed=lambda prim: not spoken.can_render(prim, doc))
        self.queries: dict[str, _Query] = {}
        """Native text → its subscription (each distinct query is subscribed once)."""
        classes = doc.class_map()
        for leaf in self.runner.leaves:
            text = spoken.render(leaf.expr, doc, leaf.profile, leaf.root_eoi)
            query = self.queries.get(text)
            if query is None:
                clocks = [] if spoken.capability.clock else [
                    (n.name, every) for n in dict.fromkeys(ast.walk(leaf.expr))
                    if isinstance(n, ast.Prim) and isinstance(every := classes[n.name].body,
                                                              ast.Every)]
                query = self.queries[text] = _Query(text, self._subscribe(connect, text, leaf),
                                                    [], clocks)
            query.leaves.append(leaf)
        self._ticks = 0
        self._newest: int | None = None
        self.live = all(q.subscription.live for q in self.queries.values())

    @property
    def rendered(self) -> list[str]:
        """The native queries subscribed."""
        return list(self.queries)

    def _subscribe(self, connect: Connect, text: str, leaf: Leaf) -> Subscription:
        try:
            return connect(text)
        except NativeQueryError as exc:
            raise self._refused(exc, leaf.profile.name) from None

    def _refused(self, exc: NativeQueryError, profile: str) -> PushRefused:
        return PushRefused(
            f"profile {profile}: the {self.group} service ({exc.language}) refuses the query "
            f"the mediator would subscribe for it: {exc.message} (see docs/backends.md, Limits; "
            f"'evamed explain --group {self.group}' shows the query)")

    def begin(self, origin: int) -> None:
        """Profiles see events after ``origin`` (default: just before the first event)."""
        if self.start is None:
            self.start = origin
            self.runner.begin(origin)

    def push(self, event: Event) -> list[Notification]:
        self.begin(event.time - 1)
        assert self.start is not None
        if event.time <= self.start or (self.end is not None and event.time > self.end):
            return []  # outside the trace the profiles see
        out: list[Notification] = []
        if self._newest is None or event.time > self._newest:
            # Nothing before this event's instant will come: the services report every
            # instant before it (a live one at once; one that is not only at the end).
            self._tick_until(event.time - 1)
            for query in self.queries.values():
                self._notify(query, query.subscription.advance(event.time - 1))
            if self.live:
                out = self.runner.advance(event.time - 1)
            self._newest = event.time
        self.runner.push(event)
        for query in self.queries.values():
            self._notify(query, query.subscription.push(event))
        return out

    def close(self, until: int | None = None) -> list[Notification]:
        end = until if until is not None else self.end if self.end is not None else self._newest
        if end is None:
            return []
        self._tick_until(end)
        for query in self.queries.values():
            try:
                detections = query.subscription.close(end)
            except NativeQueryError as exc:  # a remote service parses at the end
                raise self._refused(exc, query.leaves[0].profile.name) from None
            self._notify(query, detections)
        return self.runner.close(end)

    def _notify(self, query: _Query, detections: list[Detection]) -> None:
        for d in detections:
            for leaf in query.leaves:
                self.runner.notify(leaf, d)

    def _tick_until(self, time: int) -> None:
        """Publish the ticks up to ``time`` of the time classes each query names (in time
        order, classes in the order the query names them)."""
        assert self.start is not None
        for query in self.queries.values():
            if not query.clocks:
                continue
            if not query.next:
                query.next = [next_tick(every, self.start) for _, every in query.clocks]
            while True:
                due = min(query.next)
                if due > time:
                    break
                for i, (name, every) in enumerate(query.clocks):
                    if query.next[i] == due:
                        tick = tick_event(name, due, label(due), TICK_SEQ + self._ticks)
                        self._ticks += 1
                        self._notify(query, query.subscription.push(tick))
                        query.next[i] = next_tick(every, due)


def via(language: Language, doc: ast.Document, events: Iterable[Event], *,
        profiles: list[str] | None = None, start: int | None = None, end: int | None = None,
        tick: int = 1_000_000, transport: Connect | None = None
        ) -> tuple[list[Notification], list[Plan], list[str]]:
    """Every profile through the whole transformation path to ``language``'s service: the
    notifications (equal to plain replay), the plans, and the native queries subscribed.
    ``events`` stream through in key order (time, then arrival), as the runner takes them;
    an event out of that order is refused (:class:`ValueError`) rather than collected and
    sorted."""
    plans = [plan(p, doc, language.capability) for p in doc.profiles
             if profiles is None or p.name in profiles]
    federation = Federation(language, doc, plans, transport or in_process(language), tick=tick,
                            start=start, end=end)
    out: list[Notification] = []
    previous: Event | None = None
    for event in events:
        if previous is not None and event.key < previous.key:
            raise ValueError(
                f"event {event.id!r} (time {label(event.time)}, arrival {event.seq}) comes after "
                f"{previous.id!r} (time {label(previous.time)}, arrival {previous.seq}); "
                "expected the events in time order, then arrival order")
        previous = event
        out.extend(federation.push(event))
    out.extend(federation.close(end))
    return out, plans, federation.rendered
