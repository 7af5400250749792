"""A base service as a gRPC server: ``evamed base-service --group G --listen ADDR``.

One process per language group (DESIGN §6) serving ``eva.base.v1.BaseService``, the standard
``grpc.health.v1.Health`` and server reflection, on ``grpc.aio``: every call is a task of one
event loop, not a thread, so open subscriptions never use up the server (one client never
stalls the others).

Order: events are evaluated in the order they are published, across clients — one Publish
message at a time holds the order lock (a message is bounded by the receive limit, an explicit
clock advance by ``max_advance``), and the loop is yielded to every few milliseconds, so
Subscribe, Unsubscribe, Capabilities and Health are answered while a publisher is being served.
The lock is never held waiting for a subscriber that stopped reading.

Progress: a Publish message with a ``batch`` number ends, still under the order lock, with a
progress marker queued to every subscription that asked for them, after the message's
detections — so a publisher knows when a service has reported everything a message caused.

Packing (``SubscribeRequest.packed``): a gRPC message costs far more than a detection, so a
subscription that asks gets the detections of one Publish message in one notification, with
its marker (split at ``PACK_DETECTIONS`` / ``PACK_BYTES``). Constituents by reference
(``SubscribeRequest.publisher``): the service remembers where each event of a publisher's
latest ``PublishRequest.keep`` numbered messages came (batch, index) and names such a
constituent by that place instead of writing its JSON — the publisher holds the event.

Robustness (docs/backends.md): a bad query ends its Subscribe with INVALID_ARGUMENT, a short
message and the position as a ``google.rpc.BadRequest`` field violation, never UNKNOWN; a query
over ``MAX_QUERY_BYTES`` is refused before parsing; a malformed event, or one an evaluator
refuses (``EventRejected``), is counted in ``PublishReply.rejected`` and the batch goes on; an
``advance_to_us`` moves a clock at most ``max_advance``; a gap before an event is stepped by the
service itself, unless its clock-driven work covers more than ``max_advance`` (``clock_jump``),
and not at all for an event the evaluator would refuse; the clock moves in slices of
``slice`` that skip to the evaluator's next instant, so a gap costs what it reports and its
detections never pile up; each subscription's
queue is bounded: a publisher waits for a subscriber that is reading (back-pressure, before it
takes the order lock), never for one that has read nothing for ``stall_timeout`` — that one is
dropped with RESOURCE_EXHAUSTED once its queue is full, so it cannot stall the others; a query
whose evaluation passes the evaluators' work or store limit (``native.Exhausted``) is ended
with RESOURCE_EXHAUSTED naming the limit — a session's registration is deregistered and its
session told (``SessionMessage.ended``) — and the event still counts for the others;
Unsubscribe never waits and releases whoever waited on that subscriber; a second server on a
taken port fails to start; shutdown reports NOT_SERVING while it drains.

Durable sessions (``Open``, ``Register``, ``Deregister``, ``Ack``; :mod:`adapters.backends.sessions`
holds their records): for an autonomous service, whose producers publish to it themselves. Each
Publish message is first decided on for the sessions — an event whose (source, id) was accepted
before is a duplicate, one at or before the watermark is late, an advance too far ahead is
refused — and what is accepted is appended to the event log (one transaction, with ``--data``
durable) before anything is evaluated. Then, under the same order lock as the fed path, every
live registration evaluates the logged events (the same stepping as a subscription: catch-up,
push, slices) and its clock is run to the new watermark; at the end, with nothing awaited in
between, each session's detections become its next message(s) and the watermark moves, so a
stream never sends a watermark ahead of the detections it covers. Subscriptions (the fed mode)
see every well-formed event as before, duplicates and late ones too: a mediator that feeds a
service re-publishes events to fresh subscriptions after a reconnection, and ``replay --via``
publishes each event once per query. Session streams never hold the publishers back: messages
are kept until acknowledged, up to ``retention`` per session (then the session is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from operator import methodcaller
from typing import Any

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from adapters.backends import native
from adapters.backends.native import (
    MAX_QUERY_BYTES,
    Detection,
    EventRejected,
    Exhausted,
    Language,
    NativeQueryError,
)
from adapters.backends.registry import language as language_of
from adapters.backends.sessions import (
    HEARTBEAT_MS,
    RETENTION,
    SESSION_TIMEOUT,
    LogError,
    MemoryStore,
    Registration,
    Session,
    SqliteStore,
    Store,
    StoredRegistration,
    Stream,
    dropped_reason,
)
from adapters.undecodable import RefuseUndecodable
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
from eva.events import Event, EventError, from_json_line, to_cloudevent
from eva.units import format_span

log = logging.getLogger("evamed.base")

MAX_ERRORS = 100
"""Error lines a PublishReply carries (the count in ``rejected`` is always complete)."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest gRPC message the service takes (a Publish batch; the client batches under it)."""
ADVANCE_TICKS = 86_400
"""An ``advance_to_us`` moves a subscription's clock at most this many ticks (a day at the
default 1 s tick): a CG-5 query can report at every tick (a free-standing negation), so this
bounds the work one explicit advance asks for. A gap between events is not limited: it is data,
and the service steps it (``_catch_up``)."""
SLICE_TICKS = 60
"""The clock moves in slices of this many ticks (from the evaluator's next instant); each
slice's detections are queued before the next one is computed, so a long step never piles
them up in memory, and the loop is yielded to between slices."""
YIELD_SECONDS = 0.005
"""Evaluation gives the event loop a turn at least this often (other clients' calls run)."""
STALL_SECONDS = 10.0
"""A subscriber that has read nothing for this long is not waited for: once its queue is full it
is dropped (a reader that is reading, however slowly, is waited for: back-pressure). Ten
seconds, not one: a reader slower than a message a second, or a GC or network pause while its
queue is full, is not a dead reader; the cost is that a dead one holds the publishers that
long, once (``--stall-timeout``)."""
MAX_SHOWN = 160
"""Characters of a query line and of a parser message an error echoes: the message travels in
gRPC metadata (8 KB by default), so a long line is cut around the position."""
PACK_DETECTIONS = 512
PACK_BYTES = 256 * 1024
"""A packed notification is sent once it holds this many detections or (roughly) this many
bytes of them, whether or not the Publish message is done: a pack stays far under the
receiver's 4 MB message limit, and a long advance never piles its detections up."""
PACK_SHARE = 32
"""A packed subscription's queue holds ``queue_size // PACK_SHARE`` notifications (at least 2):
each may be a pack, so its bound in detections stays of the order of an unpacked one's."""
MAX_KEEP = 65_536
"""At most the messages of this many of a publisher's latest events are remembered for
constituents by reference (``PublishRequest.keep``; one that keeps more gets JSON sooner)."""


def _cloudevent_json(event: Event) -> str:
    return json.dumps(to_cloudevent(event))


def _extra_json(d: Detection) -> str:
    return json.dumps(d.extra) if d.extra else ""


def notification(sub_id: str, d: Detection) -> Any:
    return base_pb2.NativeNotification(
        subscription_id=sub_id, text=d.text, time_us=d.time,
        constituents=[_cloudevent_json(e) for e in d.constituents], extra_json=_extra_json(d))


def _excerpt(line: str, column: int) -> tuple[str, int]:
    """At most MAX_SHOWN characters of ``line`` around ``column`` (1-based), and the column
    within the excerpt."""
    if len(line) <= MAX_SHOWN:
        return line, column
    start = max(0, min(column - 1 - MAX_SHOWN // 2, len(line) - MAX_SHOWN))
    text = line[start:start + MAX_SHOWN]
    shift = start
    if start > 0:
        text, shift = "…" + text[1:], start
    if start + MAX_SHOWN < len(line):
        text = text[:-1] + "…"
    return text, column - shift


def _short(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


def query_status(error: NativeQueryError) -> grpc.Status:
    """INVALID_ARGUMENT with a message that fits in metadata — the position, the parser's
    message and the query's line cut around the position with a caret — and the position as a
    ``BadRequest`` violation of field ``query`` (description ``line L, column C: message``)."""
    message = _short(error.message)
    text = f"{error.language} query:{error.line}:{error.column}: error: {message}"
    lines = error.source.splitlines()
    if 1 <= error.line <= len(lines):
        shown, column = _excerpt(lines[error.line - 1], error.column)
        text += f"\n  {shown}\n  {' ' * max(column - 1, 0)}^"
    violation = error_details_pb2.BadRequest.FieldViolation(
        field="query", description=f"line {error.line}, column {error.column}: {message}")
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=text)
    status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    return rpc_status.to_status(status)


_WAKE = object()  # wakes a stream to look at its subscription's state


@dataclass(eq=False)
class _Subscription:
    ident: str
    evaluator: Any
    outbox: asyncio.Queue[Any]
    ended: bool = False
    """Unsubscribed or gone: nothing more is queued; the stream ends once the queue is read."""
    failure: tuple[grpc.StatusCode, str] | None = None
    """Dropped: the stream ends with this status; what was queued is lost with it."""
    clock: int | None = None
    """The newest event time or advance the evaluator has seen (None: its clock has not
    started). Each subscription has its own: it sees only what was published after it came."""
    progress: bool = False
    """Sent a progress marker after each numbered Publish message (SubscribeRequest.progress)."""
    packed: bool = False
    """Its detections go out in packs (SubscribeRequest.packed): ``pack`` until it is sent."""
    publisher: str = ""
    """Constituents from this publisher's kept messages go by reference (packed only)."""
    pack: list[Any] = field(default_factory=list)
    pack_bytes: int = 0
    read_at: float = field(default_factory=time.monotonic)
    """When its stream last took a notification, or something was queued for it while it had
    read everything: a subscriber with a backlog that has read nothing for the stall timeout
    is no longer waited for."""
    found: list[Detection] | None = None
    """A session's registration: its detections of the current Publish message go here (not
    to the outbox, which it does not read)."""


@dataclass(eq=False)
class _Publisher:
    """A publisher that named itself (``PublishRequest.publisher``): where each event of the
    numbered messages it keeps came, so a constituent can be sent as that place."""

    streams: int = 0
    """Its Publish calls open now: it is forgotten when the last one ends."""
    messages: deque[tuple[int, list[int]]] = field(default_factory=deque)
    """Each kept message's entries and the arrival numbers (``Event.seq``) of its events,
    oldest first."""
    entries: int = 0
    """Of the kept messages."""
    places: dict[int, tuple[int, int, Event]] = field(default_factory=dict)
    """Arrival number → (batch, index in the message, the event as parsed)."""

    def begin(self, entries: int, keep: int) -> list[int] | None:
        """A new numbered message of ``entries`` events, the publisher keeping the messages of
        its latest ``keep`` events: the older ones are forgotten. The list to add the message's
        events to (None: nothing is kept)."""
        seqs: list[int] = []
        self.messages.append((entries, seqs))
        self.entries += entries
        while self.messages and (keep <= 0 or self.entries - self.messages[0][0] >= keep):
            gone, dropped = self.messages.popleft()
            self.entries -= gone
            for seq in dropped:
                del self.places[seq]
        return seqs if keep > 0 else None

    def place(self, event: Event) -> tuple[int, int] | None:
        """(batch, index) of a kept event; None if it is not one (by identity: an evaluator
        may name an event that merely has the same arrival number)."""
        found = self.places.get(event.seq)
        return (found[0], found[1]) if found is not None and found[2] is event else None


def _latest(*times: int | None) -> int | None:
    """The greatest of the times given (None: none given)."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _refusal(what: str, refusals: list[str], subscriptions: int) -> str:
    share = "" if subscriptions == 1 else f" (by {len(refusals)} of {subscriptions} subscriptions)"
    return f"{what}: {refusals[0]}{share}"


@dataclass
class _Tally:
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    number: int = 0  # events seen in this call
    errors: list[str] | None = None

    def reject(self, message: str) -> None:
        self.rejected += 1
        if self.errors is None:
            self.errors = []
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)


LOGGED, DUPLICATE, LATE = "logged", "duplicate", "late"
"""What the sessions make of an event of a Publish message (``_Entry.fates``)."""


@dataclass
class _Entry:
    """A Publish message as the sessions see it, decided before it is evaluated."""

    fates: list[str]
    """Per well-formed event of the message: LOGGED, DUPLICATE or LATE."""
    number: int = 0
    """Its number in the event log (0: nothing of it was logged)."""
    watermark: int | None = None
    clock: int | None = None
    """The watermark and the service clock (the newest logged event time or advance) once it
    is evaluated."""
    refused: str = ""
    """Why its advance is refused for the sessions ('' if it is not)."""


class BaseService(base_pb2_grpc.BaseServiceServicer):  # type: ignore[misc]
    def __init__(self, group: str, lang: Language, queue_size: int = 1024,
                 stall_timeout: float = STALL_SECONDS, tick: int = 1_000_000,
                 max_advance: int | None = None, store: Store | None = None,
                 retention: int = RETENTION, session_timeout: float = SESSION_TIMEOUT) -> None:
        self.group = group
        self.language = lang
        self.queue_size = max(2, queue_size)  # back-pressure starts at half of it
        self.stall_timeout = stall_timeout
        self._behind: set[_Subscription] = set()  # holding half their queue or more
        self._read = asyncio.Event()  # a subscriber behind made room, or a subscription ended
        self.max_advance = max_advance if max_advance is not None else ADVANCE_TICKS * tick
        self.slice = max(1, min(SLICE_TICKS * tick, self.max_advance))
        self._subs: dict[str, _Subscription] = {}
        self._publishers: dict[str, _Publisher] = {}
        self._order = asyncio.Lock()  # one Publish message at a time, in arrival order
        self._seq = 0
        self._turn = time.monotonic()
        self._closing = False
        # Durable sessions (the module's docstring).
        self.store: Store = store if store is not None else MemoryStore()
        self.retention = max(1, retention)
        self.session_timeout = session_timeout
        self._sessions: dict[str, Session] = {}
        self._dropped: dict[str, str] = {}  # name → why (FAILED_PRECONDITION until created anew)
        self._live: dict[int, Registration] = {}  # evaluated, by ordinal (registration order)
        self._ordinal = 1
        self._messages = 0  # the number of the last message in the event log
        self.watermark: int | None = None
        self._clock: int | None = None  # the newest logged event time or advance
        self._expiry: asyncio.Task[None] | None = None

    @property
    def subscriptions(self) -> list[str]:
        return list(self._subs)  # a copy made without running Python code: safe from a thread

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    # ---------------------------------------------------------------- RPCs

    async def Capabilities(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cap = asdict(self.language.capability)
        cap = {k: sorted(v) if isinstance(v, frozenset) else v for k, v in cap.items()}
        return base_pb2.CapabilitiesReply(
            group=self.group, language=self.language.name,
            capability_json=json.dumps(cap, default=list), max_advance_us=self.max_advance,
            max_query_bytes=MAX_QUERY_BYTES, max_message_bytes=MAX_MESSAGE_BYTES,
            sessions=True, retention=self.retention)

    def _compile(self, text: str) -> tuple[Any, grpc.Status | None]:
        """A fresh evaluator of a native query, or the INVALID_ARGUMENT status refusing it:
        over ``MAX_QUERY_BYTES`` (before any parser sees it), or whatever the parser raises."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_QUERY_BYTES:
            return None, query_status(NativeQueryError(
                self.language.name, f"the query is {size:,} bytes; a native query may be at "
                f"most {MAX_QUERY_BYTES:,} bytes"))
        try:
            return self.language.parse(text).evaluator(), None
        except NativeQueryError as exc:
            return None, query_status(exc)
        except RecursionError:
            return None, query_status(NativeQueryError(
                self.language.name, "the query nests too deeply to be read", 1, 1, text))
        except Exception as exc:  # a parser bug must still answer the client as a bad query
            log.exception("query not understood: %s", text[:MAX_SHOWN])
            return None, query_status(NativeQueryError(
                self.language.name, f"the query could not be read ({type(exc).__name__}: "
                f"{_short(str(exc))})", 1, 1, text))

    async def Subscribe(self, request: Any, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[Any]:
        text: str = request.query
        evaluator, failure = self._compile(text)
        if failure is not None:
            await context.abort_with_status(failure)
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the base service is shutting down")
        sub_id = request.subscription_id or uuid.uuid4().hex
        if sub_id in self._subs:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"subscription {sub_id!r} exists")
        size = max(2, self.queue_size // PACK_SHARE) if request.packed else self.queue_size
        sub = _Subscription(sub_id, evaluator, asyncio.Queue(maxsize=size),
                            progress=request.progress, packed=request.packed,
                            publisher=request.publisher if request.packed else "")
        self._subs[sub_id] = sub
        log.info("subscribed %s: %s", sub_id, _short(text))
        try:
            yield base_pb2.NativeNotification(subscription_id=sub_id, ready=True)
            while True:
                if sub.failure is not None:
                    await context.abort(*sub.failure)
                if sub.ended and sub.outbox.empty():
                    return
                item = await sub.outbox.get()
                sub.read_at = time.monotonic()
                if sub in self._behind and sub.outbox.qsize() < sub.outbox.maxsize // 2:
                    self._behind.discard(sub)
                    self._read.set()  # a publisher waiting for room may go on
                if item is not _WAKE:
                    yield item
        finally:  # unsubscribed, dropped, cancelled or disconnected: the subscription goes away
            self._end(sub)

    async def Unsubscribe(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        sub = self._subs.pop(request.subscription_id, None)
        if sub is not None:
            # Never waits: the stream ends after what is queued (a full queue needs no marker),
            # and nobody waits for room in it any more.
            sub.ended = True
            self._release(sub)
            if not sub.outbox.full():
                sub.outbox.put_nowait(_WAKE)
        return base_pb2.UnsubscribeReply(found=sub is not None)

    async def Publish(self, request_iterator: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> Any:
        tally = _Tally()
        publisher = ""  # the first one a message names: one per call, so a call's memory is bounded
        try:
            async for request in request_iterator:
                if request.publisher and not publisher:
                    publisher = request.publisher
                    self._publishers.setdefault(publisher, _Publisher()).streams += 1
                if request.publisher != publisher:  # not the call's publisher: nothing kept
                    request.ClearField("publisher")
                # Shielded: a publisher that goes away mid-message does not leave an event seen
                # by some subscriptions and not others (a message's work is bounded).
                try:
                    await asyncio.shield(self._message(request, tally))
                except LogError as exc:
                    log.error("the event log could not be written: %s", exc)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, (
                        f"the event log could not be written ({_short(str(exc))}); that message "
                        "was not evaluated: publish it again"))
        finally:
            if publisher:
                self._publishers[publisher].streams -= 1
                if not self._publishers[publisher].streams:
                    del self._publishers[publisher]
        return base_pb2.PublishReply(accepted=tally.accepted, rejected=tally.rejected,
                                     errors=tally.errors or [], duplicates=tally.duplicates)

    # ---------------------------------------------------------------- evaluation

    async def _message(self, request: Any, tally: _Tally) -> None:
        await self._room()  # back-pressure, before taking the order lock
        async with self._order:
            publisher = self._publishers.get(request.publisher) if request.batch else None
            kept = (publisher.begin(len(request.cloudevents), min(request.keep, MAX_KEEP))
                    if publisher is not None else None)
            items: list[tuple[int, Event | str]] = []  # (number in the call, event or why not)
            events: list[tuple[Event, str]] = []
            for index, text in enumerate(request.cloudevents):
                tally.number += 1
                event = self._parse(text, tally.number)
                items.append((tally.number, event))
                if isinstance(event, str):
                    continue
                events.append((event, text))
                if kept is not None and publisher is not None:  # before a detection names it
                    kept.append(event.seq)
                    publisher.places[event.seq] = (request.batch, index, event)
            # Logged before anything is evaluated: durable before any detection it causes.
            entry = self._log(events, request.advance_to_us)
            fates = iter(entry.fates)
            for number, item in items:
                if isinstance(item, str):
                    tally.reject(item)
                else:
                    await self._event(item, tally, number, next(fates))
            if request.advance_to_us:
                await self._advance(request.advance_to_us, tally, entry.refused)
            await self._end_message(request.batch)
            if entry.number:
                await self._seal(entry)

    async def _end_message(self, batch: int) -> None:
        """Send each packed subscription what it holds and tell each subscription that asked
        that message ``batch`` (if numbered) is evaluated: the marker follows the message's
        detections (in the same notification when packed), so its stream delivers them first."""
        for sub in list(self._subs.values()):
            marker = sub.progress and batch != 0
            if sub.pack or marker:
                pack, sub.pack, sub.pack_bytes = sub.pack, [], 0
                await self._put(sub, base_pb2.NativeNotification(
                    subscription_id=sub.ident, detections=pack,
                    progress_batch=batch if marker else 0,
                    progress_us=(sub.clock or 0) if marker else 0))

    def _parse(self, text: str, number: int) -> Event | str:
        """Event ``number`` of the call, numbered in arrival order; why not (a rejection)."""
        try:
            event = from_json_line(text, seq=self._seq)
        except EventError as exc:
            return f"event {number}: {exc}"
        except Exception as exc:  # whatever the line holds, only this event is refused
            log.exception("event %d could not be read", number)
            return (f"event {number}: could not be read ({type(exc).__name__}: "
                    f"{_short(str(exc))})")
        self._seq += 1
        return event

    async def _event(self, event: Event, tally: _Tally, number: int, fate: str) -> None:
        """One event at every subscription and — logged — every live registration. Counted
        accepted, rejected (a refusal; late, while registrations would have seen it) or a
        duplicate."""
        what = f"event {number}"
        subs = list(self._subs.values())
        if fate == LOGGED:
            subs += [r.subscription for r in self._live.values()]
        refusals: list[str] = []
        for sub in subs:
            refused = await self._catch_up(sub, event)
            if not refused:
                refused = await self._apply(sub, methodcaller("push", event), what)
                if not refused and (sub.clock is None or event.time > sub.clock):
                    sub.clock = event.time
            if refused:
                refusals.append(refused)
            await self._pause()
        if fate == LATE and self._live:
            tally.reject(f"{what}: late: at or before the watermark {self.watermark} µs (the "
                         "sessions do not see it)")
        elif refusals:
            tally.reject(_refusal(what, refusals, len(subs)))
        elif fate == DUPLICATE:
            tally.duplicates += 1
        else:
            tally.accepted += 1

    async def _advance(self, until: int, tally: _Tally, sessions_refuse: str = "") -> None:
        """An explicit advance at every subscription (the registrations' clocks are run at
        the message's end, ``_seal``); ``sessions_refuse``: why the sessions refuse it."""
        what = f"advance_to_us {until}"
        subs = list(self._subs.values())
        refusals: list[str] = []
        for sub in subs:
            if sub.clock is None:  # no event yet: the evaluator's clock has not started
                refused = await self._apply(sub, methodcaller("advance", until), what)
            else:
                refused = self._too_far(sub, until, "it") or await self._run_clock(sub, until)
            if refused:
                refusals.append(refused)
            await self._pause()
        if sessions_refuse and self._live:
            tally.reject(f"{what}: {sessions_refuse}")
        elif refusals:
            tally.reject(_refusal(what, refusals, len(subs)))

    def _too_far(self, sub: _Subscription, time: int, subject: str) -> str:
        """Why an explicit advance is refused ('' if it is not): farther than max_advance."""
        if sub.clock is None or time - sub.clock <= self.max_advance:
            return ""
        return (f"clock_jump: {subject} is {format_span(time - sub.clock)} after the "
                f"subscription's clock ({sub.clock} µs); an advance_to_us may move a clock by at "
                f"most {format_span(self.max_advance)}: publish it in steps")

    async def _catch_up(self, sub: _Subscription, event: Event) -> str:
        """Before an event: run the subscription's clock across the gap to it, as far as the
        event's own push would (``reach``; an evaluator without it: to just before the event,
        events being taken in the order published). A quiet gap is no clock jump to refuse;
        stepping it here, in slices, queues its detections slice by slice and yields to the
        loop, where the push would compute them all at once. ``reach`` is None for an event
        the evaluator would refuse (a duplicate, a late event): a refused event moves no
        clock. A gap whose clock-driven work runs longer than ``max_advance`` is refused
        (``clock_jump``, see ``_run_clock``)."""
        if sub.clock is None:
            return ""  # the first event starts the evaluator's clock
        reach = getattr(sub.evaluator, "reach", None)
        until = reach(event) if reach is not None else event.time - 1
        if until is None:
            return ""
        return await self._run_clock(sub, until, final=False)

    async def _run_clock(self, sub: _Subscription, until: int, final: bool = True) -> str:
        """Move a subscription's clock to ``until`` in slices, each slice's detections queued
        before the next is computed. A slice starts at the evaluator's next instant
        (``next_instant``): a quiet gap costs what it reports, not its length (an evaluator
        that cannot tell is stepped slice after slice). ``final``: the clock must reach
        ``until`` (an explicit advance: at least one call, already bounded by max_advance);
        otherwise (the gap before a push) stop once nothing is pending up to it, and stop
        with a ``clock_jump`` refusal once the slices stepped would cover more than
        ``max_advance``: that much clock-driven work is what an explicit advance may ask for,
        so one event cannot hold the order lock for hours (a free-standing negation 100
        years ahead: 3·10⁹ ticks to report). The clock stays where the stepping stopped,
        every instant up to it reported, as after an advance: the client advances from there
        in bounded steps and publishes the event again."""
        assert sub.clock is not None
        next_instant = getattr(sub.evaluator, "next_instant", None)
        done = start = sub.clock
        stepped = 0  # µs of the gap covered by slices (the skipped quiet stretches are free)
        while not sub.ended:
            if next_instant is not None:
                pending = next_instant()
            elif done < until:  # an evaluator that cannot tell: every slice
                pending = done + 1
            else:
                pending = None
            if pending is None or pending > until:
                if not final:
                    return ""
                step = until
            else:
                begin = max(pending, done)
                step = min(until, begin + self.slice)
                if not final and stepped + (step - begin) > self.max_advance:
                    return self._jump_refusal(start, done, until)
                stepped += step - begin
            refused = await self._apply(sub, methodcaller("advance", step), f"advance_to_us {step}")
            done = step
            sub.clock = max(sub.clock, step)
            if refused or step >= until:
                return refused
            await self._pause()
        return ""

    def _jump_refusal(self, start: int, done: int, until: int) -> str:
        return (f"clock_jump: the gap of {format_span(until - start)} before it has clock-driven work "
                f"(instants to report) over more than {format_span(self.max_advance)} "
                f"(max_advance); the subscription's clock was stepped to {done} µs, every "
                f"instant up to it reported: advance_to_us in steps of at most "
                f"{format_span(self.max_advance)}, then publish the event again")

    async def _apply(self, sub: _Subscription, step: Callable[[Any], list[Detection]],
                     what: str) -> str:
        """One step of a subscription's evaluator, its detections queued; why the evaluator
        refused the step ('' if it took it or the subscription is gone)."""
        if sub.ended:
            return ""
        try:
            detections = step(sub.evaluator)
        except EventRejected as exc:
            return str(exc)
        except Exhausted as exc:  # the query's fault, not the event's: the others take it
            log.warning("subscription %s ended on %s: %s", sub.ident, what, exc)
            self._fail(sub, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return ""
        except Exception as exc:  # a bug in one evaluator must not take the service down
            log.exception("subscription %s failed on %s", sub.ident, what)
            self._fail(sub, grpc.StatusCode.INTERNAL,
                       f"evaluation failed on {what}: {type(exc).__name__}: {_short(str(exc))}")
            return f"evaluation failed ({type(exc).__name__}; the subscription was ended)"
        if sub.found is not None:  # a registration: its session's message takes them at the end
            sub.found.extend(detections)
            return ""
        for d in detections:
            try:
                item = self._packed(sub, d) if sub.packed else notification(sub.ident, d)
            except Exception as exc:  # e.g. a value JSON cannot carry
                log.exception("subscription %s: a detection could not be sent", sub.ident)
                self._fail(sub, grpc.StatusCode.INTERNAL, f"a detection of {what} could not be "
                           f"sent: {type(exc).__name__}: {_short(str(exc))}")
                break
            if item is not None and not await self._put(sub, item):
                break
        return ""

    def _packed(self, sub: _Subscription, d: Detection) -> Any:
        """Add a detection to the subscription's pack; the pack as a notification once it is
        full (None until then). A constituent from a kept message of the subscription's
        publisher goes as its place (batch, index), any other one as JSON."""
        publisher = self._publishers.get(sub.publisher) if sub.publisher else None
        refs: list[int] = []
        inline: list[str] = []
        for e in d.constituents:
            place = publisher.place(e) if publisher is not None else None
            if place is None:
                inline.append(_cloudevent_json(e))
                place = (0, 0)
            refs += place
        extra = _extra_json(d)
        sub.pack.append(base_pb2.Detection(
            text=d.text, time_us=d.time, refs=refs if len(inline) < len(refs) // 2 else (),
            constituents=inline, extra_json=extra))
        sub.pack_bytes += len(d.text) + len(extra) + sum(map(len, inline)) + 8 * len(refs)
        if len(sub.pack) < PACK_DETECTIONS and sub.pack_bytes < PACK_BYTES:
            return None
        pack, sub.pack, sub.pack_bytes = sub.pack, [], 0
        return base_pb2.NativeNotification(subscription_id=sub.ident, detections=pack)

    async def _put(self, sub: _Subscription, item: Any) -> bool:
        """Queue a notification. Publishers wait for room before they take the order lock
        (``_room``); a queue can still fill within one message (a burst of detections): then a
        subscriber that is reading is waited for, and one that has read nothing for the stall
        timeout is dropped at once (RESOURCE_EXHAUSTED) — the lock is never held for a
        subscriber that stopped reading. False if the subscription is gone (or dropped now)."""
        while not sub.ended:
            if sub.outbox.empty():  # it had read everything: it is idle from now on, not before
                sub.read_at = time.monotonic()
            try:
                sub.outbox.put_nowait(item)
            except asyncio.QueueFull:
                idle = time.monotonic() - sub.read_at
                if idle >= self.stall_timeout:
                    self._fail(sub, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"subscriber too slow: {sub.outbox.maxsize} notifications queued and "
                               f"none read for {self.stall_timeout:g} s; it was dropped so that "
                               "it cannot stall the others (the bound is the service's "
                               "--queue-size)")
                    return False
                await self._wait_read(self.stall_timeout - idle)
                continue
            if sub.outbox.qsize() >= sub.outbox.maxsize // 2:
                self._behind.add(sub)
            return True
        return False

    async def _room(self) -> None:
        """Back-pressure outside the order lock: wait while a subscriber that is reading holds
        half its queue or more. One that has read nothing for the stall timeout is not waited
        for (its queue fills and it is dropped)."""
        while self._behind:
            now = time.monotonic()
            live = [s.read_at for s in self._behind if now - s.read_at < self.stall_timeout]
            if not live:
                return
            await self._wait_read(min(live) + self.stall_timeout - now)

    async def _wait_read(self, seconds: float) -> None:
        """Until a subscriber behind makes room or a subscription ends, at most ``seconds``."""
        self._read.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._read.wait(), max(seconds, 0.001))

    def _release(self, sub: _Subscription) -> None:
        """Nobody waits for room in ``sub`` any more (it ended)."""
        self._behind.discard(sub)
        self._read.set()

    async def _pause(self) -> None:
        now = time.monotonic()
        if now - self._turn >= YIELD_SECONDS:
            await asyncio.sleep(0)
            self._turn = time.monotonic()

    def _fail(self, sub: _Subscription, code: grpc.StatusCode, reason: str) -> None:
        if sub.failure is None:
            sub.failure = (code, reason)
        self._end(sub)
        sub.outbox.put_nowait(_WAKE)  # room was just made

    def _end(self, sub: _Subscription) -> None:
        """Dropped, or its stream is over: nobody will read what is queued (an unsubscribed
        stream still reads it: Unsubscribe does not come here)."""
        if self._subs.get(sub.ident) is sub:
            del self._subs[sub.ident]
        sub.ended = True
        sub.pack.clear()
        self._release(sub)
        while not sub.outbox.empty():
            sub.outbox.get_nowait()

    def close(self) -> None:
        """End every subscription and session stream (UNAVAILABLE): the service is going
        away (the sessions stay in the store, with ``--data``)."""
        self._closing = True
        for sub in list(self._subs.values()):
            self._fail(sub, grpc.StatusCode.UNAVAILABLE, "the base service is shutting down")
        for session in self._sessions.values():
            session.wake()
        if self._expiry is not None:
            self._expiry.cancel()

    # ---------------------------------------------------------------- durable sessions

    async def Open(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """The session's stream: ready, the kept messages after max(resume_after, acked),
        then live ones; a progress-only message (seq 0) when the watermark or origin moved
        and nothing else is pending, and after ``heartbeat_ms`` without any message."""
        name: str = request.session
        if not name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a session needs a name "
                                "(OpenRequest.session)")
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the base service is shutting down")
        session = self._sessions.get(name)
        if session is None:
            if not request.create:
                await self._absent(name, context)
            try:
                session = self._create(name)
            except LogError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"the session could not be "
                                    f"stored ({_short(str(exc))}): open it again")
                raise  # (abort raises)
        stream = Stream()
        if session.stream is not None:
            session.stream.superseded = True
            session.stream.wake.set()
        session.stream = stream
        heartbeat = (request.heartbeat_ms if request.heartbeat_ms > 0 else HEARTBEAT_MS) / 1000
        cursor = max(request.resume_after, session.acked)
        try:
            # The watermark only if no kept message is pending: those cover it.
            shown = self._progress(session, ready=True, watermark=cursor >= session.seq)
            yield shown
            sent = time.monotonic()
            while True:
                stream.wake.clear()  # before looking: whatever happens after is seen next turn
                if stream.superseded:
                    await context.abort(grpc.StatusCode.ABORTED, "superseded by a newer stream")
                if session.dropped is not None:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, session.dropped)
                if self._closing:
                    await context.abort(grpc.StatusCode.UNAVAILABLE,
                                        "the base service is shutting down")
                if cursor < session.acked:  # acknowledged meanwhile: forgotten, not sent
                    cursor = session.acked
                if cursor < session.seq:
                    cursor += 1
                    shown = session.kept[cursor]
                    yield shown
                    sent = time.monotonic()
                    continue
                progress = self._progress(session)
                if (progress.has_watermark, progress.watermark_us, progress.has_origin,
                        progress.origin_us) != (shown.has_watermark, shown.watermark_us,
                                                shown.has_origin, shown.origin_us):
                    shown = progress
                    yield shown
                    sent = time.monotonic()
                    continue
                idle = heartbeat - (time.monotonic() - sent)
                if idle <= 0:
                    yield progress  # liveness: the same watermark again
                    sent = time.monotonic()
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stream.wake.wait(), idle)
        finally:  # disconnected, superseded or dropped: the session lives on
            if session.stream is stream:
                session.stream = None
                session.detached = time.monotonic()

    async def Register(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        session = await self._session(request.session, context)
        ident, text = request.subscription_id, request.query
        if not ident:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a registration needs a "
                                "subscription_id")
        await self._refuse_exhausted(session, ident, text, context)
        if await self._registered(session, ident, text, context):
            return base_pb2.RegisterReply()
        evaluator, failure = self._compile(text)
        if failure is not None:
            await context.abort_with_status(failure)
        async with self._order:  # between two Publish messages: it sees the next one on
            if session.dropped is not None:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, session.dropped)
            await self._refuse_exhausted(session, ident, text, context)  # (ended meanwhile?)
            if await self._registered(session, ident, text, context):
                return base_pb2.RegisterReply()
            stored = StoredRegistration(self._ordinal, session.name, ident, text,
                                        self._messages, None)
            try:
                self.store.register(stored)
            except LogError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"the registration could not "
                                    f"be stored ({_short(str(exc))}): register again")
            self._ordinal += 1
            self._activate(session, stored, evaluator)
        log.info("session %s: registered %s: %s", session.name, ident, _short(text))
        return base_pb2.RegisterReply()

    async def _refuse_exhausted(self, session: Session, ident: str, text: str,
                                context: grpc.aio.ServicerContext) -> None:
        """RESOURCE_EXHAUSTED if ``ident`` was ended at a limit with this very query."""
        exhausted = session.exhausted.get(ident)
        if exhausted is not None and exhausted[0] == text:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"{exhausted[1]} (subscription {ident!r} was ended with this query: it would "
                "be again; register a bounded query, or this one under another id)"))

    async def _registered(self, session: Session, ident: str, text: str,
                          context: grpc.aio.ServicerContext) -> bool:
        """Whether ``ident`` is registered with this very query (ALREADY_EXISTS with
        another)."""
        known = session.registrations.get(ident)
        if known is None:
            return False
        if known.query != text:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, (
                f"subscription {ident!r} of session {session.name} is registered with another "
                "query (deregister it first)"))
        return True

    async def Deregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        session = await self._session(request.session, context)
        async with self._order:  # between two Publish messages: it saw the last one
            registration = session.registrations.pop(request.subscription_id, None)
            if registration is not None:
                self._deactivate(registration)
                try:
                    self.store.deregister(registration.ordinal, self._messages)
                except LogError as exc:  # a restart would evaluate it again: say so
                    log.error("session %s: the deregistration of %s could not be stored: %s",
                              session.name, registration.ident, exc)
        return base_pb2.DeregisterReply(found=registration is not None)

    async def Ack(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        session = await self._session(request.session, context)
        before = session.acked
        session.forget(request.seq)
        if session.acked > before:
            try:
                self.store.ack(session.name, session.acked)
            except LogError as exc:  # a restart would send them again: the client skips them
                log.error("session %s: the acknowledgement could not be stored: %s",
                          session.name, exc)
        return base_pb2.AckReply()

    async def _session(self, name: str, context: grpc.aio.ServicerContext) -> Session:
        session = self._sessions.get(name)
        if session is None:
            await self._absent(name, context)
        assert session is not None
        return session

    async def _absent(self, name: str, context: grpc.aio.ServicerContext) -> None:
        """End the call: the session was dropped (FAILED_PRECONDITION) or is unknown."""
        if name in self._dropped:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._dropped[name])
        await context.abort(grpc.StatusCode.NOT_FOUND, (
            f"session {name} is not known to this base service (never created, or the service "
            "restarted without --data): open it with create"))

    def _create(self, name: str) -> Session:
        session = Session(name, self.watermark)
        self.store.create_session(name, session.origin)
        self._dropped.pop(name, None)
        self._sessions[name] = session
        log.info("session %s created (origin %s)", name, session.origin)
        return session

    def _activate(self, session: Session, stored: StoredRegistration, evaluator: Any) -> None:
        sub = _Subscription(stored.ident, evaluator, asyncio.Queue(maxsize=1), found=[])
        registration = Registration(stored.ordinal, session, stored.ident, stored.query,
                                    stored.position, sub, stored.deregistered, stored.ended)
        session.registrations[stored.ident] = registration
        self._live[stored.ordinal] = registration

    def _deactivate(self, registration: Registration) -> None:
        registration.subscription.ended = True
        self._live.pop(registration.ordinal, None)

    def _progress(self, session: Session, ready: bool = False, watermark: bool = True) -> Any:
        message = base_pb2.SessionMessage(seq=0, ready=ready,
                                          retention=self.retention if ready else 0)
        if watermark and self.watermark is not None:
            message.has_watermark, message.watermark_us = True, self.watermark
        if session.origin is not None:
            message.has_origin, message.origin_us = True, session.origin
        return message

    def _log(self, events: list[tuple[Event, str]], advance: int) -> _Entry:
        """Decide what the sessions see of a Publish message — an event whose (source, id)
        was logged is a duplicate, one at or before the watermark is late, an advance more
        than ``max_advance`` past the service clock is refused — and append it to the event
        log in one transaction, with the origin of each session that was waiting for its
        first event. Nothing is evaluated yet."""
        watermark, clock = self.watermark, self._clock
        entry = _Entry([])
        number = self._messages + 1
        newest: int | None = None
        first: Event | None = None
        origins: list[Session] = []
        with self.store.transaction():
            for event, line in events:
                if watermark is not None and event.time <= watermark:
                    entry.fates.append(DUPLICATE if self.store.known(event) else LATE)
                elif self.store.add_event(event, line, number):
                    entry.fates.append(LOGGED)
                    newest = event.time if newest is None else max(newest, event.time)
                    first = first or event
                else:
                    entry.fates.append(DUPLICATE)
            top = _latest(clock, newest)
            sealed: int | None = None
            if advance and top is not None and advance - top > self.max_advance:
                entry.refused = (
                    f"clock_jump: it is {format_span(advance - top)} after the service's "
                    f"clock ({top} µs); an advance_to_us may move it by at most "
                    f"{format_span(self.max_advance)}: publish it in steps")
            elif advance and (watermark is None or advance > watermark):
                sealed = advance
            if newest is None and sealed is None:
                return entry  # nothing for the sessions
            self.store.add_message(number, newest, sealed)
            if first is not None:
                origins = [s for s in self._sessions.values() if s.origin is None]
                for session in origins:
                    self.store.set_origin(session.name, first.time - 1)
        self._messages = entry.number = number
        if first is not None:
            for session in origins:
                session.origin = first.time - 1
        entry.watermark = _latest(watermark, None if newest is None else newest - 1, sealed)
        entry.clock = _latest(top, sealed)
        return entry

    async def _seal(self, entry: _Entry) -> None:
        """The end of a logged message for the sessions: every registration's clock run to the
        new watermark (as far as work is pending: every detection up to it is then found);
        then, with nothing awaited in between, each session's detections become its next
        messages and the watermark moves, and the streams are woken."""
        until = entry.watermark
        live = list(self._live.values())
        for registration in live:
            sub = registration.subscription
            if until is None or sub.ended:
                continue
            if sub.clock is None:  # no event yet: the evaluator's clock has not started
                await self._apply(sub, methodcaller("advance", until), f"advance_to_us {until}")
            else:  # to ``until`` included: what is due at the clock itself too (an interval's end)
                refused = await self._run_clock(sub, until, final=False)
                if refused:
                    log.warning("session %s, %s: the clock stays behind the watermark: %s",
                                registration.session.name, registration.ident, refused)
            await self._pause()
        before, self.watermark, self._clock = self.watermark, until, entry.clock
        found: dict[Session, list[tuple[str, list[Detection]]]] = {}
        ended: dict[Session, list[Any]] = {}
        for registration in live:
            sub = registration.subscription
            session = registration.session
            if sub.found:
                found.setdefault(session, []).append((registration.ident, sub.found))
                sub.found = []
            if session.registrations.get(registration.ident) is not registration:
                continue
            end: tuple[str, str] | None = None
            if registration.ended is not None:  # a replay: where, and as, it ended before
                if registration.deregistered == entry.number:
                    end = registration.ended
            elif sub.failure is not None and registration.deregistered is None:
                end = (sub.failure[0].name, sub.failure[1])
            if end is not None:
                ended.setdefault(session, []).append(base_pb2.EndedRegistration(
                    subscription_id=registration.ident, code=end[0], reason=end[1]))
                self._end_registration(registration, entry.number, end)
        for session in {**found, **ended}:
            if session.dropped is None:
                self._keep(session, found.get(session, []), ended.get(session, []), before, until)
        for session in list(self._sessions.values()):
            session.wake()

    def _end_registration(self, registration: Registration, number: int,
                          end: tuple[str, str]) -> None:
        """A registration whose evaluation failed or passed a limit while logged message
        ``number`` was evaluated: deregistered there, as if its session had asked, with how
        it ended — stored, so that a restart's replay ends it at the same message with the
        same words (whatever the limits are then: the messages stay the same)."""
        session = registration.session
        del session.registrations[registration.ident]
        self._deactivate(registration)
        if end[0] == grpc.StatusCode.RESOURCE_EXHAUSTED.name:
            session.exhausted[registration.ident] = (registration.query, end[1])
        if registration.deregistered is not None:  # a replay: stored already
            return
        log.warning("session %s: %s ended: %s: %s", session.name, registration.ident, *end)
        registration.deregistered = number
        registration.ended = end
        try:
            self.store.deregister(registration.ordinal, number, end,
                                  (native.WORK_LIMIT, native.STORE_LIMIT))
        except LogError as exc:
            log.error("session %s: the end of %s could not be stored: %s", session.name,
                      registration.ident, exc)

    def _keep(self, session: Session, found: list[tuple[str, list[Detection]]], ended: list[Any],
              before: int | None, after: int | None) -> None:
        """One Publish message's detections as the session's next message (split at the
        pack's bounds: every part but the last carries the watermark from before the
        message), with the registrations it ended in the last part, kept until acknowledged;
        a session that would keep more than ``retention`` is dropped."""
        parts: list[list[Any]] = [[]]
        size = 0
        for ident, detections in found:
            for d in detections:
                try:
                    item = self._session_detection(ident, d)
                except Exception as exc:  # e.g. a value JSON cannot carry
                    log.exception("session %s, %s: a detection could not be sent (%s)",
                                  session.name, ident, type(exc).__name__)
                    continue
                if len(parts[-1]) >= PACK_DETECTIONS or size >= PACK_BYTES:
                    parts.append([])
                    size = 0
                parts[-1].append(item)
                size += (len(item.text) + len(item.extra_json)
                         + sum(map(len, item.constituents)) + 8 * len(item.arrivals))
        if not parts[-1] and not ended:
            return
        for index, part in enumerate(parts):
            session.seq += 1
            if session.seq <= session.acked:  # regenerated by a replay, acknowledged before
                continue
            last = index == len(parts) - 1
            watermark = after if last else before
            message = base_pb2.SessionMessage(seq=session.seq, detections=part,
                                              ended=ended if last else ())
            if watermark is not None:
                message.has_watermark, message.watermark_us = True, watermark
            if session.origin is not None:
                message.has_origin, message.origin_us = True, session.origin
            session.kept[session.seq] = message
        if len(session.kept) > self.retention:
            self._drop(session, f"more than {self.retention} messages unacknowledged (the "
                                "service's --retention)")

    def _session_detection(self, ident: str, d: Detection) -> Any:
        return base_pb2.SessionDetection(
            subscription_id=ident, text=d.text, time_us=d.time,
            constituents=[_cloudevent_json(e) for e in d.constituents],
            # An evaluator's own event (none does so far) would carry a number the service
            # never gave: -1.
            arrivals=[e.seq if 0 <= e.seq < self._seq else -1 for e in d.constituents],
            extra_json=_extra_json(d))

    def _drop(self, session: Session, why: str) -> None:
        """Forget a session — registrations, messages — and say so to every later call."""
        reason = dropped_reason(session.name, why)
        log.warning("%s", reason)
        session.dropped = reason
        for registration in session.registrations.values():
            self._deactivate(registration)
        session.registrations.clear()
        session.kept.clear()
        self._sessions.pop(session.name, None)
        self._dropped[session.name] = reason
        try:
            self.store.drop(session.name, reason)
        except LogError as exc:
            log.error("session %s: its drop could not be stored: %s", session.name, exc)
        session.wake()

    async def expire(self) -> None:
        """Drop the sessions that have had no open stream for ``session_timeout`` seconds
        (between two Publish messages), for as long as the service runs."""
        period = min(1.0, max(self.session_timeout / 4, 0.01))
        while not self._closing:
            await asyncio.sleep(period)
            now = time.monotonic()
            if not any(s.stream is None and now - s.detached >= self.session_timeout
                       for s in self._sessions.values()):
                continue
            async with self._order:
                now = time.monotonic()
                for session in list(self._sessions.values()):
                    if session.stream is None and now - session.detached >= self.session_timeout:
                        self._drop(session, f"no open stream for {self.session_timeout:g} s (the "
                                            "service's --session-timeout)")

    async def restore(self) -> None:
        """Take up what the store holds (``--data``): the sessions, their registrations — each
        evaluator rebuilt by replaying the log from its registration on, in the logged
        messages' boundaries and in registration order, which regenerates the sessions'
        messages with the same seq numbers (those acknowledged are not kept) — the dropped
        sessions' names, and the log's numbering. Before the service answers anyone."""
        state = self.store.restore()
        self._messages, self._seq, self._dropped = state.messages, state.next_seq, state.dropped
        self._ordinal = max((r.ordinal for r in state.registrations), default=0) + 1
        for stored in state.sessions:
            self._sessions[stored.name] = Session(stored.name, stored.origin, acked=stored.acked)
        pending = [r for r in state.registrations if r.session in self._sessions]
        start = min((r.position for r in pending), default=state.messages)
        self.watermark, self._clock = self.store.progress_before(start + 1)
        replayed = 0
        tally = _Tally()
        for message in self.store.messages(start):
            self._turn_registrations(pending, message.number)
            for position, line in message.events:
                await self._event(from_json_line(line, seq=position), tally, 0, LOGGED)
            newest = message.newest
            entry = _Entry([], message.number, _latest(
                self.watermark, None if newest is None else newest - 1, message.advance),
                _latest(self._clock, newest, message.advance))
            await self._seal(entry)
            replayed += 1
        self._turn_registrations(pending, state.messages + 1)
        self.watermark, self._clock = self.store.progress_before(state.messages + 1)
        if state.sessions:
            log.info("restored %d sessions, %d registrations (%d messages of the log "
                     "replayed)", len(self._sessions), len(self._live), replayed)

    def _turn_registrations(self, pending: list[StoredRegistration], number: int) -> None:
        """Before logged message ``number`` is replayed: the registrations deregistered before
        it end, those registered before it start (in registration order)."""
        for registration in list(self._live.values()):
            if registration.deregistered is not None and registration.deregistered < number:
                self._deactivate(registration)
                session = registration.session
                if session.registrations.get(registration.ident) is registration:
                    del session.registrations[registration.ident]
        while pending and pending[0].position < number:
            stored = pending.pop(0)
            owner = self._sessions.get(stored.session)
            if owner is None:
                continue  # dropped during the replay
            # One the service ended: with the limits it had then, so that it ends at the same
            # event after no more work than then (a raised limit must not let it run on).
            with native.limits(*stored.limits) if stored.limits else contextlib.nullcontext():
                evaluator, failure = self._compile(stored.query)
            if failure is not None:
                log.error("session %s: %s can no longer be registered: %s", stored.session,
                          stored.ident, failure.details)
                continue
            self._activate(owner, stored, evaluator)


# ------------------------------------------------------------------ serving


@dataclass
class Served:
    """A base service running on the current event loop."""

    server: grpc.aio.Server
    port: int
    service: BaseService
    health: health.aio.HealthServicer

    async def stop(self, drain: float = 0.0, grace: float | None = 2.0) -> None:
        """Graceful shutdown: health says NOT_SERVING for ``drain`` seconds (clients and load
        balancers move away; calls are still served), then subscriptions end (UNAVAILABLE) and
        calls in flight get ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        if drain > 0:
            await asyncio.sleep(drain)
        self.service.close()
        await self.server.stop(grace)
        self.service.store.close()


async def start(group: str, listen: str, tick: int = 1_000_000, queue_size: int = 1024,
                stall_timeout: float = STALL_SECONDS, max_advance: int | None = None,
                lang: Language | None = None, data: str | os.PathLike[str] | None = None,
                retention: int = RETENTION, session_timeout: float = SESSION_TIMEOUT) -> Served:
    """Start a base service on the running loop (``listen`` may use port 0: any free port);
    ``lang``: another language than the group's own (tests). ``data``: the directory of its
    event log and sessions (None: in memory), whose sessions are restored before it answers.
    A port another server listens on is refused (no port sharing): OSError saying why; a
    ``data`` directory it cannot use: OSError too (LogError)."""
    lang = lang if lang is not None else language_of(group, tick)
    try:
        store: Store = SqliteStore(data, group) if data is not None else MemoryStore()
    except LogError as exc:
        raise OSError(str(exc)) from None
    # A request whose bytes do not decode: INVALID_ARGUMENT in one throttled line, as at the
    # mediator, not UNKNOWN with a traceback (issue 28, item 3; found by `make fuzz`).
    server = grpc.aio.server(interceptors=[RefuseUndecodable()], options=[
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ])
    service = BaseService(group, lang, queue_size, stall_timeout, tick, max_advance, store,
                          retention, session_timeout)
    try:
        await service.restore()
    except LogError as exc:
        store.close()
        raise OSError(str(exc)) from None
    base_pb2_grpc.add_BaseServiceServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        store.close()
        raise OSError(f"cannot listen on {listen}: {_bind_error(listen)}")
    await server.start()
    service._expiry = asyncio.create_task(service.expire())
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Served(server, port, service, health_servicer)


def _bind_error(listen: str) -> str:
    """Why ``listen`` cannot be bound, in the operating system's words (gRPC's own message
    only says that it failed)."""
    host, _, port = listen.rpartition(":")
    try:
        with socket.create_server((host.strip("[]") or "::", int(port))):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return "the port is in use (ports are not shared: is another server running on it?)"
        return os.strerror(exc.errno) if exc.errno else str(exc)
    except ValueError:
        return f"expected host:port, found {listen!r}"
    return "gRPC could not bind it"


async def run(group: str, listen: str, ready: Callable[[int], None], tick: int = 1_000_000,
              queue_size: int = 1024, max_advance: int | None = None, drain: float = 1.0,
              grace: float = 2.0, stall_timeout: float = STALL_SECONDS,
              data: str | os.PathLike[str] | None = None, retention: int = RETENTION,
              session_timeout: float = SESSION_TIMEOUT) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully (``Served.stop``); a second
    signal skips the drain. ``ready(port)`` is called once the service answers."""
    served = await start(group, listen, tick, queue_size, stall_timeout, max_advance,
                         data=data, retention=retention, session_timeout=session_timeout)
    # What is loaded by now (grpc, the parsers, the language: ~10⁶ objects) lives as long as the
    # process: out of the collector's sight, a full collection scans only what serving made —
    # a few ms instead of 15–20 ms every ten thousand events (a batch's p99, benchmarks/links.py).
    gc.freeze()
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    ready(served.port)
    await stop.wait()
    log.info("shutting down: NOT_SERVING for %ss, then %ss for calls in flight", drain, grace)
    await served.health.enter_graceful_shutdown()
    try:
        await asyncio.wait_for(hurry.wait(), drain)
        grace = 0  # a second signal: no more waiting
    except TimeoutError:
        pass
    await served.stop(0, grace)


class Running:
    """A base service on its own event loop in a background thread, for synchronous callers
    (tests, benchmarks, embedding): ``port``, ``service``, ``stop()``."""

    def __init__(self, group: str, listen: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"evamed-base-{group}")
        self._thread.start()
        try:
            self.served = self.call(start(group, listen, **options))
        except BaseException:
            self._close_loop()
            raise
        self.port = self.served.port
        self.service = self.served.service
        self.server = self  # what serve() returned before: ``running.server.stop(grace).wait()``

    def call(self, coroutine: Any) -> Any:
        """Run a coroutine on the service's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self, grace: float | None = 0, drain: float = 0.0) -> threading.Event:
        if self._thread.is_alive():
            self.call(self.served.stop(drain, grace))
            self._close_loop()
        done = threading.Event()
        done.set()
        return done

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def serve(group: str, listen: str, tick: int = 1_000_000, queue_size: int = 1024,
          stall_timeout: float = STALL_SECONDS, max_advance: int | None = None,
          lang: Language | None = None, data: str | os.PathLike[str] | None = None,
          retention: int = RETENTION, session_timeout: float = SESSION_TIMEOUT) -> Running:
    """Start a base service in a background thread (``listen`` may use port 0)."""
    return Running(group, listen, tick=tick, queue_size=queue_size, stall_timeout=stall_timeout,
                   max_advance=max_advance, lang=lang, data=data, retention=retention,
                   session_timeout=session_timeout)


__all__ = ["BaseService", "Running", "Served", "notification", "query_status", "run",
           "serve", "start"]
