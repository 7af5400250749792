"""Ingestion: the mediator's own feed — the event log, as the pipeline reads it.

What ``Publish`` and the brokers' sources accept is appended to the store's event log (durably,
before the reply); the log's order is the own feed's trace order. :class:`OwnFeed` reads it in
batches after a position, decodes each line (a line that cannot be read, or one out of time
order, is skipped and counted as a dead letter), and keeps the own feed's progress: its
watermark is the newest event time read less one (another event of that instant may follow),
or a watermark given with ``advance`` once every event logged before it is read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time as clock

from eva.events import Event, EventError, from_json_line
from mediator.inputs import State
from mediator.metrics import Metrics
from mediator.store.base import LoggedEvent, Store

log = logging.getLogger("mediator.pipeline")

NEWEST_KEY = "pipeline.newest"
"""Store meta: the newest event time evaluated, kept across trims of the event log."""


class OwnFeed:
    """The event log after ``position`` (see the module docstring); ``idle``: seconds without
    a new event or watermark after which it stops holding back plans that also use autonomous
    services."""

    def __init__(self, store: Store, metrics: Metrics | None = None, idle: float = 5.0) -> None:
        self.store = store
        self.metrics = metrics
        self.idle = idle
        self.position = 0
        """The last event-log position read."""
        self.newest: int | None = None
        """The newest event time read (or the newest watermark applied)."""
        self.sealed = False
        """The newest time is a watermark's: its instant is complete."""
        self.logged: int | None = None
        """The newest event time the log held at start (for ``newest``)."""
        self._watermarks: list[tuple[int, int]] = []  # (log head when given, time)
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

    def read(self, limit: int) -> tuple[list[LoggedEvent], list[Event]]:
        """The next entries of the log (at most ``limit``) and their events, numbered by their
        positions (the trace's arrival order); a line that cannot be read, or one before the
        newest read (Publish logs only well-formed events in time order), is skipped, said.
        The position moves once they are evaluated (the caller sets it): a batch whose
        evaluation fails is read again by the next start."""
        logged = self.store.read_events(after=self.position, limit=limit) if limit > 0 else []
        out: list[Event] = []
        for item in logged:
            try:
                event = from_json_line(item.line, item.position)
            except EventError as exc:
                log.error("event-log position %d skipped: %s", item.position, exc)
                self._dead_letter("malformed")
                continue
            if self.newest is not None and (event.time < self.newest or (
                    event.time == self.newest and self.sealed)):
                log.error("event-log position %d (id %r) skipped: its time lies before the "
                          "newest evaluated (or at a watermark); expected the log in time "
                          "order", item.position, event.id)
                self._dead_letter("late")
                continue
            if self._origin is None:
                self._origin = event.time - 1
            self.newest, self.sealed = event.time, False
            self._moved = clock.monotonic()
            out.append(event)
        return logged, out

    def _dead_letter(self, reason: str) -> None:
        if self.metrics:
            self.metrics.dead_letters.labels(reason).inc()

    def advance(self, time: int) -> None:
        """A watermark: no event at or before ``time`` will come any more. Applied once the
        events logged before it are read (:meth:`due`). Thread-safe."""
        with self._marks:
            self._watermarks.append((self.store.event_head(), time))

    def due(self) -> int | None:
        """The newest watermark whose events are all read, if it moves the feed on (then it is
        applied: the newest time is sealed)."""
        with self._marks:
            due = [t for head, t in self._watermarks if head <= self.position]
            self._watermarks = [(h, t) for h, t in self._watermarks if h > self.position]
        if not due:
            return None
        time = max(due)
        if self.newest is not None and time < self.newest:
            return None
        self.newest, self.sealed = time, True  # an event at or before it is late
        self._moved = clock.monotonic()
        return time

    def origin(self) -> int | None:
        """The time before its first event after the start position (None: none yet)."""
        if self._origin is None:
            for logged in self.store.read_events(after=self.position, limit=1):
                with contextlib.suppress(EventError):
                    self._origin = from_json_line(logged.line).time - 1
        return self._origin

    def state(self, peek: bool = False) -> State:
        """Its progress, as :func:`mediator.inputs.bound` takes it (``peek``: its origin found
        in the log if no event was read yet)."""
        watermark = None if self.newest is None else (
            self.newest if self.sealed else self.newest - 1)
        idle = clock.monotonic() - self._moved >= self.idle
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

    def keep(self) -> None:
        """Keep the newest time across trims of the log (and restarts)."""
        if self.newest is not None:
            self.store.set_meta(NEWEST_KEY, str(self.newest))


__all__ = ["NEWEST_KEY", "OwnFeed"]
