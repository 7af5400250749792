"""A document's plans through the services that evaluate their leaves, batch by batch: what
``evamed replay --via G`` runs (one service) and what the mediator's pipeline runs (many).

plan → render (each leaf's service's dialect) → native evaluation (the service's own language
and semantics) → notification transformation and post-filter → EVA occurrences, composed at the
mediator where the plan says so. The plan runner (:mod:`transforms.runner`) does everything
after the services; a :class:`Federation` connects the runner's leaves to the services' links
(:mod:`adapters.links`): it subscribes each distinct native query once per service, and for each
batch of events (in key order: time, then arrival):

1. ``begin(events)``: the runner takes the batch (it holds each event until what the services
   say about it is final). Returned, per link: the ticks of the time classes its queries name
   when its service has no clock (the transferring rule), up to just before the batch's newest
   instant. A tick comes after the events of its instant (its arrival number is after every
   event's), so the newest instant's ticks wait for a later batch, which may hold more of
   that instant's events;
2. the caller publishes to each link the events its service observes and those ticks
   (:func:`publish`);
3. ``finish(detections, newest)``: the runner takes its own handles' detections, then decides
   up to ``newest - 1``. That is sound because a link that has published a batch whose newest
   event is at T has reported every instant before T: it steps its clock before each new
   instant, and a link given no event of T is run to T - 1 (:func:`publish`'s ``until``).

**Autonomous services** (``ServiceInfo.autonomous``): the service has producers of its own and
the mediator publishes nothing to it; its notifications arrive on their own, with each
constituent in full (keyed into the merged trace by the link) and the service's progress (its
watermark). :meth:`Federation.learn` gives the runner a notification of such a link — the
events it names are held as if they had been pushed (:meth:`~transforms.runner.Runner.learn`)
— and :meth:`Federation.decide` settles every instant up to a bound the caller computed from
the watermarks of every input the federation uses (:attr:`Federation.inputs`, and the own feed
when :attr:`Federation.own_inputs`). Such a link's handles carry durable names made here
(:func:`handle_name`), so that a restarted mediator subscribing the same plans again finds the
same registrations at the service.

Links are shared: many federations' handles at one link, each federation taking its own
handles' detections. ``push`` is 1–3 over the federation's own links (``via``). A watermark
``time`` is a batch without events: ``begin([], until=time)``, publish with ``until=time``,
``finish(…, time + 1)`` — :meth:`Federation.advance` over its own links.

Links are shared by federations, and so are some of their subscriptions: a leaf that is one
class of events (a primitive filter: :func:`memoryless`) is answered for each event from that
event alone, so every federation whose leaf renders the same text at a link takes the handle
the first one subscribed (counted: the last to let go unsubscribes it) — one evaluation per
event there, not one per profile. A query that remembers (a sequence, a time class, a peer
mediator's profile) is subscribed per federation: one subscribed later must not see what the
service remembers of the events before it.

A service may refuse the query a pushed subtree renders as: a native language has its own
limits (size, nesting; docs/backends.md, Limits), narrower in places than EVA's. That is
:class:`PushRefused`, naming the profile, the service and the service's own message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any
from weakref import WeakKeyDictionary

from adapters.backends.native import MAX_DEPTH, Language, NativeQueryError
from adapters.client import Connect, in_process
from adapters.links import Handle, Link, SubscriptionLink
from eva import ast
from eva.classes import label, next_tick, required_types, required_values, resolve
from eva.events import TICK_TYPE, Event, tick_event
from eva.semantics import Notification
from transforms.dialects import dialect
from transforms.dialects.base import Detection, Dialect
from transforms.federated import Refuses, ServiceInfo, plan_federated
from transforms.plans import Plan, Remote
from transforms.runner import Leaf, Runner, RunnerStats

ARRIVAL_BITS = 40
"""An event's arrival number at its input (a service's, or the own feed's log position) takes
the low bits of its place in the merged trace, the input's rank the bits above."""
TICK_SEQ = 2**62
"""Ticks published to a service are numbered after any event of the trace."""


def merged_seq(rank: int, arrival: int) -> int:
    """An event's arrival number in the merged trace (``Event.seq``): at one instant, the
    inputs' events in the order of the inputs (the own feed's rank 0, then each autonomous
    service in the configured order), each input's in its own arrival order."""
    if not 0 <= arrival < 1 << ARRIVAL_BITS or not 0 <= rank < 1 << (62 - ARRIVAL_BITS):
        raise ValueError(f"arrival {arrival} at input {rank}: out of the merged trace's range")
    return rank << ARRIVAL_BITS | arrival

Detections = Mapping[str, Mapping[Handle, Sequence[Detection]]]
"""What the links reported for a batch: per link name, per handle."""


_SHARED: WeakKeyDictionary[Link, dict[str, tuple[Handle, int]]] = WeakKeyDictionary()
"""Per link, its memoryless subscriptions: native text → handle and the federations using it."""


def handle_name(text: str, shared: bool, owner: str, leaf: int) -> str:
    """A handle's durable name at an autonomous service: a shared (memoryless) query's is its
    text's digest (every federation subscribing the text shares it); any other's names its
    federation (``owner``) and leaf too."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    return f"q-{digest}" if shared else f"{owner}#{leaf}-{digest[:10]}"


@dataclass(frozen=True)
class Late:
    """What a notification of an autonomous service named behind an instant the federation had
    decided: an event (a set-semantics answer's constituent) or an answer (taken over)."""

    link: str
    handle: Handle
    what: str


class PushRefused(ValueError):
    """The service refused a query the mediator would subscribe for a profile (one of its
    language's limits): the profile cannot be evaluated through this service."""


@dataclass
class _Query:
    """One subscribed native query and the runner's leaves it answers."""

    service: str
    text: str
    handle: Handle
    leaves: list[Leaf]


class Federation:
    """A document's plans over the links their leaves name (``Remote.service``), as the trace
    streams through in batches (see the module docstring); every call returns the composites
    it decided."""

    def __init__(self, doc: ast.Document, plans: Sequence[Plan], links: Mapping[str, Link], *,
                 tick: int = 1_000_000, start: int | None = None,
                 end: int | None = None, owner: str = "", limit: int | None = None) -> None:
        """``start``: profiles see events after it (default: just before the first event);
        ``end``: and none after it; ``owner``: the federation's durable identity (its
        subscription), in the names of its handles at autonomous services; ``limit``: the
        composite limit of the runner's engines (None: none; ``Runner.limited`` says when one
        was reached)."""
        self.doc = doc
        self.plans = list(plans)
        self.links = links
        self.end = end
        self.owner = owner
        dialects = {name: dialect(link.info.group) for name, link in links.items()}
        self.runner = Runner(self.plans, doc, dialects, tick=tick, start=start, end=end,
                             limit=limit)
        self.queries: dict[tuple[str, str], _Query] = {}
        """(service, native text) → its subscription: each distinct query subscribed once."""
        self.selective: dict[tuple[str, str], list[ast.Predicate]] = {}
        """(service, native text) of a relaxed query (:func:`relaxation`) → the classes its
        leaves want of its events: the pipeline hands a detection only to the federations
        one of whose classes it is of (the runner applies each class itself)."""
        self.handles: dict[str, list[Handle]] = {name: [] for name in links}
        self._of: dict[tuple[str, Handle], _Query] = {}
        try:
            for leaf in self.runner.leaves:
                self._subscribe(leaf, dialects)
        except BaseException:
            self.unsubscribe()  # a shared link keeps nothing of a federation that failed
            raise
        classes = doc.class_map()
        # The time classes whose ticks each link is published: those its queries name, when
        # its service has no clock of its own (in the document's order of classes).
        needed = {name: {n.name for q in self.queries.values() if q.service == name
                         for leaf in q.leaves for n in ast.walk(leaf.expr)
                         if isinstance(n, ast.Prim) and isinstance(classes[n.name].body, ast.Every)}
                  for name, link in links.items() if not link.info.capability.clock}
        self._clocks = {name: [c.name for c in doc.classes if c.name in used]
                        for name, used in needed.items() if used}
        self._every = {c.name: c.body for c in doc.classes if isinstance(c.body, ast.Every)}
        self.inputs = {q.service for q in self.queries.values()
                       if self.links[q.service].info.autonomous}
        """The autonomous services its queries are subscribed at: the watermarks its decisions
        wait for (besides the own feed's, :attr:`own_inputs`)."""
        self.own_inputs = (any(p.own_feed for p in self.runner.profiles)
                           or any(q.service not in self.inputs for q in self.queries.values())
                           or not any(link.info.autonomous for link in links.values()))
        """Whether it takes the mediator's own feed: a class of the own feed, a query at a fed
        service (whose answers follow the own feed), or no autonomous service at all (the own
        feed is the whole trace). If not, the own feed's events are not given to it at all."""
        self._next: dict[str, int] = {}  # each ticked class's next tick
        self._ticks = 0
        self._last: Event | None = None  # the latest event given, for the order check
        self._newest: int | None = None  # the newest time of an event the profiles see

    @property
    def rendered(self) -> list[str]:
        """The native queries subscribed."""
        return [q.text for q in self.queries.values()]


    def _subscribe(self, leaf: Leaf, dialects: Mapping[str, Dialect]) -> None:
        service = leaf.node.service
        link = self.links[service]  # the runner has checked that it is connected
        relaxed = (relaxation(leaf.expr, self.doc)
                   if link.info.autonomous and memoryless(leaf, self.doc, link) else None)
        if relaxed is not None:
            # The class's types (and pinned sources) only: one registration at the service
            # for every federation whose class of those types is there; the pipeline hands a
            # detection to those whose class the event is of (selective), and the runner
            # applies the class itself.
            text = dialects[service].render(ast.Prim(RELAXED), relaxed, relaxed.profiles[0],
                                            False)
            assert isinstance(leaf.expr, ast.Prim)
            body = self.doc.class_map()[leaf.expr.name].body
            assert not isinstance(body, ast.Every)
            wanted = self.selective.setdefault((service, text), [])
            if (found := resolve(body, self.doc.class_map())) not in wanted:
                wanted.append(found)
        else:
            text = dialects[service].render(leaf.expr, self.doc, leaf.profile, leaf.root_eoi)
        query = self.queries.get((service, text))
        if query is None:
            handle = subscribe_query(link, text, memoryless(leaf, self.doc, link), self.owner,
                                     leaf.index, leaf.profile.name)
            query = self.queries[(service, text)] = _Query(service, text, handle, [])
            self.handles[service].append(handle)
            self._of[(service, handle)] = query
        query.leaves.append(leaf)

    def text_of(self, service: str, handle: Handle) -> str:
        """The native text subscribed as ``handle`` at ``service``."""
        return self._of[(service, handle)].text

    def set_origin(self, origin: int) -> None:
        """Profiles see events after ``origin`` (before the first batch; then: no effect)."""
        self.runner.begin(origin)

    # ---------------------------------------------------------------- a batch, in steps

    def begin(self, events: Sequence[Event], until: int | None = None) -> dict[str, list[Event]]:
        """Give the runner the batch (in key order; ValueError for an event out of it);
        returned: per link, the ticks its queries need up to just before the newest instant
        seen so far — and, with ``until`` (a watermark), up to it."""
        self._take(events)
        bounds = [t for t in (None if self._newest is None else self._newest - 1, until)
                  if t is not None]
        return self._ticks_until(max(bounds)) if bounds else {}

    def finish(self, detections: Detections, newest: int) -> list[Notification]:
        """Take this federation's handles' detections (each link having published the batch
        whose newest event time is ``newest``), then decide every instant before it."""
        self.take(detections)
        return self.decide(newest - 1)

    def take(self, detections: Detections) -> None:
        """This federation's handles' detections of a batch published to the fed links."""
        self._notify(detections)

    def decide(self, bound: int) -> list[Notification]:
        """Every input has reported every instant up to ``bound``: decide what that settles."""
        if self.runner.start is None:
            return []  # no event the profiles see yet
        return self.runner.advance(bound)

    def learn(self, link: str, handle: Handle, detections: Sequence[Detection]) -> list[Late]:
        """An autonomous service's notification for one of this federation's handles (in the
        order the service sent them; the runner's start set): the events it names learnt,
        the detections given to the handle's leaves. What came behind a decided instant is
        returned (and dropped)."""
        query = self._of.get((link, handle))
        if query is None:
            return []
        runner = self.runner
        taken = all(leaf.taken for leaf in query.leaves)
        late: list[Late] = []
        for d in detections:
            behind = [e for e in d.constituents
                      if not e.type.startswith(TICK_TYPE) and not runner.learn(e, taken)]
            if behind:
                late += [Late(link, handle, f"event {e.id!r} of {e.source!r} at "
                              f"{label(e.time)}") for e in behind]
                continue
            for leaf in query.leaves:
                if not runner.notify(leaf, d):
                    late.append(Late(link, handle, f"an answer at {label(d.time)}: {d.text}"))
                    break
        return late

    # ---------------------------------------------------------------- over its own links

    def push(self, events: Sequence[Event]) -> list[Notification]:
        """A batch through the federation's own links: ``begin``, :func:`publish`,
        ``finish``."""
        seen = self._take(events)
        if not seen:
            return []
        newest = seen[-1].time
        ticks = self._ticks_until(newest - 1)
        return self.finish(publish(self.links, seen, ticks), newest)

    def advance(self, time: int) -> list[Notification]:
        """A watermark: no event at or before ``time`` will come."""
        ticks = self.begin([], until=time)
        return self.finish(publish(self.links, [], ticks, until=time), time + 1)

    def close(self, until: int | None = None) -> list[Notification]:
        """End of input: the trace ends at ``until`` (default: ``end``, else the newest event's
        time); the services' clocks are run there and the runner decides everything."""
        end = until if until is not None else self.end if self.end is not None else self._newest
        if end is None:
            return []
        self._notify(publish(self.links, [], self._ticks_until(end), until=end))
        return self.runner.close(end)

    def export_state(self) -> dict[str, Any]:
        """Its runner's state and its own (the ticks published so far, the last event taken)
        as data: what a checkpoint keeps (:meth:`import_state`)."""
        return {"runner": self.runner.export_state(), "next": self._next, "ticks": self._ticks,
                "last": self._last, "newest": self._newest}

    def import_state(self, state: dict[str, Any]) -> None:
        """Take up :meth:`export_state`'s data in a federation of the same plans, subscribed
        again under the same durable names (an autonomous service's registrations kept
        evaluating; a fed service's would start afresh: only autonomous services and the own
        feed can be taken up so)."""
        self.runner.import_state(state["runner"])
        self._next, self._ticks = dict(state["next"]), state["ticks"]
        self._last, self._newest = state["last"], state["newest"]

    def stats(self) -> RunnerStats:
        """What its runner holds (the mediator's state-size gauge)."""
        return self.runner.stats()

    def take_drops(self) -> dict[str, int]:
        """The services' answers its post-filters dropped since the last call, per link name
        (:meth:`Runner.take_drops`)."""
        return self.runner.take_drops()

    def unsubscribe(self, keep: Callable[[Link], bool] = lambda link: False) -> None:
        """Every handle, at its link (a shared one once no other federation uses it); at the
        links ``keep`` names, the handles are only let go of here (an autonomous service's
        registrations are durable: a mediator that stops leaves them, and the next start
        subscribes them again)."""
        for (service, handle), query in self._of.items():
            unsubscribe_query(self.links[service], query.text, handle, keep)
        self._of.clear()
        for handles in self.handles.values():
            handles.clear()

    # ---------------------------------------------------------------- inside

    def _take(self, events: Sequence[Event]) -> list[Event]:
        """Check the order, push to the runner what the profiles see; that part."""
        runner = self.runner
        if not self.own_inputs:
            return []
        seen: list[Event] = []
        end = self.end
        previous = self._last
        for event in events:
            t = event.time
            # (time, seq) is the order of ``Event.key`` (every one primitive), without
            # building two keys per event.
            if previous is not None and (t < previous.time or (
                    t == previous.time and event.seq < previous.seq)):
                runner.push_all(seen)  # those before it were taken
                raise ValueError(
                    f"event {event.id!r} (time {label(t)}, arrival {event.seq}) comes "
                    f"after {previous.id!r} (time {label(previous.time)}, arrival "
                    f"{previous.seq}); expected the events in time order, then arrival order")
            previous = self._last = event
            start = runner.start
            if start is None:
                runner.begin(t - 1)  # the first event starts the clock, if nothing did
                start = runner.start
                assert start is not None
            if t <= start or (end is not None and t > end):
                continue  # outside the trace the profiles see
            seen.append(event)
            self._newest = t
        runner.push_all(seen)
        return seen

    def _notify(self, detections: Detections) -> None:
        # Its own handles only: a shared link reports every federation's (looking through
        # those would cost each federation the whole link's handles per batch).
        for (service, handle), query in self._of.items():
            if service not in detections:
                continue
            for d in detections[service].get(handle, ()):
                for leaf in query.leaves:
                    self.runner.notify(leaf, d)

    def _ticks_until(self, time: int) -> dict[str, list[Event]]:
        """Per link, the ticks up to ``time`` not published yet, of the time classes it needs
        (in time order, classes in the document's order at one instant)."""
        start = self.runner.start
        if start is None or not self._clocks:
            return {}
        every = self._every
        due_next = self._next
        for name in dict.fromkeys(c for names in self._clocks.values() for c in names):
            if name not in due_next:
                due_next[name] = next_tick(every[name], start)
        made: list[tuple[str, Event]] = []
        while due_next and (due := min(due_next.values())) <= time:
            for name, at in due_next.items():
                if at == due:
                    made.append((name, tick_event(name, due, label(due),
                                                  TICK_SEQ + self._ticks)))
                    self._ticks += 1
                    due_next[name] = next_tick(every[name], due)
        return {link: [t for name, t in made if name in names]
                for link, names in self._clocks.items()}


def subscribe_query(link: Link, text: str, shared: bool, owner: str, leaf: int,
                    profile: str) -> Handle:
    """Subscribe the native query ``text`` at ``link`` for leaf number ``leaf`` of ``owner``
    (a federation, or the Spark composer's subscriptions: mediator/placement.py): a memoryless
    one (``shared``) takes the handle subscribed for the same text already, if any (counted:
    the last to let go unsubscribes it, :func:`unsubscribe_query`); at an autonomous service
    under its durable name (:func:`handle_name`). :class:`PushRefused` naming ``profile`` when
    the service refuses the query."""
    found = _SHARED.setdefault(link, {}) if shared else None
    handle, users = found.get(text, ("", 0)) if found is not None else ("", 0)
    if not handle:
        name = handle_name(text, shared, owner, leaf) if link.info.autonomous else ""
        try:
            handle = link.subscribe(text, name)
        except NativeQueryError as exc:
            raise _refused(exc, link.info, profile) from None
    if found is not None:
        found[text] = (handle, users + 1)
    return handle


def unsubscribe_query(link: Link, text: str, handle: Handle,
                      keep: Callable[[Link], bool] = lambda link: False) -> None:
    """Let go of a handle :func:`subscribe_query` gave: unsubscribed at its link once no other
    user holds it — unless ``keep`` names the link (an autonomous service's registrations are
    durable: only let go of here)."""
    shared = _SHARED.get(link, {})
    held, users = shared.get(text, ("", 0))
    if held == handle and users > 1:
        shared[text] = (handle, users - 1)
        return
    if held == handle:
        del shared[text]
    if not keep(link):
        link.unsubscribe(handle)


_TIME = attrgetter("time")

def publish(links: Mapping[str, Link], events: Sequence[Event],
            ticks: Mapping[str, Sequence[Event]], until: int | None = None
            ) -> dict[str, dict[Handle, list[Detection]]]:
    """A batch to every fed link that has something to do: the events its service observes
    (its coverage) and the ticks asked of it (once per (type, time)), in key order. A link
    whose part ends before the batch's newest instant has its clock run to just before it, so
    that every link has reported every instant before the newest; with ``until``, every link's
    clock is run there."""
    newest = max(map(_TIME, events), default=None)  # (map: no Python per event)
    out: dict[str, dict[Handle, list[Detection]]] = {}
    for name, link in links.items():
        if link.info.autonomous:
            continue  # its producers publish to it, never the mediator
        observed = [e for e in events if link.info.coverage.observes(e)]
        asked = {(t.type, t.time): t for t in ticks.get(name, ())}
        batch = sorted([*observed, *asked.values()], key=lambda e: e.key)
        last = batch[-1].time if batch else None
        clock = until
        if newest is not None and (last is None or last < newest):
            clock = newest - 1 if clock is None else max(clock, newest - 1)
        if clock is not None and last is not None and clock < last:
            clock = None  # its own events run its clock that far
        # (At clock == last its events do not: an engine that has work at the end of an
        # instant — an end-of-interval profile at a peer — reports that instant only once its
        # clock has passed it, found by the fidelity search.)
        if batch or clock is not None:
            out[name] = link.publish(batch, clock)
    return out


def _refused(exc: NativeQueryError, info: ServiceInfo, profile: str) -> PushRefused:
    named = "" if info.name == info.group else f" {info.name!r}"
    return PushRefused(
        f"profile {profile}: the {info.group} service{named} ({exc.language}) refuses the query "
        f"the mediator would subscribe for it: {exc.message} (see docs/backends.md, Limits; "
        f"'evamed explain --group {info.group}' shows the query)")


RELAXED = "Relaxed"
"""The class name a relaxed query is rendered with (the same for every federation, so that
their texts are equal and share one registration)."""


def relaxation(expr: ast.Expr, doc: ast.Document) -> ast.Document | None:
    """A primitive class relaxed to the types it requires (and the sources it pins), as a
    document of that one class: a superset of its events that many classes of the same types
    share. None when the class names no type (nothing to share: the class is subscribed as it
    is) or is already that test."""
    if not isinstance(expr, ast.Prim):
        return None
    classes = doc.class_map()
    body = classes[expr.name].body
    if isinstance(body, ast.Every):
        return None
    types = required_types(body, classes)
    if types is None:
        return None
    sources = required_values(body, classes, "source")
    test: ast.Predicate = ast.Compare("type", "in", tuple(sorted(types)))
    if sources is not None:
        test = ast.And(test, ast.Compare("source", "in", tuple(sorted(sources))))
    return ast.Document((ast.ClassDef(RELAXED, test),),
                        (ast.Profile(RELAXED + "Filter", ast.Prim(RELAXED), None,
                                     ast.Evaluation.CONTINUOUS),))


def memoryless(leaf: Leaf, doc: ast.Document, link: Link) -> bool:
    """Whether the service answers ``leaf``'s query for each event from that event alone, so
    that one subscription may serve every federation that subscribes the same text: a class
    of events (not a time class, whose ticks each federation asks for itself), at a service
    that is not a peer mediator (whose profile may be partitioned, evaluated at the end of
    intervals, or drop an id it has seen)."""
    expr = leaf.expr
    return (isinstance(expr, ast.Prim) and link.info.group != "cg5"
            and not isinstance(doc.class_map()[expr.name].body, ast.Every))


def language_refuses(doc: ast.Document, languages: Mapping[str, Language]) -> Refuses:
    """The planner's check that a service's language takes the query it would be subscribed
    (:data:`transforms.federated.Refuses`): rendered by the group's dialect and parsed by
    ``languages[name]`` — the very checks of its limits (bracket depth, chain length, query
    size) the service applies — so that a subtree it refuses is composed at the mediator
    instead of failing the profile (``replay --via`` exited 2)."""

    def refuses(info: ServiceInfo, remote: Remote, profile: ast.Profile, root_eoi: bool) -> str:
        lang = languages.get(info.name)
        if lang is None:
            return ""
        text = dialect(info.group).render(remote.target, doc, profile, root_eoi)
        if len(text) <= MAX_DEPTH:
            # Within every limit: each level of nesting takes a character at least, and the
            # size limit is far above. Not parsed (a parse costs 0.1–0.6 ms, at every
            # registration of every profile).
            return ""
        try:
            lang.parse(text)
        except NativeQueryError as exc:
            return (f"its language ({exc.language}) refuses the query for it — {exc.message} — "
                    "so it is composed at the mediator")
        return ""

    return refuses


def through_group(language: Language, doc: ast.Document, profiles: list[str] | None = None, *,
                  transport: Connect | None = None, tick: int = 1_000_000,
                  start: int | None = None, end: int | None = None) -> Federation:
    """Every profile (``profiles``: only these) planned for ``language``'s service alone — one
    service observing every event — and subscribed there: in process, or through
    ``transport`` (what ``replay --via`` runs)."""
    info = ServiceInfo(language.group, language.group, language.capability)
    refuses = language_refuses(doc, {info.name: language})
    plans = [plan_federated(p, doc, [info], refuses=refuses) for p in doc.profiles
             if profiles is None or p.name in profiles]
    link = SubscriptionLink(info, transport or in_process(language))
    return Federation(doc, plans, {info.name: link}, tick=tick, start=start, end=end)


def via(language: Language, doc: ast.Document, events: Iterable[Event], *,
        profiles: list[str] | None = None, start: int | None = None, end: int | None = None,
        tick: int = 1_000_000, transport: Connect | None = None
        ) -> tuple[list[Notification], list[Plan], list[str]]:
    """Every profile through the whole transformation path to ``language``'s service: the
    notifications (equal to plain replay), the plans, and the native queries subscribed.
    ``events`` stream through in key order (time, then arrival), as the runner takes them;
    an event out of that order is refused (:class:`ValueError`) rather than collected and
    sorted."""
    federation = through_group(language, doc, profiles, transport=transport, tick=tick,
                               start=start, end=end)
    rendered = federation.rendered
    out: list[Notification] = []
    try:
        for event in events:
            # A batch of one: each event is decided on before the next is drawn (a stream).
            out.extend(federation.push([event]))
        out.extend(federation.close(end))
    finally:
        federation.unsubscribe()
    return out, federation.plans, rendered
