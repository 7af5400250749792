"""A running base service as a :class:`~adapters.links.Link`: the mediator's gRPC side of it.

Synchronous gRPC (the mediator's pipeline runs in a thread of its own). A connection holds one
long-lived ``Publish`` stream, fed from a queue, and one ``Subscribe`` stream per handle (with
progress markers, ``SubscribeRequest.progress``), each read by a thread of its own into the
link's inbox. :meth:`RemoteLink.publish` numbers each message it sends (``batch``) and reads the
inbox until every handle's stream has delivered the progress marker of its last message: the
service has then reported everything those events and that advance caused, so the answer is
complete — what a live mediator needs to go on.

Speed (docs/backends.md, "Remote links"): a batch goes out in messages of ``message_events``
events, streamed as they are encoded, so the service evaluates one while the link encodes the
next; each handle asks for packed notifications (``SubscribeRequest.packed``: a message's
detections and its marker in one gRPC message, not one message per detection) and for
constituents by reference (``SubscribeRequest.publisher``): the link keeps the messages of its
latest ``KEEP`` events (and the batch in flight), and the service names a constituent
among them by its place (batch, index) rather than sending its JSON back. A place the link
does not hold is a broken promise of the service: ConnectionError, never a dropped constituent.
A service that predates these options answers the old way, which the link reads too.

Failures (docs/backends.md, "Remote links"): a stream that fails with a transient status
(UNAVAILABLE: the service died or is going away) or ends unexpectedly makes the link
reconnect — a fresh channel, back-off with jitter between attempts (tenacity), each attempt
bounded by ``timeout``, for at most ``patience`` seconds (None: as long as the link lives) —
re-subscribe every handle's query under the same handle name (fresh native state: what the
dead service had seen is gone), and re-send the batch that was in flight; ``publish`` returns
that batch's answer from the new service (what the dead one reported of it is dropped, so
nothing is reported twice). A link whose streams fail while it is idle reconnects in the
background, so :meth:`RemoteLink.status` tells the truth. Any other status (INTERNAL: the
service's evaluator failed) is raised as :class:`ConnectionError`, and the next call starts a
fresh connection.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_random_exponential

from adapters.backends.registry import shared_language
from adapters.client import _check_group, detection, limit_end, publish_messages, query_error
from adapters.links import Handle, InProcessLink, Link, raise_ended
from adapters.wire import base_pb2, base_pb2_grpc
from eva.events import Event, EventError, from_json_line
from transforms.dialects.base import Detection
from transforms.federated import ServiceInfo

log = logging.getLogger("evamed.link")

EMBEDDED = "embedded"
"""The address of a service evaluated in the mediator's own process (:func:`connect`)."""
BACKOFF_MAX = 2.0
"""Seconds between reconnection attempts at most (exponential from 50 ms, with jitter)."""
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                       grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED,
                       grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ALREADY_EXISTS})
"""Statuses that mean "the service (or the way to it) went away": reconnect. ALREADY_EXISTS:
a restarted connection came back before the service noticed the old one had gone."""
_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX * 1000))]
"""gRPC's own reconnection (within one attempt) no slower than ours: a restarted service is
found within BACKOFF_MAX, not gRPC's default of up to two minutes."""
_END = object()
"""A Subscribe stream ended without an error (the service ended it)."""
KEEP = 4096
"""The link keeps the Publish messages of its latest KEEP events (``PublishRequest.keep``), and
those of the batch in flight, for the constituents the service names by reference. A
constituent older than that comes as JSON: KEEP bounds memory (the service's too), not
exactness."""
MESSAGE_EVENTS = 500
"""Events per Publish message: small enough that the service starts on a batch while the link
still encodes it, large enough that a message's fixed cost is shared (benchmarks/links.py)."""
CLOSE_SECONDS = 2.0
""":meth:`RemoteLink.close` waits at most this long (or the link's ``timeout``, if shorter) for
a call in flight to let go of the link and for the service to answer its goodbyes."""


class _Lost(Exception):
    """The connection went away (a transient failure): reconnect and try again."""


@dataclass(eq=False)
class _Connection:
    """One channel to the service, its Publish stream and the handles' Subscribe streams."""

    generation: int
    channel: grpc.Channel
    stub: Any
    requests: queue.Queue[Any] = field(default_factory=queue.Queue)
    """What the Publish stream sends; None ends it."""
    calls: dict[Handle, Any] = field(default_factory=dict)
    publishing: Any = None
    """The Publish call (a future of its PublishReply)."""

    def messages(self) -> Iterator[Any]:
        while (request := self.requests.get()) is not None:
            yield request

    def close(self) -> None:
        self.requests.put(None)  # the stream's request thread would wait on the queue forever
        for call in self.calls.values():
            call.cancel()
        self.channel.close()


class RemoteLink:
    """A base service at ``address`` (host:port) for the service ``info`` describes. It connects
    in the background at once; calls wait for the connection. ``timeout``: seconds a connection
    attempt and a unary call may take; ``patience``: seconds the link keeps trying to reach the
    service before a call raises ConnectionError (None: for as long as it lives). ``packed``,
    ``by_reference``, ``keep`` and ``message_events``: how it talks to the service (the module's
    docstring; with ``packed=False`` it asks for one message per detection with its
    constituents in JSON, as before packing)."""

    def __init__(self, info: ServiceInfo, address: str, *, timeout: float = 10.0,
                 patience: float | None = None, packed: bool = True, by_reference: bool = True,
                 keep: int = KEEP, message_events: int = MESSAGE_EVENTS) -> None:
        self.info = info
        self.address = address
        self.timeout = timeout
        self.patience = patience
        self.packed = packed  # the options of docs/backends.md ("Remote links"); off: the old way
        self.by_reference = packed and by_reference
        self.keep = max(1, keep)
        self.message_events = max(1, message_events)
        self._lock = threading.RLock()  # one call at a time: the pipeline's and the API's threads
        self._inbox: queue.Queue[tuple[int, Handle | None, Any]] = queue.Queue()
        self._queries: dict[Handle, str] = {}
        self.on_refused: Callable[[Handle, str], None] = raise_ended
        """Told of each handle whose subscription the service ended at its work or store
        limit (``RESOURCE_EXHAUSTED: …``): it answers nothing from then on and is not
        subscribed again; the others go on (the pipeline suspends its holders)."""
        self._conn: _Connection | None = None
        self._generation = 0
        self._broken = False  # the connection is known to be lost
        self._closing = threading.Event()
        self._language = info.group
        self._limit = 0  # the service's max_advance_us
        self._clock: int | None = None  # what the service's clock has reached (our messages)
        self._tag = secrets.token_hex(3)  # handle names unique among the service's clients
        self._publisher = ""  # the publisher's name at the service (a fresh one per connection)
        self._sent: dict[int, list[Event]] = {}  # batch → its events, for references (by age)
        self._held = 0  # events in _sent
        self._ids = itertools.count(1)
        # Batch numbers unique among the service's publishers: a subscription sees the markers
        # of every publisher's messages, so a number another publisher may use is useless.
        self._batches = itertools.count(random.randrange(1, 2**62))
        self._reviver: threading.Thread | None = None
        # What close() cuts short without the lock (a call waiting on the service holds it):
        # the Subscribe call waiting for its first answer, and the connection being opened.
        self._attaching: Any = None
        self._opening: _Connection | None = None
        self._revive()

    # ---------------------------------------------------------------- the Link protocol

    def status(self) -> str:
        return "SERVING" if self._conn is not None and not self._broken else "CONNECTING"

    def subscribe(self, text: str, name: str = "") -> Handle:
        with self._lock:
            handle = f"{self.info.name}-{self._tag}-{next(self._ids)}"
            while True:
                conn = self._ensure()
                try:
                    self._attach(conn, handle, text)
                    break
                except _Lost as exc:
                    self._reconnect(str(exc))
            self._queries[handle] = text
            return handle

    def unsubscribe(self, handle: Handle) -> None:
        with self._lock:
            if self._queries.pop(handle, None) is None or self._conn is None or self._broken:
                return  # unknown, or its subscription went with the service
            call = self._conn.calls.pop(handle)
            try:
                self._conn.stub.Unsubscribe(base_pb2.UnsubscribeRequest(subscription_id=handle),
                                            timeout=self.timeout)
            except grpc.RpcError:  # gone or going: its stream ends with it, a reconnection
                call.cancel()  # will not bring it back

    def publish(self, events: Sequence[Event], until: int | None = None
                ) -> dict[Handle, list[Detection]]:
        with self._lock:
            conn = self._ensure()
            newest = max((e.time for e in events), default=None)
            if until is not None:
                newest = until if newest is None else max(newest, until)
            while self._queries:
                messages = publish_messages(events, until, self._limit,
                                            batch=self.message_events, clock=self._clock)
                try:
                    out = self._exchange(conn, messages)
                except _Lost as exc:
                    conn = self._reconnect(str(exc))  # fresh subscriptions: the batch again
                    continue
                if newest is not None:
                    self._clock = newest if self._clock is None else max(self._clock, newest)
                return out
            return {h: [] for h in self._queries}  # nobody there: nothing to evaluate

    def close(self) -> None:
        """Unsubscribe every handle and end the Publish stream, within ``CLOSE_SECONDS`` (or
        ``timeout``) whatever the service does: a call waiting on a service that accepted it
        but never answers is cut short, and what the service has not answered by then is left
        to it (it drops a closed connection's subscriptions)."""
        deadline = time.monotonic() + min(self.timeout, CLOSE_SECONDS)
        self._closing.set()
        self._inbox.put((-1, None, None))  # wakes a publish waiting for its answer
        attaching = self._attaching
        if attaching is not None:
            attaching.cancel()  # its subscribe() raises "was closed" and lets go of the lock
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            # A unary call stuck at the service (Capabilities, Unsubscribe) holds the lock:
            # closing its channel ends it (CANCELLED), and its caller raises "was closed".
            log.warning("%s: closing without waiting for the service", self._where())
            for conn in (self._opening, self._conn):
                if conn is not None:
                    conn.close()
            return
        try:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            if not self._broken:
                self._finish(conn, deadline)
            conn.close()
            self._queries.clear()
        finally:
            self._lock.release()

    # ---------------------------------------------------------------- publishing

    def _exchange(self, conn: _Connection, messages: Iterator[tuple[list[Event], Any]]
                  ) -> dict[Handle, list[Detection]]:
        """Send the messages, numbered, as they are encoded; read every handle's stream up to
        the marker of the last. _Lost if the connection fails on the way."""
        while self._sent:  # as the service counts (PublishRequest.keep), from the oldest
            oldest = next(iter(self._sent))  # (dicts keep insertion order)
            if self._held - len(self._sent[oldest]) < self.keep:
                break
            self._held -= len(self._sent.pop(oldest))
        last = 0
        for events, request in messages:
            request.batch = last = next(self._batches)
            if self.by_reference:
                request.publisher, request.keep = self._publisher, self.keep
                self._sent[last] = events
                self._held += len(events)
            conn.requests.put(request)
        out: dict[Handle, list[Detection]] = {h: [] for h in self._queries}
        waiting = set(out) if last else set()
        while waiting:
            generation, handle, item = self._inbox.get()
            if self._closing.is_set():
                raise ConnectionError(f"the link to {self._where()} was closed")
            if generation != conn.generation or (handle is not None and handle not in out):
                continue  # a connection given up, or a handle unsubscribed
            if handle is None:
                raise self._failure("its Publish stream", item.exception())
            if isinstance(item, grpc.RpcError) and limit_end(item):
                self._queries.pop(handle, None)
                waiting.discard(handle)
                self.on_refused(handle, f"RESOURCE_EXHAUSTED: {item.details()}")
                continue
            if item is _END or isinstance(item, grpc.RpcError):
                raise self._failure(f"subscription {handle}", None if item is _END else item)
            try:
                if item.detections:  # packed
                    out[handle] += [self._detection(handle, d) for d in item.detections]
                elif not item.progress_batch:  # one detection per message
                    out[handle].append(detection(item))
            except EventError as exc:
                raise self._broken_word(handle, f"a constituent that is not a CloudEvent: {exc}"
                                        ) from None
            if item.progress_batch == last:
                waiting.discard(handle)
        return out

    def _detection(self, handle: Handle, message: Any) -> Detection:
        """A packed detection, its constituents named by reference found among the events the
        link sent (ConnectionError for a place it does not hold: the service broke its word)."""
        refs = message.refs
        if not refs:
            return detection(message)
        inline = list(message.constituents)
        if len(refs) % 2 or refs[::2].count(0) != len(inline):
            raise self._broken_word(handle, f"{len(refs)} reference numbers (two per "
                                    f"constituent) for {len(inline)} constituents in JSON")
        found: list[Event] = []
        given = iter(inline)
        for batch, index in zip(refs[::2], refs[1::2], strict=True):
            if batch == 0:
                found.append(from_json_line(next(given)))
                continue
            sent = self._sent.get(batch)
            if sent is None or not 0 <= index < len(sent):
                raise self._broken_word(handle, f"constituent {index} of message {batch}, which "
                                        f"this link did not send or no longer keeps (it keeps the "
                                        f"messages of its latest {self.keep} events)")
            found.append(sent[index])
        return detection(message, found)

    def _broken_word(self, handle: Handle, what: str) -> ConnectionError:
        self._broken = True  # the next call starts a fresh connection
        return ConnectionError(f"{self._where()}: subscription {handle} sent a detection that "
                               f"names {what}")

    def _failure(self, what: str, error: Any) -> Exception:
        """_Lost for a stream that ended or failed transiently; ConnectionError otherwise (the
        next call starts a fresh connection)."""
        if error is None:
            return _Lost(f"{what} ended")
        if error.code() in TRANSIENT:
            return _Lost(f"{what}: {error.code().name}: {error.details()}")
        self._broken = True
        return ConnectionError(f"{self._where()}: {what} failed: {error.code().name}: "
                               f"{error.details()}")

    def _finish(self, conn: _Connection, deadline: float) -> None:
        """Unsubscribe every handle, end the Publish stream and log what it rejected — all by
        ``deadline`` (time.monotonic())."""
        try:
            for handle in self._queries:
                conn.stub.Unsubscribe(base_pb2.UnsubscribeRequest(subscription_id=handle),
                                      timeout=max(0.0, deadline - time.monotonic()))
            conn.requests.put(None)
            reply = conn.publishing.result(timeout=max(0.0, deadline - time.monotonic()))
        except grpc.RpcError as exc:
            log.warning("%s: closing: %s: %s", self._where(), exc.code().name, exc.details())
            return
        except grpc.FutureTimeoutError:
            log.warning("%s: closing: no answer to the end of its Publish stream",
                        self._where())
            return
        if reply.rejected:
            log.warning("%s rejected %d events and advances: %s", self._where(), reply.rejected,
                        "; ".join(reply.errors[:5]))

    # ---------------------------------------------------------------- connecting

    def _where(self) -> str:
        return f"base service {self.info.name!r} ({self.info.group}) at {self.address}"

    def _ensure(self) -> _Connection:
        if self._closing.is_set():
            raise ConnectionError(f"the link to {self._where()} was closed")
        if self._conn is None or self._broken:
            return self._reconnect("not connected")
        return self._conn

    def _reconnect(self, why: str) -> _Connection:
        """A fresh connection with every handle re-subscribed: attempts with back-off until one
        succeeds, the patience runs out or the link is closed (ConnectionError)."""
        if self._closing.is_set():  # close() takes the connection down once it has the lock
            raise ConnectionError(f"the link to {self._where()} was closed")
        if self._conn is not None:
            self._conn.close()
            log.warning("%s: connection lost (%s); reconnecting", self._where(), why)
        self._conn = None
        self._broken = False
        self._clock = None  # fresh subscriptions: their clocks start again
        retrying = Retrying(retry=retry_if_exception_type(_Lost), reraise=True,
                            wait=wait_random_exponential(multiplier=0.05, max=BACKOFF_MAX),
                            stop=self._stop, sleep=self._pause, before_sleep=self._retrying)
        try:
            self._conn = retrying(self._open)
        except _Lost as exc:
            if self._closing.is_set():
                raise ConnectionError(f"the link to {self._where()} was closed") from None
            raise ConnectionError(f"{self._where()} unreachable for {self.patience:g} s: "
                                  f"{exc}") from None
        return self._conn

    def _stop(self, state: RetryCallState) -> bool:
        waited = state.seconds_since_start or 0.0
        return self._closing.is_set() or (self.patience is not None and waited >= self.patience)

    def _pause(self, seconds: float) -> None:
        self._closing.wait(seconds)  # close() cuts the back-off short

    def _retrying(self, state: RetryCallState) -> None:
        if state.attempt_number == 1 or state.attempt_number % 20 == 0:  # not every second
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning("%s: attempt %d to connect failed (%s); trying again", self._where(),
                        state.attempt_number, error)

    def _open(self) -> _Connection:
        """One attempt: a channel, the service's group checked, every handle re-subscribed,
        the Publish stream opened. _Lost if the service cannot be reached."""
        self._generation += 1
        # A new name: the service refers only to what this connection sends (what it saw of the
        # last one may be more or less than what the link sent, and is gone with its stream).
        self._publisher = f"evamed-{secrets.token_hex(8)}"
        self._sent.clear()
        self._held = 0
        channel = grpc.insecure_channel(self.address, options=_OPTIONS)
        conn = self._opening = _Connection(self._generation, channel,
                                           base_pb2_grpc.BaseServiceStub(channel))
        try:
            self._wait_ready(channel)
            reply = conn.stub.Capabilities(base_pb2.CapabilitiesRequest(), timeout=self.timeout)
            _check_group(self.address, reply.group, self.info.group)
            self._language, self._limit = reply.language, reply.max_advance_us
            for handle, text in self._queries.items():
                self._attach(conn, handle, text)
            conn.publishing = conn.stub.Publish.future(conn.messages())
            generation = conn.generation
            conn.publishing.add_done_callback(lambda f: self._inbox.put((generation, None, f)))
        except grpc.RpcError as exc:
            conn.close()
            raise self._failure("connecting", exc) from None
        except BaseException:
            conn.close()
            raise
        finally:
            self._opening = None
        return conn

    def _wait_ready(self, channel: grpc.Channel) -> None:
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + self.timeout
        while not self._closing.is_set() and time.monotonic() < deadline:
            try:
                ready.result(timeout=0.1)
                return
            except grpc.FutureTimeoutError:
                continue
        ready.cancel()
        raise _Lost(f"no answer within {self.timeout:g} s")

    def _attach(self, conn: _Connection, handle: Handle, text: str) -> None:
        """Subscribe ``text`` as ``handle`` on ``conn`` and read its stream in a thread once the
        service says it is registered (NativeQueryError if refused, _Lost if gone)."""
        call = conn.stub.Subscribe(base_pb2.SubscribeRequest(
            query=text, subscription_id=handle, progress=True, packed=self.packed,
            publisher=self._publisher if self.by_reference else ""))
        self._attaching = call  # a service may accept it and never answer: close() cancels it
        if self._closing.is_set():
            call.cancel()
        try:
            first = next(call)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise query_error(exc, self._language, text) from None
            raise self._failure(f"subscribing {handle}", exc) from None
        except StopIteration:
            raise _Lost(f"subscribing {handle}: the stream ended at once") from None
        finally:
            self._attaching = None
        assert first.ready
        conn.calls[handle] = call
        threading.Thread(target=self._read, args=(conn.generation, handle, call), daemon=True,
                         name=f"evamed-link-{handle}").start()

    def _read(self, generation: int, handle: Handle, call: Any) -> None:
        end: Any = _END
        try:
            for message in call:
                self._inbox.put((generation, handle, message))
        except grpc.RpcError as exc:
            end = exc
        self._inbox.put((generation, handle, end))
        if isinstance(end, grpc.RpcError) and limit_end(end):
            return  # that query ended, not the service: the next publish reads why
        if (generation == self._generation and handle in self._queries and not self._broken
                and not self._closing.is_set()):
            self._broken = True  # unexpected: the service went away (or ended it)
            self._revive()

    def _revive(self) -> None:
        """(Re)connect in the background, so that the link is back (and says so) before the
        next call needs it."""
        if self._reviver is None or not self._reviver.is_alive():
            self._reviver = threading.Thread(target=self._revival, daemon=True,
                                             name=f"evamed-link-{self.info.name}")
            self._reviver.start()

    def _revival(self) -> None:
        try:
            with self._lock:
                if not self._closing.is_set() and (self._conn is None or self._broken):
                    self._reconnect("its streams ended")
        except Exception as exc:  # the next call tries again and raises it to its caller
            if not self._closing.is_set():
                log.error("%s: %s", self._where(), exc)


def connect(info: ServiceInfo, address: str, *, tick: int = 1_000_000, timeout: float = 10.0,
            patience: float | None = None) -> Link:
    """The link to a configured service: ``"embedded"`` evaluates the group's language in this
    process (no process or port to manage, nothing to reconnect, the same answers); any other
    address is a running base service (:class:`RemoteLink`; its group is checked at every
    connection)."""
    if address == EMBEDDED:
        return InProcessLink(info, shared_language(info.group, tick))
    return RemoteLink(info, address, timeout=timeout, patience=patience)


__all__ = ["EMBEDDED", "RemoteLink", "connect"]
