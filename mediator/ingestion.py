"""Ingestion: the mediator's own feed — the event log, as the pipeline reads it.

What ``Publish`` and the brokers' sources accept is appended to the store's event log (durably,
before the reply), **in arrival order**: the door (mediator/door.py) admits an event within the
allowed lateness even when it is older than the newest. :class:`OwnFeed` reads the log in
batches after a position, decodes each line and puts it in the **reorder buffer**
(:class:`eva.admission.Reorder`): it hands the pipeline the events in time order (arrival order
within an instant) once the watermark — the newest event time read minus the lateness, or an
advance given with ``advance`` once every event logged before it is read — has passed them. A
line that cannot be read, or one behind what was already handed on (the log written under a
smaller lateness, or a full buffer), is skipped and kept in the dead-letter log (source
``mediator``). Its watermark, for the plans that take the own feed, is the reorder buffer's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time as clock
from collections.abc import Callable
from functools import partial
from typing import Any

from eva.admission import CAPACITY, Reason, Reorder, put_events
from eva.events import Event, EventError, from_json_line, read_texts
from mediator.dead_letters import MEDIATOR, DeadLetterLog, Letter
from mediator.inputs import State
from mediator.metrics import Metrics
from mediator.store.base import LoggedEvent, Store

log = logging.getLogger("mediator.pipeline")

_LOGGED = partial(tuple.__new__, LoggedEvent)
"""``LoggedEvent(position, line)`` of a pair without the named tuple's Python-level
``__new__`` (a third of the cost, once per event)."""
DECODED = 20_000
"""Events the door decoded that the own feed keeps until it reads their positions."""
NEWEST_KEY = "pipeline.newest"
"""Store meta: the newest event time evaluated, kept across trims of the event log."""


class OwnFeed:
    """The event log after ``position`` (see the module docstring); ``idle``: seconds without
    a new event or watermark after which it stops holding back plans that also use autonomous
    services (only while its reorder buffer is empty: what the log holds is never passed by);
    ``lateness``: µs the reorder buffer holds an event (the longest of the door's lanes);
    ``capacity``: the buffer's size; ``letters``: where the lines it skips are kept."""

    def __init__(self, store: Store, metrics: Metrics | None = None, idle: float = 5.0,
                 lateness: int = 0, capacity: int = CAPACITY,
                 letters: DeadLetterLog | None = None,
                 now: Callable[[], int] | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.idle = idle
        self.lateness = lateness
        self.letters = letters
        # ``now``: the mediator's clock, so an event ahead of it waits for its time instead of
        # moving the watermark there (eva/admission.py, Reorder).
        self.reorder: Reorder[Event] = Reorder(lateness, capacity, now)
        self.position = 0
        """The last event-log position read."""
        self.newest: int | None = None
        """The newest event time handed on (or the newest watermark applied)."""
        self.sealed = False
        """The newest time is a watermark's: its instant is complete."""
        self.logged: int | None = None
        """The newest event time the log held at start (for ``newest``)."""
        self._watermarks: list[tuple[int, int]] = []  # (log head when given, time)
        self._decoded: dict[int, tuple[str, Event]] = {}
        """Events the door decoded, by log position with their line (:meth:`hand`)."""
        self._marks = threading.Lock()  # advance() never waits on a batch
        self._origin: int | None = None
        self._moved = clock.monotonic()

    def start(self, position: int) -> None:
        """Read after ``position`` from now on; what the log held is noted."""
        self.position = position
        head = self.store.event_head()
        found = [int(v)] if (v := self.store.get_meta(NEWEST_KEY)) is not None else []
        for logged in self.store.read_events(after=max(head - 1, 0), limit=1):
            with contextlib.suppress(EventError):
                found.append(from_json_line(logged.line).time)
        self.logged = max(found, default=None)

    def hand(self, head: int, lines: list[str], events: list[Event]) -> None:
        """The door appended ``lines`` (decoded: ``events``) durably as the log's entries up
        to ``head`` (one transaction took those positions: they hold these lines whoever else
        appends): :meth:`read` takes them from here instead of reading the log back and
        decoding each line a second time — half of the feed's time. Bounded: a feed that
        lags far behind reads what is not kept here from the log, as before."""
        decoded = self._decoded
        if len(decoded) + len(events) > DECODED:
            # Entries at or before the position are stale: the feed read those positions back
            # from the log while they were being handed. (list() copies the keys in one step:
            # the feed's thread pops meanwhile.)
            position = self.position
            for stale in [key for key in list(decoded) if key <= position]:
                decoded.pop(stale, None)
            if len(decoded) + len(events) > DECODED:
                # The feed lags: it reads these from the log as before, and keeps what it
                # will read first (clearing those instead had it read everything back).
                return
        first = head - len(lines) + 1
        for i, line in enumerate(lines):
            if first + i > self.position:  # else read already (decoded from the log)
                decoded[first + i] = (line, events[i])

    def read(self, limit: int) -> tuple[list[LoggedEvent], list[Event]]:
        """The next entries of the log (at most ``limit``) and the events now due, in time
        order, each numbered by its position (its arrival order); a line that cannot be read,
        or one behind what was handed on already, is skipped and kept as a dead letter. The
        position moves once they are evaluated (the caller sets it): a batch whose evaluation
        fails is read again by the next start."""
        decoded = self._decoded
        lines: list[str] = []
        known: list[Event | EventError] = []
        first = position = self.position + 1
        last = self.position + limit
        pop = decoded.pop
        while position <= last and (entry := pop(position, None)) is not None:
            lines.append(entry[0])
            known.append(entry[1])
            position += 1
        logged = list(map(_LOGGED, zip(range(first, position), lines, strict=True)))
        if not logged and limit > 0:
            logged = self.store.read_events(after=self.position, limit=limit)
            # The door hands a batch once its append has returned: the log may hold it first.
            # What it handed meanwhile is taken (a position holds one line, whoever wrote it),
            # the rest decoded in one compiled loop.
            handed = [decoded.pop(item.position, None) for item in logged]
            fresh = iter(read_texts([item.line for item, entry in zip(logged, handed, strict=True)
                                     if entry is None]))
            known = [next(fresh) if entry is None else entry[1] for entry in handed]
        letters: list[Letter] = []
        self.reorder.freeze()  # the clock read once for the batch
        try:
            out = self._order(logged, known, letters)
        finally:
            self.reorder.thaw()
        if letters:
            self._dead_letters(letters, len(logged))
        self._handed(out)
        return logged, out

    def _order(self, logged: list[LoggedEvent], known: list[Event | EventError],
               letters: list[Letter]) -> list[Event]:
        """The batch's events (``known``: each entry's, or why its line is not one) through
        the reorder buffer: what is due, in time order; a line that cannot be read, or is
        behind what was handed on, is a letter."""
        out: list[Event] = []
        reorder = self.reorder
        positions = [item.position for item in logged]
        passed = False
        i = 0
        while True:
            stop = put_events(reorder, known, positions, i, out)
            if stop > i:
                if self._origin is None:
                    first = known[i]
                    assert isinstance(first, Event)
                    self._origin = first.time - self.lateness - 1
                passed = True
            if stop == len(known):
                break
            self._refuse(logged[stop], known[stop], letters)
            i = stop + 1
        if passed:
            self._moved = clock.monotonic()
        return out

    def _refuse(self, item: LoggedEvent, decoded: Event | EventError,
                letters: list[Letter]) -> None:
        """A letter for an entry :func:`put_events` stopped at: not an event, or behind."""
        if isinstance(decoded, EventError):
            log.error("event-log position %d skipped: %s", item.position, decoded)
            letters.append(Letter(Reason.MALFORMED, MEDIATOR, str(decoded), item.line,
                                  where=f"event-log position {item.position}"))
            return
        why = self.reorder.behind(decoded.time)
        log.error("event-log position %d (id %r) skipped: its time lies %s",
                  item.position, decoded.id, why)
        letters.append(Letter(Reason.LATE, MEDIATOR, f"event time lies {why}: the "
                              "reader hands events on in time order and had passed it "
                              "(a line another writer appended, a log written under a "
                              "longer lateness, or a full reorder buffer)", item.line,
                              event_id=decoded.id,
                              where=f"event-log position {item.position}"))

    def _handed(self, events: list[Event]) -> None:
        if events and (self.newest is None or events[-1].time >= self.newest):
            self.newest, self.sealed = events[-1].time, False

    def _dead_letters(self, letters: list[Letter], of: int) -> None:
        if self.letters is not None:
            self.letters.record(letters, of)
        elif self.metrics:
            for letter in letters:
                self.metrics.dead_letters.labels(MEDIATOR, str(letter.reason)).inc()

    def advance(self, time: int) -> None:
        """A watermark: no event at or before ``time`` will come any more. Applied once the
        events logged before it are read (:meth:`due`). Thread-safe."""
        with self._marks:
            self._watermarks.append((self.store.event_head(), time))

    def due(self) -> tuple[list[Event], int | None]:
        """The newest watermark whose events are all read, if it moves the feed on: the events
        the reorder buffer hands on for it (in time order) and its time (then applied: the
        newest time is sealed)."""
        with self._marks:
            due = [t for head, t in self._watermarks if head <= self.position]
            self._watermarks = [(h, t) for h, t in self._watermarks if h > self.position]
        if not due:
            return [], None
        time = max(due)
        out = self.reorder.advance(time)
        self._handed(out)
        if self.newest is not None and time < self.newest:
            return out, None
        self.newest, self.sealed = time, True  # an event at or before it is late
        self._moved = clock.monotonic()
        return out, time

    def kept_from(self) -> int:
        """The first event-log position the feed still needs (the oldest event its reorder
        buffer holds; else the one after the last read): the log may be trimmed below it."""
        held = [e.seq for e in self.reorder.held()]
        return min(held) if held else self.position + 1

    def origin(self) -> int | None:
        """The time before its first event after the start position (None: none yet)."""
        if self._origin is None:
            for logged in self.store.read_events(after=self.position, limit=1):
                with contextlib.suppress(EventError):
                    self._origin = from_json_line(logged.line).time - self.lateness - 1
        return self._origin

    def state(self, peek: bool = False) -> State:
        """Its progress, as :func:`mediator.inputs.bound` takes it (``peek``: its origin found
        in the log if no event was read yet): the reorder buffer's watermark; idle when it has
        not moved for ``idle`` seconds and the buffer is empty."""
        watermark = self.reorder.watermark
        if self.sealed and self.newest is not None and (watermark is None
                                                         or self.newest > watermark):
            watermark = self.newest
        idle = clock.monotonic() - self._moved >= self.idle and not len(self.reorder)
        return State(watermark, self.origin() if peek else self._origin, idle)

    def progress(self) -> tuple[State, int, int]:
        """For ``evamed status``, from any thread, changing nothing: its state, the last
        event-log position read and the log's head."""
        return self.state(), self.position, self.store.event_head()

    def known_newest(self) -> int | None:
        """The newest event time in the log as far as the feed knows (read, or there at
        start)."""
        times = [t for t in (self.newest, self.logged) if t is not None]
        return max(times, default=None)

    def export_state(self) -> dict[str, Any]:
        """Where it stands, for a checkpoint: the last position read, the newest time handed
        on, and its reorder buffer — the positions it holds (read, not yet handed on: read
        again from the log by :meth:`restore`) and its times."""
        r = self.reorder
        return {"position": self.position, "newest": self.newest, "sealed": self.sealed,
                "held": sorted(e.seq for e in r.held()),
                "reorder": [r.newest, r.released, r.advanced]}

    def restore(self, state: dict[str, Any]) -> int:
        """Take up :meth:`export_state` (after :meth:`start` at its position): the held events
        are read again from the log and held again, in their arrival order; how many of them
        the log no longer had."""
        self.newest, self.sealed = state["newest"], state["sealed"]
        held = state.get("held") or []
        found: list[Event] = []
        if held:
            wanted, after = set(held), held[0] - 1
            while after < held[-1]:
                batch = self.store.read_events(after=after, limit=min(10_000, held[-1] - after))
                if not batch:
                    break
                for item in batch:
                    if item.position in wanted:
                        with contextlib.suppress(EventError):
                            found.append(from_json_line(item.line, item.position))
                after = batch[-1].position
        r = self.reorder
        r.newest, r.released, r.advanced = state["reorder"]
        for event in found:  # (each lies after the buffer's bound: none is due now)
            r.put(event.time, event)
        if found and self._origin is None:
            self._origin = min(e.time for e in found) - self.lateness - 1
        return len(held) - len(found)

    def keep(self) -> None:
        """Keep the newest time across trims of the log (and restarts)."""
        if self.newest is not None:
            self.store.set_meta(NEWEST_KEY, str(self.newest))


__all__ = ["NEWEST_KEY", "OwnFeed"]
