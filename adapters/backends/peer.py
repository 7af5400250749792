"""CG-5: a peer mediator — the EVA language itself, with its full semantics.

The native query is an EVA profile document (classes and profiles, docs/language.md), evaluated
by the incremental engine. A native notification is the peer's composite: the constituent
CloudEvents plus, in ``extra``, the occurrence as the engine knows it (identity, order key,
report key, partition, constituent ids including time events and absences), so the mediator
can take the peer's answer over exactly.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from adapters.backends.native import EventRejected, NativeQueryError, check_size
from eva import ast
from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import Event
from eva.notify import tuples_to_json
from eva.parser import ProfileError, parse
from eva.retention import reach
from eva.semantics import Notification, source_and_id
from transforms.capability import CG5, Capability
from transforms.dialects.base import Detection

log = logging.getLogger("evamed.peer")


def constituent_age(doc: ast.Document, tick: int) -> int | None:
    """How far (µs) before the instant it is reported at a constituent of any of ``doc``'s
    occurrences can lie; None when nothing bounds it: the sum of the profiles'
    :func:`~eva.retention.reach` (which bounds every path of each tree), plus one tick for the
    clock's granularity. Unbounded also in end-of-interval evaluation (a result waits until
    its interval closes)."""
    total = tick
    for profile in doc.profiles:
        if profile.evaluation is ast.Evaluation.END_OF_INTERVAL:
            return None
        bound = reach(profile.expr)
        if bound is None:
            return None
        total += bound
    return total


def primitives(ident: Hashable) -> list[tuple[str, str]]:
    """(source, id) of each primitive event an occurrence's identity names, in operand order
    (the order of ``Occ.events``). The identities are built by :mod:`eva.semantics`:
    a primitive is ``((source, id), time)``, a composite ``(tag, left, right)``, a tick ``("tick",
    name, time)`` and an absence ``("not", tag, time[, anchor])`` — whose anchor is not one of
    its constituents. Iterative: a composite may nest deeper than Python's stack."""
    out: list[tuple[str, str]] = []
    stack = [ident]
    while stack:
        item = stack.pop()
        if not isinstance(item, tuple):
            continue
        if len(item) == 2:
            pair = source_and_id(item)  # ((source, id), time) since identities hold the time
            if pair is not None:
                out.append(pair)
        elif len(item) == 3 and isinstance(item[1], tuple):
            stack.append(item[2])
            stack.append(item[1])
    return out


class Evaluator:
    def __init__(self, doc: ast.Document, config: EngineConfig) -> None:
        self._letters: list[DeadLetter] = []
        self._engine = Engine(config, self._letters.append)
        self._engine.add_document(doc)
        self._lateness = config.allowed_lateness
        # The events a notification may still name as constituents, by (source, id) as an
        # occurrence's identity names them (CloudEvents: source and id identify an event; an
        # id alone does not). Only events the engine admitted: a refused duplicate must not
        # replace its original. Kept for the query's constituent age behind the clock (the
        # newest event or advance: no instant before it is still to be reported), in arrival
        # order.
        self._events: dict[tuple[str, str], Event] = {}
        self._arrived: deque[Event] = deque()
        self._keep = constituent_age(doc, config.tick)
        self._clock: int | None = None
        # Each source's newest admitted event time, as the engine's watermarks see them
        # (``reach``); sources declared in advance hold the clock back until they report.
        self._newest: dict[str, int] = dict.fromkeys(config.sources, -(2**62))

    def _detections(self, notes: list[Notification]) -> list[Detection]:
        out = []
        events = self._events
        for n in notes:
            occ = n.occ
            extra = {"profile": n.profile, "partition": n.partition, "ident": tuples_to_json(occ.ident),
                     "key": tuples_to_json(occ.key), "emitted": tuples_to_json(n.emitted),
                     "events": list(occ.events), "anchor": tuples_to_json(occ.anchor)}
            constituents = tuple(events[k] for k in primitives(occ.ident) if k in events)
            out.append(Detection(occ.time, constituents, f"{n.profile}{list(occ.events)}", extra))
        return out

    def push(self, event: Event) -> list[Detection]:
        """The event's detections; :class:`EventRejected` with the engine's reason (late,
        duplicate, future, …) when the engine does not admit it."""
        letters = self._letters
        letters.clear()
        notes = self._engine.push(event)
        for letter in letters:
            if letter.event is event:  # refused: the engine reported nothing for it
                raise EventRejected(letter.reason, letter.detail)
        self._report(letters)
        self._events[(event.source, event.id)] = event
        if self._keep is not None:
            self._arrived.append(event)
        newest = self._newest.get(event.source)
        if newest is None or event.time > newest:
            self._newest[event.source] = event.time
        out = self._detections(notes)
        # Not the event's own time: the engine reports an instant only once every source has
        # passed it (``reach``), so with a lagging source an occurrence at an earlier instant
        # is still to be reported, and needs its events.
        self._forget(min(self._newest.values()) - self._lateness)
        return out

    def advance(self, time: int) -> list[Detection]:
        self._letters.clear()
        out = self._detections(self._engine.close(time))
        self._report(self._letters)
        self._forget(time)
        return out

    def next_instant(self) -> int | None:
        return self._engine.next_instant()

    def reach(self, event: Event) -> int | None:
        """How far pushing ``event`` runs the engine's clock (every instant up to the result
        completes), None if it does not: the engine's own frontier — every source's newest
        time, this event's included, less the allowed lateness, less one. A service may run
        the clock there in slices before the push; further would declare the instants of a
        lagging source complete, which the push itself does not. None too for an event the
        engine would refuse (``admits``): its push moves no clock, so nothing may move it
        before (a refused copy of an event hours later stepped the clock past a pending
        absence, and the real event that came next was late)."""
        newest = self._newest
        own = newest.get(event.source)
        if self._engine.origin is None or (own is not None and event.time <= own):
            return None  # the first event starts the clock; a source's older event moves nothing
        if not self.admits(event):
            return None
        times = [t for s, t in newest.items() if s != event.source]
        return min([event.time, *times]) - self._lateness - 1

    def admits(self, event: Event) -> bool:
        """Whether the engine's ``push`` would admit ``event`` now (no side effects)."""
        return self._engine.would_admit(event)

    def _report(self, letters: list[DeadLetter]) -> None:
        """Dead letters that are not about the pushed event (``state_cap``: the engine evicted
        stored occurrences) change no count of the service: they go to its log."""
        for letter in letters:
            log.warning("%s: %s", letter.reason, letter.detail)

    def _forget(self, now: int) -> None:
        """Drop the events no occurrence reported from ``now`` on can contain."""
        if self._keep is None or self._engine.origin is None:
            return  # unbounded, or the clock has not started (no event yet)
        if self._clock is None or now > self._clock:
            self._clock = now
        oldest = self._clock - self._keep
        arrived = self._arrived
        events = self._events
        while arrived and arrived[0].time < oldest:
            event = arrived.popleft()
            key = (event.source, event.id)
            if events.get(key) is event:  # not a later copy admitted after its id was forgotten
                del events[key]


@dataclass(frozen=True)
class PeerQuery:
    text: str
    doc: ast.Document
    config: EngineConfig = field(default_factory=EngineConfig)

    def evaluator(self) -> Evaluator:
        return Evaluator(self.doc, self.config)


class PeerLanguage:
    name = "eva"
    group = "cg5"
    capability: Capability = CG5

    def __init__(self, tick: int = 1_000_000) -> None:
        self.config = EngineConfig(tick=tick)

    def parse(self, text: str) -> PeerQuery:
        # The size limit every native language shares; nesting is bounded by the EVA parser's
        # own limits (docs/language.md), which do not recurse.
        check_size(self.name, text)
        try:
            doc = parse(text, "<query>")
        except ProfileError as exc:
            raise NativeQueryError(self.name, exc.message, exc.line, exc.column, text) from None
        if not doc.profiles:
            raise NativeQueryError(self.name, "the query defines no profile", 1, 1, text)
        return PeerQuery(text, doc, self.config)
