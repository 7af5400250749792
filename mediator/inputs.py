"""Inputs: what the autonomous services say, from their sessions to the pipeline.

An autonomous service's messages (:mod:`adapters.service_link`) arrive in its session's thread.
:class:`ServiceFeed` appends each one to the service's **link log** in the store — durably —
and only then acknowledges it to the service, so a restart resumes the session after the newest
message logged: nothing lost, nothing twice. The pipeline's thread reads the link log in order
(:meth:`ServiceFeed.read`) and takes the service's progress — its watermark, carried by every
message and by the heartbeats between them — once it has read the entries that came before it
(:meth:`ServiceFeed.state`).

A logged message holds the detections with their constituents as the service sent them, in
full, and each constituent's arrival number at the service; read back, each constituent is
keyed into the merged trace by the service's rank (:func:`adapters.federation.merged_seq`): at
one instant the own feed's events come first, then each service's in the configured order.

**Idle**: a service that is connected but whose watermark has not moved for its idle timeout
stops holding back the decisions of the plans that use it (:func:`bound`); what it reports
later behind an instant decided meanwhile is a ``late`` dead letter. A service that cannot be
reached is not idle: it holds them back until it is back (its session keeps what it sends).
"""

from __future__ import annotations

import logging
import threading
import time as clock
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from adapters.client import cloudevent_json
from adapters.federation import merged_seq
from adapters.links import Handle
from adapters.service_link import AutonomousLink, Message
from eva import ast
from eva.classes import ClassIndex
from eva.events import EventError, from_json_line
from mediator.store.base import Store
from transforms.dialects.base import Detection

log = logging.getLogger("mediator.inputs")

ORIGIN_KEY = "link.{name}.origin"
"""Store meta: a service's origin (the time before its first event, as its session said)."""


@dataclass(frozen=True)
class Notice:
    """One logged message of a service, read back."""

    position: int
    detections: list[tuple[Handle, Detection]]
    watermark: int | None
    origin: int | None


def encode(message: Message) -> bytes:
    """A session's message as its link log entry."""
    return orjson.dumps({
        "w": message.watermark, "o": message.origin,
        "d": [[handle, d.text, d.time, [cloudevent_json(e) for e in d.constituents],
               [e.seq for e in d.constituents], d.extra] for handle, d in message.detections]})


def decode(position: int, payload: bytes, rank: int) -> Notice:
    """A link log entry as the detections it holds, each constituent keyed into the merged
    trace by its service's ``rank``; ValueError for an entry that is not one."""
    try:
        fields = orjson.loads(payload)
        detections = [
            (str(handle), Detection(int(time), tuple(
                from_json_line(line, merged_seq(rank, max(int(arrival), 0)))
                for line, arrival in zip(lines, arrivals, strict=True)), str(text), dict(extra)))
            for handle, text, time, lines, arrivals, extra in fields["d"]]
        watermark, origin = fields.get("w"), fields.get("o")
        return Notice(position, detections, None if watermark is None else int(watermark),
                      None if origin is None else int(origin))
    except (orjson.JSONDecodeError, EventError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"link log entry {position} cannot be read: {exc}") from None


@dataclass(frozen=True)
class State:
    """An input's progress as the pipeline decides with it."""

    watermark: int | None  # every instant up to it reported (None: nothing yet)
    origin: int | None     # the time before its first event (None: not known yet)
    idle: bool             # connected, but its watermark has not moved for its idle timeout


def bound(states: Sequence[State]) -> int | None:
    """Up to where the inputs have reported everything: the smallest watermark of those not
    idle (None while one of them has none yet); once all are idle, the largest they have —
    a silent input stops holding the others back."""
    live = [s.watermark for s in states if not s.idle]
    if live:
        return None if None in live else min(w for w in live if w is not None)
    known = [s.watermark for s in states if s.watermark is not None]
    return max(known) if known else None


class Takers:
    """Who takes one registration's detections: the federations holding its handle. A relaxed
    registration (the types of many classes, :func:`adapters.federation.relaxation`) hands an
    event only to those one of whose classes it is of — found with the predicate index, so an
    event costs the federations it concerns, not every one holding the registration."""

    def __init__(self) -> None:
        self.every: list[tuple[Any, Any]] = []  # (subscription, federation): all it reports
        self._index = ClassIndex()
        self._by_id: dict[int, list[tuple[Any, Any]]] = {}

    def add(self, user: tuple[Any, Any], classes: list[ast.Predicate] | None) -> None:
        if classes is None:
            self.every.append(user)
            return
        for pred in classes:
            self._by_id.setdefault(self._index.add(pred, {}), []).append(user)

    def remove(self, federation: Any) -> None:
        self.every = [u for u in self.every if u[1] is not federation]
        for ident in list(self._by_id):
            kept = [u for u in self._by_id[ident] if u[1] is not federation]
            if kept:
                self._by_id[ident] = kept
            else:
                del self._by_id[ident]
                self._index.release(ident)

    def __bool__(self) -> bool:
        return bool(self.every or self._by_id)

    def of(self, detection: Detection) -> list[tuple[Any, Any]]:
        """The users a detection goes to (each once, in the order they came)."""
        if not self._by_id:
            return self.every
        found: dict[int, tuple[Any, Any]] = {id(u[1]): u for u in self.every}
        for event in detection.constituents:
            for ident in self._index.match(event):
                for user in self._by_id.get(ident, ()):
                    found.setdefault(id(user[1]), user)
        return list(found.values())


class ServiceFeed:
    """An autonomous service as an input of the pipeline: its link (the session), its link log
    and its progress. ``rank``: its place among the inputs (1, 2, … in the configured order);
    ``idle``: its idle timeout in seconds; ``wake``: the pipeline's, called when it has
    something new."""

    def __init__(self, link: AutonomousLink, store: Store, rank: int, idle: float,
                 wake: Callable[[], None]) -> None:
        self.link = link
        self.name = link.info.name
        self.store = store
        self.rank = rank
        self.idle = idle
        self.wake = wake
        self.position = 0
        """The last link-log position the pipeline has read."""
        self.lost = 0
        """Times the service dropped the session (what it held then was lost)."""
        self._lock = threading.Lock()
        self._head, _ = store.link_bounds(self.name)
        self._marks: deque[tuple[int, int]] = deque()  # (position, watermark): not read yet
        self._watermark: int | None = None
        known = store.get_meta(ORIGIN_KEY.format(name=self.name))
        self._origin: int | None = int(known) if known is not None else None
        self._moved = clock.monotonic()

    def start(self) -> None:
        """Open the session, after the newest message logged."""
        _, newest = self.store.link_bounds(self.name)
        self.link.start(self._message, self._lost, newest)

    def _message(self, message: Message) -> None:
        """A message of the session (its thread): logged, then acknowledged."""
        head = self._head
        if message.seq > 0:
            head, newest = self.store.append_link(self.name, [(message.seq, encode(message))])
            self.link.ack(newest)
        with self._lock:
            self._head = head
            if message.watermark is not None:
                self._marks.append((head, message.watermark))
            if message.origin is not None and self._origin is None:
                self._origin = message.origin
                self.store.set_meta(ORIGIN_KEY.format(name=self.name), str(message.origin))
        self.wake()

    def _lost(self, reason: str) -> None:
        self.lost += 1
        self.store.renumber_link(self.name)  # the new session numbers from 1

    def read(self, limit: int) -> list[Notice]:
        """The next entries of the link log (those that cannot be read are said and skipped)."""
        out = []
        for entry in self.store.read_link(self.name, self.position, limit):
            try:
                out.append(decode(entry.position, entry.payload, self.rank))
            except ValueError as exc:
                log.error("service %s: %s; skipped", self.name, exc)
            self.position = entry.position
        return out

    @property
    def watermark(self) -> int | None:
        """The watermark of what the pipeline has read."""
        return self._watermark

    def restore(self, watermark: int | None) -> None:
        """A checkpoint's progress: read up to :attr:`position` with that watermark."""
        self._watermark = watermark

    def heard(self, notice: Notice) -> None:
        """An entry read: its progress taken."""
        self._advance(notice.watermark)

    def state(self) -> State:
        """Its progress: the watermarks of what the pipeline has read."""
        with self._lock:
            while self._marks and self._marks[0][0] <= self.position:
                self._advance(self._marks.popleft()[1])
            origin = self._origin
        now = clock.monotonic()
        idle = now - self._moved >= self.idle and self.link.status() == "SERVING"
        return State(self._watermark, origin, idle)

    def progress(self) -> tuple[State, int, int]:
        """For ``evamed status``, from any thread, changing nothing: its state — the newest
        watermark the service reported, also in messages the pipeline has not read yet —, the
        last link-log position read and the log's head."""
        with self._lock:
            head, origin = self._head, self._origin
            reported = [w for _, w in self._marks]
        known = [w for w in (self._watermark, *reported) if w is not None]
        idle = (clock.monotonic() - self._moved >= self.idle
                and self.link.status() == "SERVING")
        return State(max(known, default=None), origin, idle), self.position, head

    def _advance(self, watermark: int | None) -> None:
        if watermark is not None and (self._watermark is None or watermark > self._watermark):
            self._watermark = watermark
            self._moved = clock.monotonic()


__all__ = ["Notice", "ServiceFeed", "State", "Takers", "bound", "decode", "encode"]
